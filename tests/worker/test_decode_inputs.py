"""A decode step's inputs in one tensor must equal those built row by row.

Whatever the page manager does to a request's pages between steps (a page appended, a new list
after a preemption or fork, its cached prefix swapped in place by ``commit``), each step's ids,
positions, slots, lengths and block table from ``DecodeInputs`` equal ``Batch.decode_rows`` of
the same items, and an engine's greedy tokens equal those of one with room for everything.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from radixray.worker import SamplingParams
from radixray.worker.batch import Batch, ScheduledItem
from radixray.worker.decode_inputs import DecodeInputs

from .test_engine import engine, shared_prefix_prompts

P = 4


def request(rid: int, prompt: int, out: int, pages: list[int]):
    return SimpleNamespace(
        request_id=f"r{rid}",
        prompt_ids=list(range(100, 100 + prompt)),
        output_ids=list(range(7, 7 + out)),
        pages=pages,
        num_tree_pages=0,
    )


def assert_same(inputs: DecodeInputs, items) -> None:
    step = inputs.build(items)
    want = Batch(items).decode_rows(P)
    assert step.ids.tolist() == want.ids and step.positions.tolist() == want.positions
    assert step.meta.slot_mapping.tolist() == want.slots
    assert step.meta.seq_lens.tolist() == [p + 1 for p in want.positions]
    assert step.meta.cu_seqlens_q.tolist() == list(range(len(items) + 1))
    assert step.every.tolist() == list(range(len(items)))
    table = step.meta.block_table.tolist()
    assert [row[: len(r)] for row, r in zip(table, want.pages, strict=True)] == want.pages
    assert step.meta.block_table.shape == (len(items), want.width)
    assert step.on_device == want.on_device
    assert step.ids.dtype == step.positions.dtype == step.meta.slot_mapping.dtype == torch.int64
    assert step.meta.block_table.dtype == step.meta.seq_lens.dtype == torch.int32


def test_inputs_follow_every_change_of_a_requests_pages():
    rng = random.Random(0)
    inputs = DecodeInputs(P, 1000, torch.device("cpu"))
    reqs = [request(i, rng.randint(1, 9), rng.randint(0, 3), []) for i in range(20)]
    for r in reqs:
        r.pages = rng.sample(range(1000), -(-(len(r.prompt_ids) + len(r.output_ids) + 1) // P))
    for step in range(60):
        live = [r for r in reqs if rng.random() < 0.8]  # others prefill, wait or ended
        items = []
        for r in live:
            n = len(r.prompt_ids) + len(r.output_ids)
            if rng.random() < 0.1:  # the token the last step sampled is still on the device
                items.append(ScheduledItem(r, n, 1, True))
            else:
                items.append(ScheduledItem(r, n - 1, 1, True))
        assert_same(inputs, items)
        for r in live:
            r.output_ids.append(step)
            n = len(r.prompt_ids) + len(r.output_ids) + 1
            if n > len(r.pages) * P:
                r.pages += [rng.randrange(1000)]  # grown in place, as PageManager.grow does
            what = rng.random()
            if what < 0.05:  # preempted and admitted again, or forked: a new list
                r.pages = [rng.randrange(1000) for _ in r.pages]
            elif what < 0.1 and r.num_tree_pages < len(r.pages):  # commit: a prefix swapped
                k = rng.randint(r.num_tree_pages + 1, len(r.pages))
                r.pages[:k] = [rng.randrange(1000) for _ in range(k)]
                r.num_tree_pages = k


def test_a_step_that_is_not_all_decodes_is_left_to_the_general_path():
    inputs = DecodeInputs(P, 1000, torch.device("cpu"))
    r = request(0, 5, 0, [1, 2])
    assert inputs.build([]) is None
    assert inputs.build([ScheduledItem(r, 0, 5, True)]) is None  # a prefill chunk
    assert inputs.build([ScheduledItem(r, 4, 1, False)]) is None  # no sample
    assert inputs.build([ScheduledItem(r, 4, 1, True)]).ids.tolist() == [104]


def test_a_pool_past_int32_slots_is_refused():
    with pytest.raises(ValueError, match="num_pages \\* page_size = 4294967296 KV slots"):
        DecodeInputs(16, 2**28, torch.device("cpu"))


def test_engine_inputs_stay_right_under_pressure_forks_and_shared_prefixes():
    e = engine(num_pages=40, max_running=6)  # small pool: preemptions and evictions
    built = []
    real = e.runner.decode_inputs.build

    def build(items):
        step = real(items)
        if step is None:  # not a decode step: the general path builds it
            assert not items or any(it.num_tokens != 1 or not it.sample for it in items)
            return None
        want = Batch(list(items)).decode_rows(e.page_size)
        table = step.meta.block_table.tolist()
        assert [row[: len(r)] for row, r in zip(table, want.pages, strict=True)] == want.pages
        built.append(len(items))
        return step

    e.runner.decode_inputs.build = build
    prompts = shared_prefix_prompts(seed=3, n=10)
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, n=1 + i % 2)
        for i in range(10)
    ]
    outs = e.generate_batch(prompts, params)
    ref = engine()
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref.generate_batch(prompts, params)]
    assert e.scheduler.num_preemptions > 0 and max(built) > 1


@pytest.mark.gpu
def test_on_cuda_the_step_is_one_copy_of_the_same_values():
    """On CUDA the inputs arrive as views of one device tensor, equal to the CPU's build."""
    rng = random.Random(1)
    reqs = [
        request(i, rng.randint(1, 9), rng.randint(1, 3), list(range(i, i + 5))) for i in range(6)
    ]
    items = [ScheduledItem(r, len(r.prompt_ids) + len(r.output_ids) - 1, 1, True) for r in reqs]
    cpu = DecodeInputs(P, 1000, torch.device("cpu")).build(items)
    dev = DecodeInputs(P, 1000, torch.device("cuda")).build(items)
    torch.cuda.synchronize()
    base = dev.meta.block_table.untyped_storage().data_ptr()
    for a, b in (
        (cpu.meta.block_table, dev.meta.block_table),
        (cpu.meta.seq_lens, dev.meta.seq_lens),
    ):
        assert b.is_cuda and b.untyped_storage().data_ptr() == base  # one copy, views of it
        assert torch.equal(a, b.cpu())
    for a, b in ((cpu.ids, dev.ids), (cpu.positions, dev.positions)):
        assert b.is_cuda and b.dtype == torch.int64 and torch.equal(a, b.cpu())
    assert torch.equal(cpu.meta.slot_mapping, dev.meta.slot_mapping.cpu())
