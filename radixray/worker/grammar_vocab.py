"""A tokenizer's vocabulary as the grammar library needs it: each id's bytes, and which ids are
special (never produced by a grammar; only the stop ids end one).

Byte-level BPE vocabularies (GPT-2's, SmolLM2's) store each byte as a printable character; this
undoes that map, so the grammar library sees the bytes the model really emits. Ids past the
tokenizer's vocabulary (a model's embedding is often padded) are special: a grammar masks them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

__all__ = ["Vocab", "byte_level_chars", "vocab_of"]


class Vocab(NamedTuple):
    tokens: list[bytes]  # one entry per model id (len == the model's vocab size)
    special_ids: frozenset[int]
    stop_ids: tuple[int, ...]
    eos_id: int


@lru_cache(maxsize=1)
def byte_level_chars() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable char -> the byte it stands for (the
    grammar's vocabulary and the detokenizer's byte table, ``token_bytes.py``, both read it)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def vocab_of(tokenizer, model_vocab_size: int | None = None) -> Vocab:
    """The :class:`Vocab` of a ``ByteTokenizer`` or ``BPETokenizer``, padded to the model's size."""
    size = max(model_vocab_size or 0, tokenizer.vocab_size)
    tokens: list[bytes] = []
    special: set[int] = set()
    backend = getattr(tokenizer, "_tok", None)
    if backend is None:  # ByteTokenizer: ids 0..255 are the bytes, then its special tokens
        tokens = [bytes([i]) for i in range(256)]
        names = {i: s for s, i in tokenizer.SPECIAL_TOKENS.items()}
        for i in range(256, tokenizer.vocab_size):
            tokens.append(names[i].encode())
            special.add(i)
    else:
        decoder = byte_level_chars()
        added = backend.get_added_tokens_decoder()
        for i in range(tokenizer.vocab_size):
            tok = backend.id_to_token(i)
            if i in added:
                tokens.append(added[i].content.encode())
                if added[i].special:
                    special.add(i)
            elif tok is None:
                tokens.append(b"")
                special.add(i)
            else:
                try:
                    tokens.append(bytes(decoder[c] for c in tok))
                except KeyError:  # not a byte-level token: take its text
                    tokens.append(tok.encode())
    for i in range(len(tokens), size):
        tokens.append(f"<|reserved_{i}|>".encode())
        special.add(i)
    stops = tuple(tokenizer.stop_token_ids)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else stops[0]
    return Vocab(tokens, frozenset(special | set(stops)), stops, eos)
