"""The worker host's poll protocol against a real engine: a caller that has everything gets
nothing new; new batches come in order; a gap (the log overran) or a restart (another epoch)
gets a snapshot; the routers that poll are listed."""

from __future__ import annotations

import asyncio
from collections import deque

from radixray.cache_index.events import AllBlocksCleared, BlockStored, decode_events
from radixray.protocol import GenerateRequest, PollRequest, SamplingParams
from radixray.worker import WorkerHost

PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def stored(result) -> set[int]:
    return {
        h
        for e in decode_events(result.events).events
        if isinstance(e, BlockStored)
        for h in e.block_hashes
    }


async def serve(host: WorkerHost, rid: str, ids: list[int]) -> None:
    async for _ in host.generate(GenerateRequest(rid, ids, PARAMS)):
        pass


def test_seq_epoch_and_snapshots():
    host = WorkerHost({"model": "tiny", "page_size": 4, "num_pages": 64}, "h0")

    async def go():
        first = await host.poll(PollRequest(-1, None, "r0"))
        assert first.snapshot and first.epoch == host.epoch and first.seq == 0
        assert isinstance(decode_events(first.events).events[0], AllBlocksCleared)
        same = await host.poll(PollRequest(first.seq, first.epoch, "r0"))
        assert (same.seq, same.snapshot, decode_events(same.events).events) == (0, False, [])
        await serve(host, "a", list(range(3, 20)))
        one = await host.poll(PollRequest(same.seq, same.epoch, "r0"))
        assert one.seq == 1 and not one.snapshot and len(stored(one)) == 4
        await serve(host, "b", list(range(40, 60)))
        two = await host.poll(PollRequest(one.seq, one.epoch, "r1"))
        assert two.seq == 2 and not two.snapshot and stored(two).isdisjoint(stored(one))
        assert two.load.routers == ("r0", "r1")
        # A caller one batch behind gets exactly the batch it missed, not a snapshot.
        behind = await host.poll(PollRequest(1, one.epoch, "r1"))
        assert behind.seq == 2 and not behind.snapshot and stored(behind) == stored(two)
        # Another epoch (the caller knew an earlier incarnation): a snapshot of everything.
        restarted = await host.poll(PollRequest(2, "an-old-epoch", "r0"))
        assert restarted.snapshot and stored(restarted) == stored(one) | stored(two)
        # A gap: the log no longer holds the batches after the caller's seq.
        host._log = deque(list(host._log)[-1:], maxlen=1)
        await serve(host, "c", list(range(70, 90)))
        gap = await host.poll(PollRequest(1, one.epoch, "r0"))
        assert gap.snapshot and gap.seq == 3
        assert stored(gap) >= stored(one) | stored(two)
        # A caller from the future (seq beyond the worker's): a snapshot too.
        future = await host.poll(PollRequest(99, one.epoch, "r0"))
        assert future.snapshot

    try:
        asyncio.run(go())
    finally:
        host.shutdown()
