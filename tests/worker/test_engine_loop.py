"""The engine loop drives the core the same way on its own thread and on the caller's.

One driver, two places to run it: ``EngineLoop.turn`` on the loop's thread (a served worker) or
on the caller's (``generate_batch`` on a bare engine). The same requests must give the same
chunks, token for token, and an abort must end a request and free its pages either way.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from radixray.protocol import RequestError, SamplingParams, StreamChunk
from radixray.worker import Engine, EngineConfig

PROMPTS = [[3, 4, 5], list(range(10, 47)), [200, 201, 202, 203, 204, 205, 206], [77] * 13]
PARAMS = [
    SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=11, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
]
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


def engine() -> Engine:
    cfg = EngineConfig(
        model="tiny", page_size=4, device="cpu", seed=0, debug_checks=True, max_batch_tokens=16,
        num_pages=512,  # (unset: sized from free memory, and checked whole after every step)
    )  # fmt: skip
    return Engine(cfg)


def assert_no_leak(e: Engine) -> None:
    e.check_integrity()
    alloc = e.pool.allocator
    assert e.cache.protected_tokens == 0
    assert alloc.num_free + e.cache.total_tokens // e.page_size == alloc.num_pages


class Recorder:
    """A sink that keeps every chunk, and opens a gate after ``after`` chunks or at the end."""

    def __init__(self, after: int | None = None):
        self.chunks: list[StreamChunk] = []
        self.error: RequestError | None = None
        self.after = after
        self.reached = threading.Event()
        self.ended = threading.Event()

    def __call__(self, item: StreamChunk | RequestError) -> None:
        if isinstance(item, RequestError):
            self.error = item
        else:
            self.chunks.append(item)
        if self.after is not None and len(self.chunks) >= self.after:
            self.reached.set()
        if self.error is not None or item.final:
            self.ended.set()

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]


def run_all(e: Engine) -> list[list[StreamChunk]]:
    sinks = [Recorder() for _ in PROMPTS]
    reqs = [e.requests.build(p, sp) for p, sp in zip(PROMPTS, PARAMS, strict=True)]
    e.loop.run(zip(reqs, sinks, strict=True))
    assert all(s.error is None for s in sinks)
    return [s.chunks for s in sinks]


def test_inline_and_thread_give_the_same_chunks():
    inline, looped = engine(), engine()
    looped.start()
    try:
        want = run_all(inline)
        assert inline.loop.thread is None  # driven on this thread, never started one
        got = run_all(looped)
        assert got == want  # every chunk: tokens, text, counts and miss, exactly
        assert [len(c) for c in want] == [sp.max_tokens for sp in PARAMS]
        assert all(c[-1].finish_reason == "length" for c in want)
        # generate_batch takes either path too, and its completions are the chunks, joined
        for e in (inline, looped):
            outs = e.generate_batch(PROMPTS, PARAMS)
            assert [o.token_ids for o in outs] == [
                [t for c in cs for t in c.token_ids] for cs in want
            ]
            assert [o.text for o in outs] == ["".join(c.text for c in cs) for cs in want]
            assert [o.completion_tokens for o in outs] == [sp.max_tokens for sp in PARAMS]

        # the asyncio stream on the thread: the same tokens (chunks coalesce for slow readers)
        async def stream(i: int) -> list[int]:
            return [t async for c in looped.generate(PROMPTS[i], PARAMS[i]) for t in c.token_ids]

        async def all_streams():
            return await asyncio.gather(*(stream(i) for i in range(len(PROMPTS))))

        streamed = asyncio.run(all_streams())
        assert streamed == [[t for c in cs for t in c.token_ids] for cs in want]
    finally:
        looped.shutdown()
    assert_no_leak(inline)
    assert_no_leak(looped)


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "thread"])
def test_abort_ends_the_request_and_frees_its_pages(threaded: bool):
    e = engine()
    if threaded:
        e.start()
    try:
        sink = Recorder(after=3)
        req = e.requests.build([5, 6, 7, 8, 9], LONG, "victim")
        e.loop.submit(req, sink)
        if threaded:
            assert sink.reached.wait(30)  # gate: it has three tokens and is still running
        else:
            while not sink.reached.is_set():
                e.loop.turn()
        e.loop.abort("victim")  # from the caller's thread either way: through the inbox
        if threaded:
            assert sink.ended.wait(30)
        else:
            e.loop.turn()
        assert sink.ended.is_set() and sink.error is None
        last = sink.chunks[-1]
        assert last.finish_reason == "abort" and last.token_ids == []
        n = len(sink.tokens)
        assert 3 <= n < 200 and last.completion_tokens == n
        # the same greedy tokens up to the abort as a run of n tokens on an engine of its own
        cold, ref = engine(), Recorder()
        upto = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        cold.loop.run([(cold.requests.build([5, 6, 7, 8, 9], upto), ref)])
        assert sink.tokens == ref.tokens
        assert not e.has_work() and e.stats()["requests_aborted"] == 1
    finally:
        e.shutdown()
    assert_no_leak(e)
    # the core's own abort, on the driving thread: at once, its final chunk returned
    rid = e.add_request([5, 6, 7, 8, 9], LONG)
    e.step()
    final = e.abort(rid)
    assert final is not None and final.finish_reason == "abort" and final.completion_tokens == 1
    assert e.abort(rid) is None and not e.has_work()
    assert_no_leak(e)


def test_reads_from_another_thread_wait_for_a_step_boundary():
    # The core has no lock: another thread's read runs on the loop's thread between steps.
    e = engine()
    e.start()
    try:
        seen: list[str] = []
        e.loop.call(lambda: seen.append(threading.current_thread().name))
        assert seen == ["radixray-engine"]
        out = e.generate_batch([PROMPTS[1]], PARAMS[1])[0]
        stored = {h for ev in e.take_events() for h in getattr(ev, "block_hashes", [])}
        assert stored and stored == set(e.cache.all_block_hashes())
        assert out.cached_tokens == 0
        e.check_integrity()
    finally:
        e.shutdown()
    # no thread: the read runs here
    seen.clear()
    e.loop.call(lambda: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]


def test_streams_on_one_event_loop_get_one_hand_over_a_step():
    """Every chunk a step makes for the streams of one event loop crosses threads in one
    ``call_soon_threadsafe`` (``Outbox``), not one per chunk; every token still arrives."""
    e = engine()
    steps = [0]
    step = e.step

    def counted():
        steps[0] += 1
        return step()

    e.step = counted

    async def run():
        loop = asyncio.get_running_loop()
        handed = [0]
        real = loop.call_soon_threadsafe

        def spy(*a, **kw):
            handed[0] += 1
            return real(*a, **kw)

        loop.call_soon_threadsafe = spy

        async def one(p, sp):
            return [t async for c in e.generate(p, sp) for t in c.token_ids]

        got = await asyncio.gather(*(one(p, sp) for p, sp in zip(PROMPTS, PARAMS, strict=True)))
        return got, handed[0]

    try:
        got, handed = asyncio.run(run())
    finally:
        e.shutdown()
    want = [c.token_ids for c in engine().generate_batch(PROMPTS, PARAMS)]
    assert got == want
    chunks = sum(len(t) for t in want)
    assert handed <= steps[0] < chunks, (handed, steps[0], chunks)
    assert_no_leak(e)
