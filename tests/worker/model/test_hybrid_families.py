"""The hybrid families (recurrent-state layers beside attention) against HF transformers: small
random-weight models built here, written with ``save_pretrained``, loaded by ``load_model``, and
run on the paged KV pool plus the state pool (worker/state_pool.py) through the model's varlen
forward, as the engine will run them.

- float32 logits within 1e-4 of transformers' full forward without a cache (its cached path is
  not exact for multi-token steps on a cache), at every position of several sequences run in
  one flat batch: prefills split into chunks at odd boundaries, sequences joining late, a
  multi-token chunk after decodes, then decode steps, on shuffled pages of 4, with every slot
  poisoned beforehand (a sequence with no context must not read what its slot held);
- greedy tokens equal to transformers' greedy choice for 200 steps, two sequences batched (its
  argmax at every position of one forward over prompt + our tokens: the first divergence fails);
- a fork (``StatePool.copy``) continues like a cold run on its own and never disturbs its
  source; the weights export back exactly as the checkpoint holds them.
"""

from __future__ import annotations

import pytest
import torch

from radixray.worker.model import AttentionMetadata, load_model, new_kv_cache
from radixray.worker.model.state_metadata import StateBatch, StateMetadata
from radixray.worker.state_pool import StatePool

from .test_model_families import spread_weights

VS_HF = {"rtol": 1e-4, "atol": 1e-4}
STEPS = 200
PAGE = 4
BASE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "attn_implementation": "eager",
    "eos_token_id": None,
}
MAMBA = {
    "mamba_n_heads": 8,  # head_dim 16 = 2 * 64 / 8
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 8,  # prefill chunks cross several of the scan's own chunks
}
# family -> (transformers classes, config fields beyond BASE)
FAMILIES = {
    # conv, attention, conv; the MLP width by LFM2's rule: int(2 * 200 / 3) = 133 -> 160
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        {
            "intermediate_size": 200,
            "block_multiple_of": 32,
            "num_hidden_layers": 3,
            "layer_types": ["conv", "full_attention", "conv"],
            "norm_eps": 1e-6,
        },
    ),
    # biases in the conv block, a longer kernel, attention first, tied embeddings
    "lfm2_bias": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        {
            "intermediate_size": 96,
            "block_auto_adjust_ff_dim": False,
            "num_hidden_layers": 2,
            "full_attn_idxs": [0],
            "conv_bias": True,
            "conv_L_cache": 5,
            "tie_word_embeddings": True,
        },
    ),
    # Granite 4.0-H's shape: Mamba2 (2 B/C groups), attention with RoPE, MoE + shared MLP,
    # Granite's multipliers and logits scaling
    "granite_h": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        MAMBA
        | {
            "intermediate_size": 32,
            "shared_intermediate_size": 48,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 3,
            "layer_types": ["mamba", "attention", "mamba"],
            "mamba_n_groups": 2,
            "position_embedding_type": "rope",
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
            "logits_scaling": 0.5,
        },
    ),
    # NoPE, no experts (the shared MLP alone), one group, a time step limit that binds
    "granite_h_nope": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        MAMBA
        | {
            "intermediate_size": 32,
            "shared_intermediate_size": 64,
            "num_local_experts": 0,
            "num_hidden_layers": 3,
            "layer_types": ["attention", "mamba", "mamba"],
            "time_step_limit": (0.0, 0.8),
        },
    ),
}


def hf_model(family: str, path):
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**(BASE | extra))
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(config).eval()
    spread_weights(hf)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (directory, transformers model, our model), each built once for the module."""
    made: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in made:
            path = tmp_path_factory.mktemp(family)
            hf = hf_model(family, path)
            made[family] = (path, hf, load_model(str(path)).model)
        return made[family]

    return get


class Run:
    """Sequences on the model's varlen forward: each with its own pages (shuffled) and state
    slot; ``step({seq: tokens})`` runs one flat batch and returns each sequence's logits at
    every row it fed."""

    def __init__(self, model, num_pages: int = 64, slots: int = 6) -> None:
        self.model = model
        self.k, self.v = new_kv_cache(model, num_pages, PAGE)
        self.pool = StatePool(model.config, slots)
        self.pool.alloc(slots)  # every slot taken: each sequence is given its own by number
        self.free_pages = list(reversed(range(num_pages)))[::2] + list(range(0, num_pages, 2))
        self.seqs: dict[str, dict] = {}

    def add(self, name: str, slot: int, pages: int = 16) -> None:
        self.seqs[name] = {"slot": slot, "pages": self.free_pages[:pages], "done": 0}
        del self.free_pages[:pages]

    def step(self, feed: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        names = list(feed)
        seqs = [self.seqs[n] for n in names]
        cached, new = [s["done"] for s in seqs], [len(feed[n]) for n in names]
        attn, positions = AttentionMetadata.build([s["pages"] for s in seqs], cached, new, PAGE)
        meta = StateMetadata.build([s["slot"] for s in seqs], cached, new)
        ids = torch.tensor([t for n in names for t in feed[n]])
        rows = torch.arange(ids.shape[0])
        logits = self.model(
            ids, positions, attn, self.k, self.v, rows, state=StateBatch(meta, self.pool)
        )
        out, row = {}, 0
        for name, s, n in zip(names, seqs, new, strict=True):
            out[name] = logits[row : row + n]
            s["done"] += n
            row += n
        return out


def poison(pool: StatePool) -> None:
    """Fill every slot with garbage: a fresh sequence must never read it."""
    for t in pool.tensors.values():
        t.copy_(torch.randn(t.shape) * 100.0)


# Chunks per step: a (prompt 13 in 5 + 8, decodes, a 3-token chunk after decoding, decodes),
# b (prompt 11 in one chunk), c (joins at step 1: prompt 19 in 3 + 7 + 9); all 30 tokens long.
SCHEDULE = {
    "a": [5, 8, 1, 1, 3] + [1] * 12,
    "b": [11] + [1] * 19,
    "c": [0, 3, 7, 9] + [1] * 11,
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_over_a_chunked_paged_varlen_run(checkpoints, family):
    path, hf, model = checkpoints(family)
    g = torch.Generator().manual_seed(1)
    tokens = {
        n: torch.randint(0, 300, (sum(c),), generator=g).tolist() for n, c in SCHEDULE.items()
    }
    run = Run(model)
    poison(run.pool)
    for name, slot in zip(SCHEDULE, (4, 0, 2), strict=True):
        run.add(name, slot)
    got: dict[str, list[torch.Tensor]] = {n: [] for n in SCHEDULE}
    for step in range(max(len(c) for c in SCHEDULE.values())):
        feed = {}
        for name, chunks in SCHEDULE.items():
            if step < len(chunks) and chunks[step]:
                done = run.seqs[name]["done"]
                feed[name] = tokens[name][done : done + chunks[step]]
        for name, logits in run.step(feed).items():
            got[name].append(logits)
    for name, ids in tokens.items():
        with torch.inference_mode():
            expected = hf(torch.tensor([ids]), use_cache=False).logits[0]
        torch.testing.assert_close(torch.cat(got[name]), expected, **VS_HF)
    # the weights come back out exactly as the checkpoint holds them, under the same names
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    exported = model.hf_state_dict()
    assert exported.keys() == saved.keys()
    assert all(torch.equal(exported[k], saved[k]) for k in saved)


def hf_greedy(hf, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy token after ``prompt + tokens[:i]`` for every i: where ``tokens``
    first differs from it, it differs from transformers' greedy run."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + tokens]), use_cache=False).logits[0]
    return logits[len(prompt) - 1 : -1].argmax(-1).tolist()


@pytest.mark.parametrize("family", ["lfm2", "granite_h"])
def test_greedy_tokens_match_transformers_for_200_steps(checkpoints, family):
    _, hf, model = checkpoints(family)
    g = torch.Generator().manual_seed(2)
    prompts = {
        "x": torch.randint(0, 300, (21,), generator=g).tolist(),
        "y": torch.randint(0, 300, (9,), generator=g).tolist(),
    }
    run = Run(model, num_pages=140)
    run.add("x", 1, pages=60)
    run.add("y", 3, pages=60)
    # the prompts in two chunks each, 21 = 8 + 13 and 9 = 4 + 5
    run.step({"x": prompts["x"][:8], "y": prompts["y"][:4]})
    last = run.step({"x": prompts["x"][8:], "y": prompts["y"][4:]})
    greedy = {n: [int(last[n][-1].argmax())] for n in prompts}
    while len(greedy["x"]) < STEPS:
        last = run.step({n: greedy[n][-1:] for n in prompts})
        for n in prompts:
            greedy[n].append(int(last[n][-1].argmax()))
    # transformers' greedy choice at every step, given the tokens before it: its argmax over one
    # uncached forward of the whole sequence (what ``generate(do_sample=False)`` picks one step
    # at a time, in one forward instead of 200)
    expected = {n: hf_greedy(hf, prompts[n], greedy[n]) for n in prompts}
    assert greedy == expected


def test_a_fork_gets_its_own_copy_of_the_state(checkpoints):
    _, hf, model = checkpoints("granite_h")  # a conv state and an SSM state per layer
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 300, (14,), generator=g).tolist()
    run = Run(model)
    run.add("lead", 0)
    run.add("fork", 5)
    run.step({"lead": prompt})
    # the fork: the leader's state copied into its own slot, its KV into its own pages
    run.pool.copy(0, 5)
    lead, fork = run.seqs["lead"], run.seqs["fork"]
    for cache in (run.k, run.v):
        cache[:, fork["pages"]] = cache[:, lead["pages"]]
    fork["done"] = lead["done"]
    paths = {"lead": prompt + [7, 8, 9], "fork": prompt + [200, 100, 50]}
    for i in range(3):
        logits = run.step({n: [p[len(prompt) + i]] for n, p in paths.items()})
        for n, p in paths.items():
            with torch.inference_mode():
                cold = hf(torch.tensor([p[: len(prompt) + i + 1]]), use_cache=False).logits[0, -1]
            torch.testing.assert_close(logits[n][0], cold, **VS_HF)


def test_a_model_with_state_layers_needs_the_state(checkpoints):
    _, _, model = checkpoints("lfm2")
    k, v = new_kv_cache(model, 4, PAGE)
    attn, positions = AttentionMetadata.build([[0, 1]], [0], [5], PAGE)
    with pytest.raises(ValueError, match=r"layers \[0, 2\] keep a recurrent state"):
        model(torch.arange(5), positions, attn, k, v)
    assert k.shape[0] == 1  # the KV pool holds the one attention layer only
