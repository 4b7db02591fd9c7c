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
        return out
