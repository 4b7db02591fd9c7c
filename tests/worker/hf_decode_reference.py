"""HF transformers' logits along a greedy continuation of SmolLM2's GGUF: the reference for the
logprobs of decode steps (``test_logprobs_smollm2.py``), where each token's logits come from the
paged KV cache rather than a prefill.

transformers loads the GGUF through its public API (``from_pretrained(gguf_file=)``, ~1 min on a
busy 2-core CPU), so the result is kept in ``data/smollm2_hf_decode_reference.safetensors``.
Regenerate it (needs ``accelerate``) with::

    .venv/bin/python -m tests.worker.hf_decode_reference

Per prompt of ``tests/worker/model/hf_reference.py`` (its stored chat-rendered ids): STEPS tokens
chosen greedily by HF, each from a full forward over the prompt and the tokens before it (no KV
cache), and at each step HF's top-64 logits with their ids and the logsumexp of the row.

One causal forward over the prompt and all STEPS tokens gives at each position the logits a
forward over that prefix alone gives (its attention masks every later position), so the steps'
rows come from a single forward, not STEPS of them (the 36 forwards took 12 s of the live test
on one busy core, 42 s on two contended threads; now ~5 s and ~15 s). The tokens are HF's
greedy continuation when each is its row's argmax, and that sequence is unique (the first
follows from the prompt alone, each next from the ones before it); HF's KV-cached ``generate``
proposes it, and the full forward decides: a token that is not its row's argmax is replaced by
it and the forward runs again (at most STEPS times). The stored file and this agree exactly.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .model.hf_reference import PROMPTS, TOP_K, load_reference

DECODE_REFERENCE_FILE = Path(__file__).parent / "data" / "smollm2_hf_decode_reference.safetensors"
STEPS = 12


def hf_decode_reference() -> dict[str, torch.Tensor]:
    """``{i}.ids`` (the prompt), ``{i}.generated`` [STEPS], and per step ``{i}.top_ids``,
    ``{i}.top_logits`` [STEPS, TOP_K] and ``{i}.logsumexp`` [STEPS]."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    from radixray.worker.model import smollm2_gguf_path

    path = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    prompts = load_reference()
    out: dict[str, torch.Tensor] = {}
    for i in range(len(PROMPTS)):
        ids = prompts[f"{i}.ids"].tolist()
        generated, logits = _greedy_full_forward(model, ids, _cached_greedy(model, ids))
        top = logits.topk(TOP_K, dim=-1)
        out[f"{i}.ids"] = torch.tensor(ids, dtype=torch.int64)
        out[f"{i}.generated"] = torch.tensor(generated, dtype=torch.int64)
        out[f"{i}.top_ids"] = top.indices.contiguous()
        out[f"{i}.top_logits"] = top.values.contiguous()
        out[f"{i}.logsumexp"] = logits.logsumexp(-1).contiguous()
    return out


@torch.inference_mode()
def _cached_greedy(model, ids: list[int]) -> list[int]:
    """HF's greedy STEPS tokens by ``generate`` (its KV cache; EOS does not end them): a
    proposal, checked by _greedy_full_forward."""
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
        do_sample=False,
        max_new_tokens=STEPS,
        min_new_tokens=STEPS,
    )
    return out[0, len(ids) :].tolist()


@torch.inference_mode()
def _greedy_full_forward(model, ids: list[int], proposal: list[int]):
    """``(tokens, logits [STEPS, vocab])``: the greedy continuation by full forwards (no KV
    cache), from one forward over ``ids`` and the proposed tokens when each proposed token is its
    row's argmax; else the first that is not is replaced and the forward repeated."""
    tokens = list(proposal)
    for _ in range(STEPS):
        seq = ids + tokens[:-1]  # the last token's own logits are not needed
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, len(ids) - 1 :].float()
        greedy = logits.argmax(-1).tolist()
        wrong = next((k for k, t in enumerate(tokens) if greedy[k] != t), None)
        if wrong is None:
            return tokens, logits
        tokens[wrong] = greedy[wrong]  # the ones after it follow a changed prefix: checked next
    raise AssertionError(f"no greedy fixed point in {STEPS} full forwards: {tokens}")


def load_decode_reference() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(DECODE_REFERENCE_FILE))


if __name__ == "__main__":
    from safetensors.torch import save_file

    DECODE_REFERENCE_FILE.parent.mkdir(exist_ok=True)
    save_file(hf_decode_reference(), str(DECODE_REFERENCE_FILE))
    print(f"wrote {DECODE_REFERENCE_FILE}")
