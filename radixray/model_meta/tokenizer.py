"""Tokenizers: the protocol the engine uses, and a byte-level BPE built from a checkpoint.

:class:`BPETokenizer` is built with the ``tokenizers`` library from either a GGUF file's metadata
(``tokenizer.ggml.*`` keys: tokens, merges, token types, special ids, chat template) or an HF
directory's ``tokenizer.json``. transformers is not needed at runtime; the tests check that the ids
equal transformers' tokenizer for the same file.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .chat_template import ChatTemplate
from .model_config import UnsupportedModelError

__all__ = ["BPETokenizer", "TokenizerProtocol"]

# llama.cpp's GGUF token types (gguf.TokenType): 3 = CONTROL (special), 4 = USER_DEFINED (added).
_CONTROL, _USER_DEFINED = 3, 4

# Tokens that end a turn or a document in common chat vocabularies: all of them stop generation.
_END_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "</s>",
    "<end_of_turn>",  # Gemma's
)

# Llama 3's split pattern (llama.cpp pre-tokenizer "llama-bpe" and aliases).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "dbrx")
# Qwen2's (and Qwen3's): Llama 3's with every digit on its own.
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


@runtime_checkable
class TokenizerProtocol(Protocol):
    """What the engine and router need from a tokenizer (BPETokenizer and ByteTokenizer)."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    stop_token_ids: tuple[int, ...]
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str: ...


def _pre_tokenizer(pre: str | None):
    """The GGUF ``tokenizer.ggml.pre`` name -> how text is split before BPE."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in (None, "default", "gpt2", "gpt-2"):
        return byte_level
    if pre == "smollm":
        # llama.cpp's "smollm": GPT-2's split with every digit on its own, as SmolLM's own
        # tokenizer.json does (its vocabulary has no multi-digit tokens).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _LLAMA3_PRE or pre == "qwen2":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(
                    Regex(_QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT), behavior="isolated"
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    warnings.warn(
        f"unknown GGUF pre-tokenizer {pre!r}: splitting text as GPT-2 does; ids may differ from "
        "llama.cpp's",
        stacklevel=3,
    )
    return byte_level


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` plus the special ids and chat template of one checkpoint."""

    def __init__(
        self,
        backend: Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None = None,
        add_bos_token: bool = False,
        chat_template: str | None = None,
        extra_stop_ids: Iterable[int] = (),
    ) -> None:
        self._tok = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.add_bos_token = add_bos_token
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        vocab = backend.get_vocab(with_added_tokens=True)
        stops = {eos_token_id} if eos_token_id is not None else set()
        stops.update(vocab[t] for t in _END_TOKENS if t in vocab)
        stops.update(int(i) for i in extra_stop_ids)  # what the checkpoint's configs declare
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(stops))
        self.chat_template = chat_template
        specials = {
            name: backend.id_to_token(i)
            for name, i in (("bos_token", bos_token_id), ("eos_token", eos_token_id))
            if i is not None
        }
        self._chat = ChatTemplate(chat_template, specials) if chat_template else None

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader) -> BPETokenizer:
        """Build from an open GGUF reader (``GGUFFile`` or ``gguf.GGUFReader``: its
        ``fields``; no tensor is read)."""
        fields = reader.fields

        def get(key: str, default: Any = None) -> Any:
            return fields[key].contents() if key in fields else default

        kind = get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedModelError(
                f"GGUF tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2', as in "
                "SmolLM2, Llama 3, Qwen) is supported, not SentencePiece ('llama': Mistral, "
                "Gemma): serve those from their HF directory"
            )
        tokens: list[str] = get("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
        types: list[int] = get("tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        pre = get("tokenizer.ggml.pre")
        backend.pre_tokenizer = _pre_tokenizer(pre)
        if pre == "qwen2":  # Qwen's own tokenizer.json composes text to NFC first
            backend.normalizer = normalizers.NFC()
        backend.decoder = decoders.ByteLevel()
        # Control tokens stay whole and are dropped by decode(skip_special_tokens=True);
        # user-defined ones stay whole but are ordinary text.
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty == _USER_DEFINED
            ]
        )
        return cls(
            backend,
            bos_token_id=get("tokenizer.ggml.bos_token_id"),
            eos_token_id=get("tokenizer.ggml.eos_token_id"),
            pad_token_id=get("tokenizer.ggml.padding_token_id"),
            add_bos_token=bool(get("tokenizer.ggml.add_bos_token", False)),
            chat_template=get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(
        cls, path: str | Path, extra_stop_ids: Iterable[int] = ()
    ) -> BPETokenizer | None:
        """Build from an HF checkpoint directory; ``None`` when it has no ``tokenizer.json``.
        ``extra_stop_ids``: more ids that end generation (the config's ``eos_token_id`` list)."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            return None
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        # The HF post-processor may add BOS; encode() decides that itself (add_special_tokens).
        backend.post_processor = None
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}

        def token_id(name: str) -> int | None:
            tok = cfg.get(name)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return backend.token_to_id(tok) if isinstance(tok, str) else None

        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        return cls(
            backend,
            bos_token_id=token_id("bos_token"),
            eos_token_id=token_id("eos_token"),
            pad_token_id=token_id("pad_token"),
            add_bos_token=bool(cfg.get("add_bos_token", False)),
            chat_template=template,
            extra_stop_ids=extra_stop_ids,
        )

    # --- the protocol -------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special-token strings in the text (``<|im_start|>``) map to their
        ids, as in transformers; ``add_special_tokens`` prepends BOS if the checkpoint asks for it.
        """
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text for ``messages``, rendered with the checkpoint's own template."""
        if self._chat is None:
            raise ValueError("this checkpoint ships no chat template; send a plain text prompt")
        return self._chat.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
