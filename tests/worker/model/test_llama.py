"""The tiny model on the paged pool: one prefill, chunked prefill and prefill + decode, mixed with
other sequences in one flat batch on random non-contiguous pages, all give the same logits; and
they equal an independent dense implementation (transformers' LlamaForCausalLM, same weights)."""

import dataclasses

import pytest
import torch

from radixray.worker.model import AttentionMetadata, LlamaModel, load_model, new_kv_cache
from radixray.worker.model.loader import random_hf_state_dict

SEQ_LENS = {"A": 37, "B": 20, "C": 9}
NUM_PAGES = 48
# Same ops in a different batch shape only reorder float32 sums: 1e-5 is a few ulps at |logit|~3.
TIGHT = {"rtol": 1e-5, "atol": 2e-5}
# Against transformers: eager attention and another RoPE/softmax formulation.
VS_HF = {"rtol": 1e-4, "atol": 1e-4}


def tiny(tie: bool = False) -> LlamaModel:
    if not tie:
        return load_model("tiny", seed=1).model
    from radixray.worker.model import tiny_config

    config = tiny_config(tie_word_embeddings=True)
    model = LlamaModel(config)
    model.load_hf_state_dict(random_hf_state_dict(config, seed=2))
    return model.eval()


def hf_twin(model: LlamaModel):
    """transformers' Llama with the same weights: the dense reference."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        attn_implementation="eager",
    )
    hf = LlamaForCausalLM(hf_config).eval()
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return hf


def sequences() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(0)
    return {name: torch.randint(0, 256, (n,), generator=g).tolist() for name, n in SEQ_LENS.items()}


class PagedRun:
    """Drives the model over a schedule of steps; each step is [(seq, num_new_tokens), ...]."""

    def __init__(self, model: LlamaModel, page_size: int, seqs: dict[str, list[int]]):
        self.model, self.page_size, self.seqs = model, page_size, seqs
        self.k_cache, self.v_cache = new_kv_cache(model, NUM_PAGES, page_size)
        perm = torch.randperm(NUM_PAGES, generator=torch.Generator().manual_seed(page_size))
        perm, self.pages = perm.tolist(), {}
        for name, tokens in seqs.items():
            n = -(-len(tokens) // page_size)
            self.pages[name], perm = perm[:n], perm[n:]
        self.done = dict.fromkeys(seqs, 0)
        self.logits: dict[str, list[torch.Tensor]] = {name: [] for name in seqs}

    def step(self, batch: list[tuple[str, int]]) -> None:
        names = [n for n, _ in batch]
        news = [k for _, k in batch]
        attn, positions = AttentionMetadata.build(
            [self.pages[n] for n in names], [self.done[n] for n in names], news, self.page_size
        )
        ids = torch.tensor(
            [t for n, k in batch for t in self.seqs[n][self.done[n] : self.done[n] + k]]
        )
        rows = torch.arange(ids.shape[0])
        logits = self.model(ids, positions, attn, self.k_cache, self.v_cache, rows)
        for (name, k), part in zip(batch, logits.split(news), strict=True):
            self.done[name] += k
            self.logits[name].append(part)

    def run(self, schedule) -> dict[str, torch.Tensor]:
        for batch in schedule:
            self.step(batch)
        assert all(self.done[n] == len(t) for n, t in self.seqs.items()), self.done
        return {name: torch.cat(parts) for name, parts in self.logits.items()}


SCHEDULES = {
    # (a) every sequence in one prefill, alone
    "one_prefill": [[("A", 37)], [("B", 20)], [("C", 9)]],
    # (b) A in chunks across steps, mixed with B's prefill, C's prefill and decodes
    "chunked": [
        [("A", 10), ("B", 20)],
        [("B", 0), ("C", 9), ("A", 13)],
        [("C", 0), ("A", 14)],
    ],
    # (c) A's prefill, then A decodes one token per step beside other prefill chunks
    "prefill_then_decode": [
        [("B", 5), ("A", 30)],
        [("A", 1), ("B", 7)],
        [("C", 4), ("A", 1), ("B", 8)],
        [("A", 1), ("C", 5)],
        [("A", 1)],
        [("A", 1)],
        [("A", 1)],
        [("A", 1)],
    ],
}


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def dense_logits(model):
    hf = hf_twin(model)
    with torch.inference_mode():
        return {n: hf(torch.tensor([t])).logits[0] for n, t in sequences().items()}


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_schedules_agree_with_each_other_and_with_dense(model, dense_logits, page_size):
    runs = {
        name: PagedRun(model, page_size, sequences()).run(schedule)
        for name, schedule in SCHEDULES.items()
    }
    base = runs["one_prefill"]
    for name, logits in runs.items():
        for seq in SEQ_LENS:
            torch.testing.assert_close(logits[seq], base[seq], **TIGHT, msg=f"{name}/{seq}")
    for seq in SEQ_LENS:
        torch.testing.assert_close(base[seq], dense_logits[seq], **VS_HF, msg=f"dense/{seq}")


def test_tied_embeddings_match_dense():
    model = tiny(tie=True)
    assert model.lm_head.weight is model.embed_tokens.weight
    tokens = sequences()["A"]
    run = PagedRun(model, 8, {"A": tokens}).run([[("A", 20)], [("A", 17)]])
    with torch.inference_mode():
        dense = hf_twin(model)(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(run["A"], dense, **VS_HF)


def test_default_logits_rows_are_each_sequences_last_token(model):
    seqs = sequences()
    attn, positions = AttentionMetadata.build([[0, 1, 2], [5, 4]], [0, 0], [9, 7], 4)
    ids = torch.tensor(seqs["C"] + seqs["B"][:7])
    k, v = new_kv_cache(model, 8, 4)
    last = model(ids, positions, attn, k, v)
    k, v = new_kv_cache(model, 8, 4)
    every = model(ids, positions, attn, k, v, torch.arange(16))
    assert last.shape == (2, model.config.vocab_size) and last.dtype == torch.float32
    torch.testing.assert_close(last, every[[8, 15]], **TIGHT)


def test_forward_rejects_a_pool_of_the_wrong_shape(model):
    attn, positions = AttentionMetadata.build([[0]], [0], [3], 4)
    k, v = new_kv_cache(model, 2, 4)
    with pytest.raises(ValueError, match="k_cache must be"):
        model(torch.tensor([1, 2, 3]), positions, attn, k[:, :, :, :1], v)


def test_build_rejects_too_few_pages():
    with pytest.raises(ValueError, match="cannot hold"):
        AttentionMetadata.build([[0]], [3], [2], 4)


def test_tiny_weights_are_seeded():
    a, b, c = (load_model("tiny", seed=s).model for s in (0, 0, 1))
    wa, wb, wc = (m.hf_state_dict()["model.layers.1.mlp.up_proj.weight"] for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_dtype_is_configurable():
    model = load_model("tiny", dtype=torch.float64).model
    assert model.embed_tokens.weight.dtype == torch.float64
    attn, positions = AttentionMetadata.build([[1, 0]], [0], [5], 4)
    k, v = new_kv_cache(model, 2, 4)
    assert k.dtype == torch.float64
    logits = model(torch.arange(5), positions, attn, k, v)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_load_state_dict_names_missing_weights():
    config = dataclasses.replace(load_model("tiny").config)
    state = random_hf_state_dict(config)
    del state["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="up_proj"):
        LlamaModel(config).load_hf_state_dict(state)
