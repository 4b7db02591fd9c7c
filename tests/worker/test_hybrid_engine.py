"""Hybrid models (recurrent-state layers beside attention) served by the real Engine: a tiny
random-weight LFM2 and Granite 4.0-H (tests/worker/model/test_hybrid_families.py's configs),
with prefix reuse off (the chunk cache, asked for) and a state slot per running request; the
state cache (mamba_radix, the default for these models) is tested in test_hybrid_cache.py.

- greedy tokens equal transformers' ``generate`` for several concurrent prompts of different
  lengths, with prefill split into chunks by a small step budget, with preemption forced by a
  tiny KV pool, with the overlapped loop, with ``n=2`` forks (each its own copy of the leader's
  state) and with fewer state slots than requests (a request waits for a slot, then runs);
- after every run every page and every slot is free, and ``check_integrity`` holds after every
  step (``debug_checks``);
- the runner refuses a sequence that would resume from KV without the matching state; the host
  tier and CUDA graphs are off for these models, each with its reason.
"""

from __future__ import annotations

import pytest
import torch

from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker.batch import Batch, ScheduledItem
from radixray.worker.cuda_graph import graph_unsupported
from radixray.worker.model import load_model
from radixray.worker.request import CompletionBuilder, Request

from .model.test_hybrid_families import hf_model

FAMILIES = ("lfm2", "granite_h")
PAGE = 4
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
_g = torch.Generator().manual_seed(5)
# four prompts of different lengths (a page edge, a short one, a long one, an odd one)
PROMPTS = [torch.randint(0, 300, (n,), generator=_g).tolist() for n in (13, 5, 21, 8)]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """family -> (loaded (model, config, tokenizer), transformers' greedy tokens per prompt)."""
    made: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in made:
            path = tmp_path_factory.mktemp(family)
            hf = hf_model(family, path)
            want = []
            for p in PROMPTS:
                with torch.inference_mode():
                    out = hf.generate(
                        torch.tensor([p]),
                        attention_mask=torch.ones(1, len(p), dtype=torch.long),  # 0 is pad
                        max_new_tokens=MAX_TOKENS,
                        do_sample=False,
                        eos_token_id=None,
                    )
                want.append(out[0, len(p) :].tolist())
            loaded = load_model(str(path))
            made[family] = ((loaded.model, loaded.config, loaded.tokenizer), want, path)
        return made[family]

    return get


def engine(loaded, **kw) -> Engine:
    cfg = {
        "model": "hybrid",
        "page_size": PAGE,
        "num_pages": 256,
        "device": "cpu",
        "seed": 0,
        "debug_checks": True,
        "cache": "chunk",
    }
    return Engine(EngineConfig(**(cfg | kw)), loaded=loaded)


def add(e: Engine, prompt: list[int]) -> CompletionBuilder:
    """Queue a greedy request, to be driven by ``e.step()``; its completion gathers there."""
    req = e.requests.build(prompt, GREEDY, None, None)
    sink = CompletionBuilder(req.request_id)
    e.add(req, sink)
    return sink


def assert_all_free(e: Engine) -> None:
    """Every page and every state slot back: nothing held, nothing cached (reuse is off)."""
    e.check_integrity()
    alloc, slots = e.pool.allocator, e.state_pool
    assert alloc.num_free == alloc.num_pages
    assert slots.num_free == slots.num_slots
    assert e.stats()["state_free_slots"] == e.stats()["state_total_slots"] == slots.num_slots


CONFIGS = {
    "chunked": {"max_batch_tokens": 8},  # every prompt but the shortest split across steps
    "preempted": {"max_batch_tokens": 8, "num_pages": 10},  # 40 tokens for ~90 needed
    "overlapped": {"max_batch_tokens": 8, "overlap": "on"},
    "overlapped_preempted": {"max_batch_tokens": 8, "num_pages": 10, "overlap": "on"},
    "few_slots": {"max_batch_tokens": 16, "state_slots": 2},
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_tokens_equal_transformers(hybrid, family, config):
    loaded, want, _ = hybrid(family)
    e = engine(loaded, **CONFIGS[config])
    assert e.cache_kind == "chunk"
    got = [c.token_ids for c in e.generate_batch(PROMPTS, GREEDY)]
    assert got == want
    assert_all_free(e)
    if "preempted" in config:
        assert e.stats()["preemptions"] > 0
    if "overlapped" in config:
        assert e.overlap.overlapped_steps > 0
    e.shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_n_forks_each_get_their_own_copy_of_the_leaders_state(hybrid, family):
    loaded, want, _ = hybrid(family)
    e = engine(loaded, max_batch_tokens=8)
    greedy = e.generate_batch(PROMPTS[:3], GREEDY.replace(n=2))
    assert [c.token_ids for c in greedy] == [w for w in want[:3] for _ in range(2)]
    assert_all_free(e)
    # sampled: the forks diverge from their first token, each as its own seeded request would
    sampled = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=7, ignore_eos=True)
    forked = e.generate_batch([PROMPTS[2]], sampled.replace(n=3))
    alone = [e.generate_batch([PROMPTS[2]], sampled.replace(seed=7 + i))[0] for i in range(3)]
    assert [c.token_ids for c in forked] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in forked}) > 1
    assert_all_free(e)


def test_a_fork_without_a_free_slot_waits_and_recomputes(hybrid):
    loaded, want, _ = hybrid("granite_h")
    e = engine(loaded, state_slots=1)  # the leader's slot is the only one
    out = e.generate_batch([PROMPTS[0]], GREEDY.replace(n=2))
    assert [c.token_ids for c in out] == [want[0], want[0]]
    assert e.stats()["prefill_tokens"] == 2 * len(PROMPTS[0])  # the sample's prompt again
    assert_all_free(e)


def test_a_request_waits_for_a_state_slot_then_completes(hybrid):
    loaded, want, _ = hybrid("lfm2")
    e = engine(loaded, state_slots=2)
    done = [add(e, p) for p in PROMPTS]
    waited = False
    while e.has_work():
        e.step()
        running = e.scheduler.running
        assert len(running) <= 2 and len({r.state_slot for r in running}) == len(running)
        # pages for everyone, yet requests wait: for a slot
        waited |= bool(e.scheduler.waiting) and e.pool.allocator.num_free > 16
        if running:
            load, _ = e.report()
            assert (load.state_total_slots, load.state_free_slots) == (2, 2 - len(running))
    assert waited
    assert [b.result().token_ids for b in done] == want
    assert_all_free(e)


def test_an_abort_and_a_finish_give_the_slot_back(hybrid):
    loaded, want, _ = hybrid("granite_h")
    e = engine(loaded, state_slots=2, max_batch_tokens=8)
    a = add(e, PROMPTS[2])
    b = add(e, PROMPTS[0])
    e.step()
    e.step()
    assert e.state_pool.num_free == 0
    e.abort(a.request_id)
    assert e.state_pool.num_free == 1
    e.check_integrity()
    while e.has_work():
        e.step()
    assert b.result().token_ids == want[0]
    assert_all_free(e)


def test_the_runner_refuses_kv_without_its_state(hybrid):
    """A sequence resuming at token k must find the state after its k tokens in its slot, run
    there by its own steps: KV alone (a prefix cache's hit, a fork whose state was not copied)
    is refused before the forward."""
    loaded, _, _ = hybrid("lfm2")
    e = engine(loaded)
    e.add_request(PROMPTS[2], GREEDY.replace(max_tokens=2))
    e.step()  # its prompt, in one step
    req = e.scheduler.running[0]
    with pytest.raises(AssertionError, match="resumes at token 3 .* no matching state"):
        e.runner.prepare(Batch([ScheduledItem(req, 3, 1, True)]))
    forked = Request(
        "fork", req.prompt_ids, req.params, req.block_hashes, state_slot=req.state_slot + 1
    )
    with pytest.raises(AssertionError, match="fork resumes at token 21"):
        e.runner.prepare(Batch([ScheduledItem(forked, 21, 1, True)]))
    e.runner.prepare(Batch([ScheduledItem(req, req.num_computed, 1, True)]))  # its own: fine


def test_graphs_are_off_with_their_reason_and_the_host_tier_is_opt_in(hybrid):
    loaded, _, _ = hybrid("granite_h")
    model, mcfg, _ = loaded
    e = engine(loaded, cache="radix")
    assert e.cache_kind == "mamba_radix" and e.pool.host is None
    assert e.pool.k_cache.shape[0] == len(mcfg.attention_layers) == 1  # KV for attention only
    assert "state layers" in graph_unsupported(model, e.pool)
    assert e.state_pool.num_slots == 2 * e.config.max_running  # the documented defaults
    assert engine(loaded).state_pool.num_slots == e.config.max_running  # reuse off
    tiered = engine(loaded, host_pages=8, cache="radix")  # the state cache has a host tier
    # host state slots at the device's ratio: 8 host pages x 128 slots / 256 pages
    assert tiered.pool.host is not None and tiered.cache.host.slots.num_pages == 4
    with pytest.raises(ValueError, match="cache='swa_radix'"):
        engine(loaded, cache="swa_radix")
