"""The overlapped step: the host works on one step while the device runs the next.

A serial step is schedule -> forward -> sample -> read the ids -> emit, and the device waits
through the host's parts (on the first GPU run, most of a step). Overlapped (SGLang's overlap
scheduler, vLLM's async scheduling), a turn launches step N and only then reads step N-1::

    host:    schedule N | launch N | read N-1, emit | schedule N+1 | launch N+1 | read N ...
    device:                        [ forward + sample N          ] [ forward + sample N+1 ]

Step N is scheduled before step N-1's ids are read. Each request sampled in N-1 counts its
token as ``Request.pending`` (positions and pages are planned as if it were read); the inputs
leave its id to the device, which copies it from N-1's sampled ids (``ModelRunner.prepare``), so
no id crosses to the host and back before the next forward. The host reads N-1's ids one step
later, when N is already queued.

What that costs, and how each case keeps the serial loop's output:

- A request that ends on N-1's token (EOS, a stop token or string) is in step N too: N computes
  one token for it that is dropped when N is read; never emitted, never cached, never in a KV
  event. Its finish sets ``num_computed`` back to where N started it, so the pages freed are
  the serial loop's (the extra token's page included) and the cache gets no page it would not.
- A request whose token is its last by length (``max_tokens``, the model's length) is known to
  end at launch: it is not scheduled again (``Request.last_pending``).
- A request preempted while its token is pending is read into the waiting queue (and can end
  there: ``Scheduler.finish``).
- Penalties need no host tokens: their counts stay on the device, updated from the sampled
  ids (``Sampler``); ``min_tokens`` counts the pending tokens.
- Steps whose host work needs the last token, or that must not run beside another step, run
  serially (the step in flight is read first, then the serial path runs): a grammar (its mask
  follows the last token), prompt logprobs, a request forking its samples (its pages are
  copied), host-tier copies (they move pages the step in flight may use), and models with a
  sliding-window pool (pages leave the window as a step's tokens are computed).
  ``serial_reason`` names which.

Greedy and seeded outputs are the serial loop's (tests/worker/test_overlap.py); unseeded
sampling draws from the engine's generator in another order.

Where the device work runs: on CUDA on the calling thread (launches return at once; the ids
come back by a non-blocking copy to pinned memory and an event); on a CPU, on a thread of its
own (``ThreadQueue``: the forward's operators release the GIL, so the host's Python runs
beside them).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixray.protocol import StreamChunk

from .batch import Batch, ScheduledItem, StepShape
from .emit import take_all
from .logprobs import token_logprobs
from .request import RequestStatus

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["InlineQueue", "Launched", "OverlapStepper", "ThreadQueue"]


class InlineQueue:
    """Runs each job at once on the caller's thread (CUDA: its kernels are queued, the call
    returns before they run)."""

    def submit(self, job: Callable) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(job())
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        pass


class ThreadQueue:
    """Runs jobs in order on a thread of its own: the CPU's stand-in for a device stream. The
    thread starts with the first job after a ``close`` (an engine driven on after its loop
    stopped)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable) -> Future:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="radixray-device", daemon=True)
            self._thread.start()
        fut: Future = Future()
        self._jobs.put((job, fut))
        return fut

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(job())
                except BaseException as e:
                    fut.set_exception(e)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None


@dataclass(eq=False)
class Launched:
    """A step on the device whose ids the host has not read."""

    batch: Batch
    rows: list[ScheduledItem]  # the sampled items, in the order of the ids
    shape: StepShape
    start: float  # when its turn began (perf_counter)
    reqs: list = field(default_factory=list)  # the rows' requests
    rows_of: dict[int, int] = field(default_factory=dict)  # id(request) -> its row
    ids: torch.Tensor | None = None  # the sampled ids, on the device (set by its job)
    future: Future | None = None  # (host ids, event or None, logprobs, forward seconds)


class OverlapStepper:
    """``Engine.step`` when ``EngineConfig.overlap`` is on: one step launched, the one before
    it read, per call (see the module docstring)."""

    def __init__(self, engine: Engine, device: torch.device):
        self.engine = engine
        self.queue = ThreadQueue() if device.type == "cpu" else InlineQueue()
        self.inflight: Launched | None = None
        self.serial_steps = 0  # steps that ran serially (``serial_reason``)
        self.overlapped_steps = 0
        self.discarded = 0  # tokens computed past their request's end, dropped

    def close(self) -> None:
        self.inflight = None
        self.queue.close()

    def step(self, start: float) -> list[StreamChunk]:
        e = self.engine
        batch = e.scheduler.schedule()
        if not batch.items:  # (copies the cache recorded wait for the next step, as serially)
            return self.drain()
        copies = e.cache.take_copies()
        if copies or self.serial_reason(batch):
            out = self.drain()
            self.serial_steps += 1
            running = [it for it in batch.items if it.req.status is RequestStatus.RUNNING]
            batch = batch._replace(items=running)  # its state copies stay: a save was cached
            if batch.items:
                out += e._run(batch, start, copies)
            elif copies or batch.state_copies:  # every request ended: its copies still run
                e._run_copies(copies=copies)
                e.runner.run_state_copies(batch.state_copies)
            return out
        prev, self.inflight = self.inflight, None
        self.inflight = self._launch(batch, prev, start)
        self.overlapped_steps += 1
        out = self._read(prev, self.inflight) if prev is not None else []
        if not e.scheduler.has_work():  # every request ended: the step in flight is theirs
            out += self.drain()
        return out

    def drain(self) -> list[StreamChunk]:
        """Read the step in flight, if any (nothing is launched after it)."""
        prev, self.inflight = self.inflight, None
        if prev is None:
            return []
        return self._read(prev, None)

    def serial_reason(self, batch: Batch) -> str | None:
        """Why ``batch`` must run serially (module docstring), or None."""
        e = self.engine
        if e.pool.window_k is not None:
            return "a sliding-window pool"
        live = e._live
        if not (live.ruled or live.prompt_lps or live.groups):
            return None  # no sample a reason below could apply to (the loop's answer, sooner)
        for it in batch.items:
            req = it.req
            p = req.params
            if p.prompt_logprobs is not None and it.start < req.num_prompt:
                return "prompt logprobs"
            if not it.sample:
                continue
            sample = live[req.request_id]
            if sample.matcher is not None:
                return "a grammar"
            if sample.group is not None and not sample.group.forked:
                return "a request forking its samples"
        return None

    def _launch(self, batch: Batch, prev: Launched | None, start: float) -> Launched:
        e = self.engine
        e._note_admitted(batch)
        rows = [it for it in batch.items if it.sample]
        launched = Launched(batch, rows, batch.shape(), start)
        launched.reqs = reqs = [it.req for it in rows]
        launched.rows_of = {id(r): i for i, r in enumerate(reqs)}
        prep = e.runner.prepare(batch, prev.rows_of if prev is not None else None)
        sample = self._sampling(reqs)
        counts = [r.params.logprobs for r in reqs]
        if counts.count(None) == len(counts):  # (no row asks for logprobs)
            counts = None

        def job():
            t0 = time.perf_counter()
            logits = e.runner.forward(prep, prev.ids if prev is not None else None)
            launched.ids = sampled = sample(logits)
            lps = None if counts is None else token_logprobs(logits, counts, sampled.tolist())
            event = None
            if sampled.device.type == "cuda":  # the ids come back without a wait here
                host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
                host.copy_(sampled, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                sampled = host
            return sampled, event, lps, time.perf_counter() - t0

        e.scheduler.postprocess(batch)
        max_len = e.max_model_len
        for r in reqs:
            r.pending += 1
            out = len(r.output_ids) + r.pending  # (num_output, num_tokens: inlined)
            if out >= r.params.max_tokens or len(r.prompt_ids) + out >= max_len:
                r.last_pending = True
        launched.future = self.queue.submit(job)
        return launched

    def _sampling(self, reqs: list) -> Callable[[torch.Tensor], torch.Tensor]:
        """The launched step's sampling (its job's), with what it reads of ``reqs`` taken now:
        for plain greedy rows (``Request.plain_greedy``) only the argmax, nothing per row."""
        sampler = self.engine.sampler
        if all(r.plain_greedy for r in reqs):
            return lambda logits: sampler.sample_ids(logits, (), (), plain=True)
        ids, params = [r.request_id for r in reqs], [r.params for r in reqs]
        prompts, outputs = [r.prompt_ids for r in reqs], [r.output_ids for r in reqs]
        num_output = [r.num_output for r in reqs]  # (before this step's token)
        return lambda logits: sampler.sample_ids(
            logits, ids, params, prompts, outputs, num_output=num_output
        )

    def _read(self, launched: Launched, nxt: Launched | None) -> list[StreamChunk]:
        """Take ``launched``'s ids (waiting for them) and emit them. A request that ends here
        and is in ``nxt`` gives back what ``nxt`` computes for it (module docstring)."""
        e = self.engine
        host, event, lps, forward_s = launched.future.result()
        if event is not None:
            event.synchronize()
        tokens = host.tolist()
        lps = lps or [None] * len(tokens)
        finished, reqs = RequestStatus.FINISHED, launched.reqs
        lives, dropped = e._live.find(reqs), []
        for i, (req, live) in enumerate(zip(reqs, lives, strict=True)):
            req.pending -= 1
            if req.status is finished or live is None or live.req is not req:
                if live is None:  # its job may have made it a generator after it ended
                    e.sampler.forget(req.request_id)
                dropped.append(i)  # computed past its end: dropped
        if dropped:
            self.discarded += len(dropped)
            keep = [i for i in range(len(reqs)) if i not in dropped]
            lives, tokens = [lives[i] for i in keep], [tokens[i] for i in keep]
            lps = [lps[i] for i in keep]
        starts = (nxt.rows_of, nxt.rows) if nxt is not None else None
        out = take_all(e, lives, tokens, lps, time.monotonic(), starts)
        e._record_step(launched.shape, forward_s, launched.start)
        return out
