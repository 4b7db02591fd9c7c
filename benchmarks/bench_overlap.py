"""The overlapped step against the serial loop, with a synthetic device (issue 43's CPU side).

A GPU runs a step's kernels while the host goes on: launching returns at once, and the host
waits only when it reads the sampled ids. The synthetic device is that, with known times:

- serial: the model's forward sleeps ``device_ms`` (the host waits through the device's work,
  as the serial loop's read of the ids does on CUDA);
- overlapped: the forward returns at once and the step's ids are ready ``device_ms`` after the
  device is free (``SimulatedStream``: steps queue in order, as on a CUDA stream); reading them
  sleeps until then.

Both return logits whose greedy token is a fixed function of the row's input token and
position, so both loops must emit the same tokens. The host's own time per step is measured
first (serial, device 0 ms), and the overlapped loop's (``host overlapped``: its launch and its
read of the step before, device 0 ms). A serial step then takes host + device; the target is an
overlapped step <= 1.1x max(host, device) (``ratio``). An overlapped step stays at the device's
time while its own host work plus the wait's overshoot fits in it: ``time.sleep`` wakes
~0.05-0.1 ms late here (a GPU's event wait does not sleep). Medians of the decode-only steps of
``batch`` requests, in ms.

``--real`` then runs the tiny model's real forward on this CPU, serial and overlapped (the CPU's
overlap runs the forward on a thread of its own, ``overlap.ThreadQueue``; it shares the GIL and
the cores with the host): what the CPU default (``EngineConfig.overlap``, auto: off on a CPU)
rests on.

    .venv/bin/python benchmarks/bench_overlap.py            # batch 1, 8, 64; device 0.5/2/5 ms
    .venv/bin/python benchmarks/bench_overlap.py --quick    # batch 8; device 1 ms
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


class SimulatedStream:
    """The overlapped loop's device queue (``overlap.InlineQueue``'s place): a job's host part
    (the launch) runs now; its result is ready ``device_ms`` after the device is free."""

    def __init__(self, device_ms: float):
        self.seconds, self.free_at = device_ms / 1000, 0.0

    def submit(self, job):
        value = job()
        self.free_at = max(time.perf_counter(), self.free_at) + self.seconds
        return _Ready(value, self.free_at)

    def close(self) -> None:
        pass


class _Ready:
    def __init__(self, value, at: float):
        self.value, self.at = value, at

    def result(self):
        wait = self.at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return self.value


class SyntheticDevice:
    """Stands in for the model: sleeps, then returns one-hot logits of a token that depends
    only on each sampled row's input token and position."""

    def __init__(self, model, device_ms: float):
        self._model, self.seconds = model, device_ms / 1000
        self.vocab = model.config.vocab_size

    def __call__(self, input_ids, positions, meta, k, v, logits_indices=None, **kw):
        if self.seconds > 0:
            time.sleep(self.seconds)
        idx = logits_indices if logits_indices is not None else torch.arange(len(input_ids))
        tok = (input_ids[idx] * 31 + positions[idx] * 7 + 1) % (self.vocab - 3) + 3
        logits = torch.zeros(len(idx), self.vocab)
        logits[torch.arange(len(idx)), tok] = 1.0
        return logits

    def __getattr__(self, name):
        return getattr(self._model, name)


def synthetic(engine, device_ms: float | None) -> None:
    """Put the synthetic device under ``engine`` (None: leave its real forward)."""
    if device_ms is None:
        return
    if engine.overlap is None:
        engine.runner.model = SyntheticDevice(engine.runner.model, device_ms)
    else:
        engine.runner.model = SyntheticDevice(engine.runner.model, 0.0)
        engine.overlap.queue.close()
        engine.overlap.queue = SimulatedStream(device_ms)


def measure(batch: int, tokens: int, overlap: str, device_ms: float | None) -> dict:
    """Median ms per decode-only step of ``batch`` requests (``device_ms`` None: the real
    forward), the first two left out (the overlapped loop's first step reads nothing)."""
    from radixray.worker import Engine, EngineConfig, SamplingParams

    pages = batch * (-(-(32 + tokens) // 16) + 1) + 16
    engine = Engine(EngineConfig(model="tiny", num_pages=pages, max_running=batch, overlap=overlap))
    synthetic(engine, device_ms)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request([(7 * i + j) % 250 + 1 for j in range(32)], params)
    times = []
    try:
        while engine.has_work():
            decoding = all(r.num_output > 0 for r in engine.scheduler.running)
            full = len(engine.scheduler.running) == batch and not engine.scheduler.waiting
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if decoding and full:
                times.append(1000 * dt)
        return {"step": statistics.median(times[2:] or times), "steps": len(times)}
    finally:
        engine.shutdown()


def outputs(batch: int, tokens: int, overlap: str, device_ms: float | None) -> list[list[int]]:
    from radixray.worker import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(model="tiny", num_pages=4096, max_running=batch, overlap=overlap))
    synthetic(engine, device_ms)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [[(7 * i + j) % 250 + 1 for j in range(32)] for i in range(batch)]
    try:
        return [c.token_ids for c in engine.generate_batch(prompts, params)]
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--device-ms", type=float, nargs="+", default=[0.5, 2.0, 5.0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--real", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--quick", action="store_true", help="batch 8, device 1 ms, 12 tokens")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.device_ms, args.tokens, args.real = [8], [1.0], 12, False
    print(f"synthetic device; {args.tokens} tokens a request; median ms per decode step")
    print(
        "| batch | host | host overlapped | device | serial | overlapped | max(host, device) "
        "| ratio | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for b in args.batches:
        host = measure(b, args.tokens, "off", 0.0)["step"]
        # the overlapped loop's own host work (a 0 ms device): the launch and the read
        host_over = measure(b, args.tokens, "on", 0.0)["step"]
        for d in args.device_ms:
            serial = measure(b, args.tokens, "off", d)["step"]
            over = measure(b, args.tokens, "on", d)["step"]
            same = outputs(b, 8, "off", d) == outputs(b, 8, "on", d)
            bound = max(host, d)
            print(
                f"| {b} | {host:.3f} | {host_over:.3f} | {d:.2f} | {serial:.3f} | {over:.3f} | "
                f"{bound:.3f} | {over / bound:.2f}x | {same} |",
                flush=True,
            )
    if args.real:
        print(f"\ntiny model's forward on this CPU ({torch.get_num_threads()} threads)")
        print("| batch | serial | overlapped | overlapped / serial | same tokens |")
        print("|---|---|---|---|---|")
        for b in args.batches:
            serial = measure(b, args.tokens, "off", None)["step"]
            over = measure(b, args.tokens, "on", None)["step"]
            same = outputs(b, 8, "off", None) == outputs(b, 8, "on", None)
            print(
                f"| {b} | {serial:.3f} | {over:.3f} | {over / serial:.2f}x | {same} |", flush=True
            )


if __name__ == "__main__":
    main()
