"""HF transformers' view of SmolLM2's GGUF, the reference our loader and model are tested against.

Loading the GGUF through transformers' public API takes ~40 s on a busy 2-core CPU (gguf-py parses
the 49k-entry vocabulary twice), so the reference is computed once and kept in
``data/smollm2_hf_reference.safetensors``. Regenerate it (needs ``accelerate``) with::

    .venv/bin/python -m tests.worker.model.hf_reference

``test_smollm2.py`` compares against the stored file always, and recomputes it live when
``RADIXRAY_HF_LIVE=1``. What is kept, per prompt: the input ids (HF's tokenizer with the chat
template), and at every position HF's top-64 logits with their token ids plus the logsumexp
of the whole row (so a wrong logit anywhere in the vocabulary shows as a logsumexp change).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

REFERENCE_FILE = Path(__file__).parent / "data" / "smollm2_hf_reference.safetensors"
TOP_K = 64
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue, and give the year 1871 as a number.",
)


def hf_reference(prompts=PROMPTS) -> dict[str, torch.Tensor]:
    """Run HF transformers on the GGUF (public API) -> tensors keyed ``{i}.ids``, ``{i}.top_ids``,
    ``{i}.top_logits``, ``{i}.logsumexp``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixray.worker.model import smollm2_gguf_path

    path = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    out: dict[str, torch.Tensor] = {}
    for i, prompt in enumerate(prompts):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0].float()
        top = logits.topk(TOP_K, dim=-1)
        out[f"{i}.ids"] = torch.tensor(ids, dtype=torch.int64)
        out[f"{i}.top_ids"] = top.indices.contiguous()
        out[f"{i}.top_logits"] = top.values.contiguous()
        out[f"{i}.logsumexp"] = logits.logsumexp(-1).contiguous()
    return out


def load_reference() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(REFERENCE_FILE))


if __name__ == "__main__":
    from safetensors.torch import save_file

    REFERENCE_FILE.parent.mkdir(exist_ok=True)
    save_file(hf_reference(), str(REFERENCE_FILE))
    print(f"wrote {REFERENCE_FILE}")
