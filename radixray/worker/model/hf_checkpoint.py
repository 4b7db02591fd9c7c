"""Read an HF transformers checkpoint directory of the decoder family: ``config.json`` +
``*.safetensors`` (+ ``tokenizer.json`` when present)."""

from __future__ import annotations

from pathlib import Path

import torch

from radixray.model_meta.hf_meta import HFMetadata
from radixray.model_meta.model_config import ModelConfig

__all__ = ["HFCheckpoint"]


class HFCheckpoint(HFMetadata):
    """An HF directory's metadata (``HFMetadata``: config, tokenizer) and its safetensors."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.files = sorted(self.path.glob("*.safetensors"))
        if not self.files:
            raise FileNotFoundError(f"{self.path}: no *.safetensors weights")

    def hf_state_dict(self, config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in self.files:
            out.update(load_file(str(f)))
        if self.architecture() == "gemma3":
            out = _text_weights(out)
        return out


# Where Gemma3ForConditionalGeneration keeps the text model: transformers 4.x, then 5.x.
_TEXT_PREFIXES = {
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.language_model.": "model.",
}


def _text_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A multimodal Gemma 3's text weights under Gemma3ForCausalLM's names; the vision tower
    and its projector are dropped."""
    out = {}
    for name, w in state.items():
        for prefix, to in _TEXT_PREFIXES.items():
            if name.startswith(prefix):
                out[to + name[len(prefix) :]] = w
                break
        else:
            if name == "lm_head.weight":
                out[name] = w
    return out
