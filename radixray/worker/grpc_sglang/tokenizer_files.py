"""The worker's tokenizer as HF ``tokenizers`` files, zipped for SGLang's ``GetTokenizer``.

A gateway that tokenizes prompts itself (smg in front of a gRPC worker) loads the model's
tokenizer from a path or the Hub, and asks the worker for its files (``GetTokenizer``: one zip
archive in chunks, its SHA-256 on the last) when it cannot. The archive holds
``tokenizer.json`` and ``tokenizer_config.json`` (the chat template, the special tokens):

* the byte-level tokenizer of the tiny test model (``ByteTokenizer``) becomes an equivalent HF
  tokenizer: BPE with no merges whose vocabulary is the 256 byte tokens ``<0x00>``..``<0xFF>``
  (ids 0-255) with ``byte_fallback``, so every UTF-8 byte of the text is its own id, and the three
  ChatML special tokens as added tokens 256-258, matched whole in the text as ``encode`` does;
* a checkpoint's BPE tokenizer (``BPETokenizer``) is written out from the ``tokenizers`` object
  it wraps (its post-processor is off: radixray adds no BOS to a prompt, and neither will the
  gateway).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models

from radixray.model_meta.byte_tokenizer import ByteTokenizer

__all__ = ["byte_tokenizer_json", "tokenizer_files", "tokenizer_zip", "zip_chunks", "CHUNK_BYTES"]

CHUNK_BYTES = 1 << 20  # per GetTokenizer message (gRPC's default limit is 4 MiB)


def byte_tokenizer_json() -> str:
    """``tokenizer.json`` of an HF tokenizer with the ids of ``ByteTokenizer``."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, fuse_unk=False))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    specials = sorted(ByteTokenizer.SPECIAL_TOKENS.items(), key=lambda kv: kv[1])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s, _ in specials])
    for s, i in specials:  # added in id order after the 256 bytes: their ids are ByteTokenizer's
        if tok.token_to_id(s) != i:
            raise AssertionError(f"special token {s!r} got id {tok.token_to_id(s)}, not {i}")
    return tok.to_str()


def _token(tokenizer, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    if isinstance(tokenizer, ByteTokenizer):
        return {i: s for s, i in ByteTokenizer.SPECIAL_TOKENS.items()}.get(token_id)
    backend = getattr(tokenizer, "_tok", None)
    return backend.id_to_token(token_id) if backend is not None else None


def tokenizer_files(tokenizer, max_model_len: int) -> dict[str, str]:
    """``{file name: text}`` of ``tokenizer`` in HF's layout. Raises ValueError for a tokenizer
    that is neither the byte-level one nor a BPE over a ``tokenizers`` object."""
    if isinstance(tokenizer, ByteTokenizer):
        tokenizer_json = byte_tokenizer_json()
    else:
        backend = getattr(tokenizer, "_tok", None)
        if not isinstance(backend, Tokenizer):
            raise ValueError(f"cannot write out a {type(tokenizer).__name__} as tokenizer.json")
        tokenizer_json = backend.to_str()
    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_model_len,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    for name, tid in (
        ("bos_token", tokenizer.bos_token_id),
        ("eos_token", tokenizer.eos_token_id),
        ("pad_token", tokenizer.pad_token_id),
    ):
        text = _token(tokenizer, tid)
        if text is not None:
            config[name] = text
    template = getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": json.dumps(config)}


def tokenizer_zip(files: dict[str, str]) -> bytes:
    """The files as one zip archive (deflated; fixed timestamps, so the same files give the same
    bytes and the same fingerprint)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, files[name])
    return buf.getvalue()


def zip_chunks(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[bytes, str]]:
    """``(chunk, sha256)`` pairs: the archive in order, the hex SHA-256 of the whole archive with
    the last chunk only (empty before), as ``GetTokenizer`` streams it."""
    if not data:
        raise ValueError("an empty tokenizer archive")
    digest = hashlib.sha256(data).hexdigest()
    for start in range(0, len(data), chunk_bytes):
        end = start + chunk_bytes
        yield data[start:end], digest if end >= len(data) else ""
