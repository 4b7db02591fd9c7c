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
        seq, rows = list(ids), []
        with torch.inference_mode():
            for _ in range(STEPS):
                row = model(torch.tensor([seq])).logits[0, -1].float()
                rows.append(row)
                seq.append(int(row.argmax()))
        logits = torch.stack(rows)
        top = logits.topk(TOP_K, dim=-1)
        out[f"{i}.ids"] = torch.tensor(ids, dtype=torch.int64)
        out[f"{i}.generated"] = torch.tensor(seq[len(ids) :], dtype=torch.int64)
        out[f"{i}.top_ids"] = top.indices.contiguous()
        out[f"{i}.top_logits"] = top.values.contiguous()
        out[f"{i}.logsumexp"] = logits.logsumexp(-1).contiguous()
    return out


def load_decode_reference() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(DECODE_REFERENCE_FILE))


if __name__ == "__main__":
    from safetensors.torch import save_file

    DECODE_REFERENCE_FILE.parent.mkdir(exist_ok=True)
    save_file(hf_decode_reference(), str(DECODE_REFERENCE_FILE))
    print(f"wrote {DECODE_REFERENCE_FILE}")
