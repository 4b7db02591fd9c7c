"""The state cache (``mamba_radix``) through the real Engine, on the tiny random-weight LFM2 and
Granite 4.0-H of tests/worker/model/test_hybrid_families.py.

Chat-like traffic: two sessions share a system prompt, each takes three turns (a turn's prompt
is the last turn's prompt, its answer and a new message), so later requests resume from state
checkpoints. With ``state_interval`` 8 at page size 4, checkpoints are taken at every 8th token
and at each prompt's last full page, in prefill and in decode.

- greedy tokens equal the cache-off engine's and transformers' (its argmax after every prefix,
  from one forward without a cache over the engine's whole sequence);
- a second turn resumes at exactly the deepest checkpoint before its end: its cached tokens are
  that position, and the rest of its prompt is recomputed;
- the same with chunked prefill, preemption, the overlapped loop, a state pool so short that
  checkpoints are evicted (tombstones made and revived), all of those at once, and at page
  sizes 1 and 16: every free slot is poisoned with NaN after every step, so a state read from
  anything but a live slot or checkpoint would show; ``n=2`` forks; the ``state`` miss cause;
- ``check_integrity`` (both pools) after every step; every slot and page back after a reset;
- with a host tier (docs/state_cache.md, "Host tier"): a next turn resumes from a checkpoint
  demoted to the host, and chat turns with preemption or a short state pool stay exact.
"""

from __future__ import annotations

import pytest
import torch

from radixray.cache_index.mamba_radix_cache import MambaRadixCache
from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker.model import load_model
from radixray.worker.request import CompletionBuilder
from radixray.worker.state_pool import default_host_state_slots

from .model.test_hybrid_families import hf_model

FAMILIES = ("lfm2", "granite_h")
PAGE = 4
INTERVAL = 8
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
_g = torch.Generator().manual_seed(11)
SYSTEM = torch.randint(0, 300, (14,), generator=_g).tolist()
MESSAGES = [[torch.randint(0, 300, (n,), generator=_g).tolist() for n in (5, 3, 6)] for _ in "ab"]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """family -> (loaded (model, config, tokenizer), transformers' model)."""
    made: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in made:
            path = tmp_path_factory.mktemp(family)
            hf = hf_model(family, path)
            loaded = load_model(str(path))
            made[family] = ((loaded.model, loaded.config, loaded.tokenizer), hf)
        return made[family]

    return get


def engine(loaded, **kw) -> Engine:
    cfg = {
        "model": "hybrid",
        "page_size": PAGE,
        "num_pages": 256,
        "device": "cpu",
        "seed": 0,
        "debug_checks": True,  # check_integrity after every step
        "state_interval": INTERVAL,
    }
    return Engine(EngineConfig(**(cfg | kw)), loaded=loaded)


def poison_free_slots(e: Engine) -> None:
    """NaN in every free slot: what the cache evicted or a request gave back is never read."""
    free = [s for s in range(e.state_pool.num_slots) if e.state_pool.allocator.is_free(s)]
    for t in e.state_pool.tensors.values():
        t[:, free] = float("nan")


def chat(e: Engine) -> list[tuple[list[int], list[int], int]]:
    """Both sessions' turns, the sessions side by side, each turn after its last; every step
    poisons the free slots. Returns (prompt, output, cached tokens) per request, in order (and
    keeps each one's miss causes in ``e.misses``)."""
    done, misses = [], []
    history = [list(SYSTEM) for _ in MESSAGES]
    for turn in range(3):
        sinks = []
        for s, msgs in enumerate(MESSAGES):
            prompt = history[s] + msgs[turn]
            req = e.requests.build(prompt, GREEDY, None, None)
            sinks.append((prompt, CompletionBuilder(req.request_id)))
            e.add(req, sinks[-1][1])
        while e.has_work():
            e.step()
            poison_free_slots(e)
        for s, (prompt, sink) in enumerate(sinks):
            c = sink.result()
            done.append((prompt, c.token_ids, c.cached_tokens))
            misses.append(c.miss)
            history[s] = prompt + c.token_ids
    e.misses = misses
    return done


def transformers_greedy(hf, prompt: list[int], output: list[int]) -> list[int]:
    """transformers' greedy choice after each prefix of the engine's sequence (one forward,
    no cache: its cached path is not exact for multi-token steps on these models)."""
    seq = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = hf(seq, attention_mask=torch.ones_like(seq)).logits[0]
    return logits[len(prompt) - 1 : len(prompt) + len(output) - 1].argmax(-1).tolist()


def expected_cached(prompt: list[int], history: list[list[int]]) -> int:
    """Where a request resumes: the deepest checkpoint an earlier request took within the
    prompt's reusable prefix (all but its last token). An earlier request computed its prompt
    and all but its last output token, in steps that start at each checkpoint point it reached
    before its end: the multiples of INTERVAL and its prompt's last full page."""
    best = 0
    for earlier_prompt, earlier_out in history:
        seq = earlier_prompt + earlier_out[:-1]
        common = 0
        while common < min(len(seq), len(prompt) - 1) and seq[common] == prompt[common]:
            common += 1
        points = set(range(INTERVAL, len(seq), INTERVAL)) | {len(earlier_prompt) // PAGE * PAGE}
        best = max([best] + [p for p in points if p <= common and p < len(seq)])
    return best


CONFIGS = {
    "one_pass": {},
    "chunked": {"max_batch_tokens": 6},
    "preempted": {"max_batch_tokens": 8, "num_pages": 12},  # 48 tokens: turn 3 needs 46 + 18
    "overlapped": {"max_batch_tokens": 8, "overlap": "on"},
    "few_slots": {"max_batch_tokens": 8, "state_slots": 3},
    "all_at_once": {"max_batch_tokens": 8, "num_pages": 12, "overlap": "on", "state_slots": 3},
    "page_1": {"max_batch_tokens": 8, "page_size": 1},
    "page_16": {"max_batch_tokens": 8, "page_size": 16},  # points every 16 (lcm with 8)
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_chat_turns_resume_from_checkpoints_exactly(hybrid, family, config):
    loaded, hf = hybrid(family)
    e = engine(loaded, **CONFIGS[config])
    assert e.cache_kind == "mamba_radix"
    done = chat(e)
    off = engine(loaded, cache="chunk")
    ref = off.generate_batch([p for p, _, _ in done], GREEDY)
    assert [out for _, out, _ in done] == [c.token_ids for c in ref]
    for prompt, out, _ in done:
        assert out == transformers_greedy(hf, prompt, out)
    states = e.scheduler.pages.states
    assert states.num_restored > 0 and states.num_saved > 0
    assert sum(c for *_, c in done) > 0
    if config == "one_pass":  # nothing evicted: each request resumes at the deepest checkpoint
        for i, (prompt, _, cached) in enumerate(done):
            earlier = [(p, o) for p, o, _ in done[:i]]
            assert cached == expected_cached(prompt, earlier), i
        # turn 1 (19 tokens): b resumes at a's 8; turn 2 (28): at turn 1's 16 (its last full
        # page and a multiple of 8; 24 is where its last token would start); turn 3 at 32
        assert [c for *_, c in done] == [0, 8, 16, 16, 32, 32]
        # turn 2 of session a: turn 1 computed 24 tokens and kept KV to its checkpoint at 16;
        # the pages 16-24 it computed past that were not kept: the cause "state"
        nonzero = {k: v for k, v in e.misses[2].items() if v}
        assert nonzero == {"cached": 16, "state": 8, "page_tail": 4}
    if config == "preempted":
        assert e.stats()["preemptions"] > 0
    if config in ("few_slots", "all_at_once"):
        assert e.cache.num_states_evicted > 0
    if config == "overlapped":
        assert e.overlap.overlapped_steps > 0
    e.check_integrity()
    assert e.state_pool.num_free + e.cache.num_states == e.state_pool.num_slots
    e.cache.reset()
    assert e.state_pool.num_free == e.state_pool.num_slots
    assert e.pool.allocator.num_free == e.pool.allocator.num_pages
    e.shutdown()


def slot_state(e: Engine, slot: int) -> list[torch.Tensor]:
    """Every state layer's state in ``slot`` (copies)."""
    return [t[:, slot].clone() for t in e.state_pool.tensors.values()]


def test_checkpoints_inside_a_chunk_are_saved_by_its_forward(hybrid):
    """A 42-token prompt (5 intervals and a bit) on a budget of 32 runs in 2 steps (0-32,
    32-42), not one per checkpoint: the points 8, 16, 24 inside the first are saved by its
    forward, 32 (where the second starts) by a copy before it, 40 (an interval point and its
    last full page) by the second's forward. Each checkpoint holds the state a cold run cut
    there has after exactly that many tokens, to float rounding (~1e-6: the layers' matmuls ran
    32 rows at once; tests/worker/model/test_state_saves.py holds the state layers themselves
    to bitwise), and later requests resume where they did when chunks were cut."""
    loaded, _ = hybrid("granite_h")
    e = engine(loaded, max_batch_tokens=32)
    prompt = torch.randint(0, 300, (42,), generator=torch.Generator().manual_seed(5)).tolist()
    e.add_request(prompt, GREEDY.replace(max_tokens=1))
    spans, saves = [], {}
    while e.has_work():
        batch = e.scheduler.schedule()
        spans += [(it.start, it.start + it.num_tokens) for it in batch.items]
        saves |= {c.tokens: (c.dst, c.inside) for c in batch.state_copies if c.save}
        e._run(batch, 0.0)
        poison_free_slots(e)
    assert spans == [(0, 32), (32, 42)]
    assert {p: inside for p, (_, inside) in saves.items()} == {
        8: True, 16: True, 24: True, 32: False, 40: True
    }  # fmt: skip
    assert e.scheduler.pages.states.num_saved_inside == 4 and e.cache.num_states == 5
    assert sorted(e.cache.cached_slots()) == sorted(slot for slot, _ in saves.values())
    for p, (slot, _) in saves.items():
        assert e.runner._state_at[slot] == (None, p)  # the ledger: a checkpoint after p tokens
    cold = engine(loaded, cache="chunk", max_batch_tokens=INTERVAL)  # the old cut chunks
    req = cold.requests.build(prompt, GREEDY.replace(max_tokens=1), None, None)
    cold.add(req, CompletionBuilder(req.request_id))
    while req.num_computed < 40:
        cold.step()
        if req.num_computed in saves:
            got = slot_state(e, saves[req.num_computed][0])
            for have, want in zip(got, slot_state(cold, req.state_slot), strict=True):
                assert not have.isnan().any()
                torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
    for q in (13, 30, 41):  # a second request on the first q tokens
        (done,) = e.generate_batch([prompt[:q] + [7, 7, 7]], GREEDY.replace(max_tokens=1))
        assert done.cached_tokens == expected_cached(prompt[:q] + [7, 7, 7], [(prompt, [0])])
        assert done.cached_tokens == {13: 8, 30: 24, 41: 40}[q]
    e.check_integrity()


def test_short_of_slots_each_chunk_keeps_its_deepest_point(hybrid):
    """Two 22-token prompts in one step, with 2 slots to spare for checkpoints: the slots go
    round the items deepest first, so each keeps its last full page (20), the point the next
    turn resumes from, and 8 and 16 are skipped (not the first item taking both slots)."""
    loaded, _ = hybrid("lfm2")
    e = engine(loaded, max_batch_tokens=64, state_slots=4)
    g = torch.Generator().manual_seed(6)
    for _ in range(2):  # (no shared prefix: the second would wait for the first to cache it)
        e.add_request(
            torch.randint(0, 300, (22,), generator=g).tolist(), GREEDY.replace(max_tokens=1)
        )
    batch = e.scheduler.schedule()
    assert [(it.start, it.num_tokens) for it in batch.items] == [(0, 22), (0, 22)]
    saves = [(c.req, c.tokens, c.inside) for c in batch.state_copies]
    assert saves == [(it.req, 20, True) for it in batch.items]
    assert e.scheduler.pages.states.num_skipped == 4
    e._run(batch, 0.0)
    e.check_integrity()


def test_forks_share_the_prefix_and_a_next_turn_resumes(hybrid):
    """``n=2`` on the state cache: each sample its own copy of the leader's state, both equal
    to the cache-off engine's; the next turn resumes at the prompt's last full page (16)."""
    loaded, _ = hybrid("granite_h")
    e = engine(loaded, max_batch_tokens=8)
    off = engine(loaded, cache="chunk")
    p = SYSTEM + MESSAGES[0][0]
    out = e.generate_batch([p], GREEDY.replace(n=2))
    want = off.generate_batch([p], GREEDY)[0].token_ids
    assert out[0].token_ids == out[1].token_ids == want
    p2 = p + want + [3, 4, 5]
    (again,) = e.generate_batch([p2], GREEDY)
    assert again.token_ids == off.generate_batch([p2], GREEDY)[0].token_ids
    assert again.cached_tokens == 16
    e.check_integrity()


def test_kv_past_the_last_checkpoint_is_a_state_miss_and_a_recompute_revives_it(hybrid):
    """A's 22-token prompt leaves checkpoints at 8, 16 and 20 (its last full page). With 8 and
    16 evicted (the oldest: tombstones), B sharing A's first 18 tokens finds 16 tokens of KV and
    no checkpoint in them: all 16 are the miss cause ``state``. B recomputes through the
    tombstones and gives them their checkpoints back, so C, sharing the same 18, resumes at 16."""
    loaded, hf = hybrid("granite_h")
    e = engine(loaded, max_batch_tokens=64)
    a = SYSTEM + MESSAGES[0][0] + [1, 2, 3]
    e.generate_batch([a], GREEDY.replace(max_tokens=1))
    assert e.cache.num_states == 3
    assert e.cache.evict_states(2) == 2 and e.cache.num_states == 1
    b = a[:18] + [7] * 6
    (done,) = e.generate_batch([b], GREEDY)
    want = dict.fromkeys(done.miss, 0) | {"state": 16, "cold": 4, "page_tail": 4}
    assert done.miss == want and done.cached_tokens == 0
    assert done.token_ids == transformers_greedy(hf, b, done.token_ids)
    (again,) = e.generate_batch([a[:18] + [9] * 6], GREEDY)
    assert again.cached_tokens == 16 and again.miss["state"] == 0
    e.check_integrity()


def run_one(e, prompt):
    """One request, stepped by hand; free device slots poisoned after every step."""
    req = e.requests.build(prompt, GREEDY, None, None)
    sink = CompletionBuilder(req.request_id)
    e.add(req, sink)
    while e.has_work():
        e.step()
        poison_free_slots(e)
    return sink.result()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_next_turn_resumes_from_a_host_checkpoint(hybrid, family):
    """A prompt's KV and its checkpoints all demoted to the host; the next turn loads the KV
    back and copies the checkpoint from its host slot into its own (every free device slot
    poisoned first: only the host copy gives the right state), resumes at exactly the deepest
    checkpoint (its cached tokens all the miss cause ``host``), and its greedy tokens equal the
    cache-off engine's."""
    loaded, _ = hybrid(family)
    e = engine(loaded, host_pages=32, max_batch_tokens=64)
    assert isinstance(e.cache, MambaRadixCache) and e.cache.host is not None
    assert e.cache.host.slots.num_pages == default_host_state_slots(32, 256, 2 * 64)
    a = SYSTEM + MESSAGES[0][0] + [1, 2, 3]  # 22 tokens: checkpoints at 8, 16, 20 and 24
    first = run_one(e, a)
    assert e.cache.num_states == 4
    e.cache.evict(e.pool.num_pages)  # all of it to the host, the checkpoints with it
    e._run_copies()  # (as the next step would, before its forward)
    assert e.cache.total_tokens == 0 and e.cache.host.demoted_states == 4
    assert e.cache.num_states == 0 and len(e.cache.host.ckpt) == 4
    poison_free_slots(e)  # every device slot: only the host copies hold the states
    b = a + first.token_ids + [3, 4, 5]
    again = run_one(e, b)
    assert again.cached_tokens == 24 and again.miss["host"] == 24
    off = engine(loaded, cache="chunk")
    assert again.token_ids == off.generate_batch([b], GREEDY)[0].token_ids
    assert e.scheduler.pages.states.num_restored_host == 1
    e.check_integrity()
    e.cache.reset()
    assert e.cache.host.slots.num_free == e.cache.host.slots.num_pages
    assert e.state_pool.num_free == e.state_pool.num_slots


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("short", ["pages", "slots", "all_at_once"])
def test_chat_with_the_host_tier_equals_cache_off(hybrid, family, short):
    """Chat turns with a host tier on a pool so small that requests are preempted and nodes
    demoted (``pages``), or a state pool so short that checkpoints move to the host
    (``slots``), or both with the overlapped loop: greedy tokens equal the cache-off engine's;
    checkpoints were demoted and restored from the host; ``check_integrity`` (four pools)
    after every step."""
    loaded, _ = hybrid(family)
    kw = {"pages": {"num_pages": 12}, "slots": {"state_slots": 3}}.get(short) or {
        "num_pages": 12, "state_slots": 3, "overlap": "on",
    }  # fmt: skip
    e = engine(loaded, max_batch_tokens=8, host_pages=24, **kw)
    done = chat(e)
    off = engine(loaded, cache="chunk")
    ref = off.generate_batch([p for p, _, _ in done], GREEDY)
    assert [out for _, out, _ in done] == [c.token_ids for c in ref]
    host = e.cache.host
    assert host.demoted_states > 0 and (short != "pages" or e.stats()["preemptions"] > 0)
    assert short != "all_at_once" or e.overlap.overlapped_steps > 0
    assert e.scheduler.pages.states.num_restored_host > 0
    assert sum(c for *_, c in done) > 0
    e.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_forks_whose_allocations_demote_checkpoints_stay_exact(hybrid, family):
    """``n=3`` on a pool so small that a fork's pages demote nodes, their checkpoints with
    them: the slot a demotion frees may be the fork's own, so the demotion's copy runs before
    the leader's state is copied into it (``Engine._fork``); without that, outputs differ."""
    loaded, _ = hybrid(family)
    e = engine(loaded, max_batch_tokens=8, num_pages=12, host_pages=24, state_slots=4)
    off = engine(loaded, cache="chunk")
    for msgs in MESSAGES:
        for m in msgs[:2]:
            prompts = [SYSTEM + m, SYSTEM + m + [5, 6, 7]]
            got = e.generate_batch(prompts, GREEDY.replace(n=3))
            want = [c.token_ids for c in off.generate_batch(prompts, GREEDY)]
            assert [c.token_ids for c in got] == [w for w in want for _ in range(3)]
    assert e.cache.host.demoted_states > 0
    e.check_integrity()
