"""What the router needs of the model without loading its weights: tokenizer, chat template,
context length. The router tokenizes once; workers receive token ids."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

__all__ = ["ModelMeta", "load_model_meta"]


class ModelMeta(NamedTuple):
    name: str  # the model id clients send in "model"
    tokenizer: object  # encode / decode / apply_chat_template / stop_token_ids
    max_model_len: int
    vocab_size: int


def load_model_meta(spec: str, served_name: str | None = None) -> ModelMeta:
    from radixray.worker.model import ByteTokenizer, load_model, smollm2_gguf_path, tiny_config

    if spec == "tiny":
        cfg = tiny_config()
        return ModelMeta(
            served_name or "tiny", ByteTokenizer(), cfg.max_position_embeddings, cfg.vocab_size
        )
    path = smollm2_gguf_path() if spec == "smollm2" else Path(spec)
    name = served_name or (
        "smollm2" if spec == "smollm2" else path.stem if path.is_file() else path.name
    )
    if path.is_file() and path.suffix == ".gguf":
        from radixray.worker.model.gguf_file import GGUFCheckpoint

        ckpt = GGUFCheckpoint(path)
    elif path.is_dir() and (path / "config.json").is_file():
        from radixray.worker.model.hf_checkpoint import HFCheckpoint

        ckpt = HFCheckpoint(path)
    else:
        load_model(spec)  # raises the loader's own error naming the valid forms
        raise AssertionError("unreachable")
    cfg = ckpt.config()
    tok = ckpt.tokenizer()
    if tok is None:
        raise ValueError(f"model {spec!r} has no tokenizer: the router needs one to tokenize")
    return ModelMeta(name, tok, cfg.max_position_embeddings, cfg.vocab_size)
