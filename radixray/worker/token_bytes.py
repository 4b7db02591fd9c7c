"""Each token id's bytes, so that detokenizing a token is a look-up, not a ``decode`` call.

The tokenizers served here decode an output as the UTF-8 of its tokens' bytes joined:

* ``ByteTokenizer`` (the tiny model): ids 0-255 are the bytes; a special token (skipped) ends
  a run of bytes, so an incomplete character before it decodes as U+FFFD there (``BREAK``);
* a byte-level BPE (``BPETokenizer`` with a ``ByteLevel`` decoder: SmolLM2, Llama 3, Qwen):
  each token's string maps back to bytes through GPT-2's byte <-> character table (a token with
  a character outside the table is its own UTF-8, as the ``tokenizers`` decoder does); a special
  token is dropped (``skip_special_tokens``) without ending anything.

``token_bytes`` builds that table once per tokenizer (cached while the tokenizer lives) and
keeps it only if it decodes exactly as the tokenizer does: every single id, every prefix of a few
probe texts' ids (characters cut between tokens, spaces before punctuation, which a
``clean_up_tokenization_spaces`` would change) and a few hundred random sequences, half their ids
from the awkward ones (a partial character, special, empty). A tokenizer that differs anywhere
(another decoder, such as SentencePiece's with its leading-space rule, or a wrapper that cleans
up spaces) gets ``None``: the detokenizer then decodes windows of ids as before.
"""

from __future__ import annotations

import codecs
import logging
import random
import weakref
from collections.abc import Callable, Sequence

__all__ = ["BREAK", "ByteStream", "TokenBytes", "token_bytes"]

log = logging.getLogger(__name__)

BREAK = None  # a table entry: ends the run of bytes (an incomplete character there is U+FFFD)

# Texts whose ids' prefixes the check decodes: multi-byte characters cut between tokens, spaces
# before punctuation and contractions, leading spaces and newlines.
PROBES = (
    "Hello , world . It 's n't ? ! : ; a - b",
    " héllo wörld — ünïcödé ✓ 漢字テスト 🙂👍🏽 Ωμέγα",
    "\n\n  indented\tcode() { return x ; }\r\n",
)
RANDOM_SEQUENCES = 300  # random sequences of 2-12 ids in the check (a few ms a tokenizer)

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ByteStream:
    """One output's text from its token ids, a table look-up a token: a token whose bytes are
    whole characters (most) is its text; one that leaves or completes an incomplete character
    goes through a UTF-8 decode with the bytes still waiting."""

    __slots__ = ("_table", "_texts", "waiting")

    def __init__(self, table: TokenBytes):
        self._table, self._texts = table.table, table.texts
        self.waiting = b""  # the bytes of an incomplete character so far (others read it)

    def text(self, ids: Sequence[int], start: int = 0) -> str:
        """The text the tokens ``ids[start:]`` (the next ones of the output) complete."""
        if start == len(ids) - 1 and not self.waiting:  # one token, nothing waiting: mostly
            whole = self._texts[ids[start]]
            if whole is not None:
                return whole
        out = ""
        for k in range(start, len(ids)):
            i = ids[k]
            if not self.waiting:
                whole = self._texts[i]
                if whole is not None:
                    out += whole
                    continue
            b = self._table[i]
            if b is BREAK:
                out += self.end()
            else:
                data = self.waiting + b
                text, used = codecs.utf_8_decode(data, "replace", False)
                self.waiting = data[used:]
                out += text
        return out

    def end(self) -> str:
        """The output ended (or a ``BREAK``): bytes still waiting as U+FFFD."""
        text = codecs.utf_8_decode(self.waiting, "replace", True)[0] if self.waiting else ""
        self.waiting = b""
        return text


class TokenBytes:
    """A tokenizer's id -> bytes table (``BREAK`` where a token ends a run of bytes), checked
    against its ``decode``; ``texts``: each id's text where its bytes decode whole on their own
    (so whatever follows cannot change them), else None. ``stream()`` starts one output."""

    def __init__(self, table: list[bytes | None]):
        self.table = table
        self.texts: list[str | None] = [_whole(b) for b in table]

    def stream(self) -> ByteStream:
        return ByteStream(self)

    def decode(self, ids: Sequence[int]) -> str:
        """The whole text of ``ids``, as a stream releases it (the check compares this)."""
        s = self.stream()
        return s.text(ids) + s.end()


def _whole(b: bytes | None) -> str | None:
    """``b``'s text if a UTF-8 decode takes all of it (no character left incomplete at its end);
    a ``BREAK`` is no text (nothing waits before it when this is used)."""
    if b is BREAK:
        return ""
    text, used = codecs.utf_8_decode(b, "replace", False)
    return text if used == len(b) else None


def token_bytes(tokenizer, vocab_size: int = 0) -> TokenBytes | None:
    """``tokenizer``'s checked table over ids ``0 .. max(vocab_size, its own) - 1``, or None
    where its ids cannot be decoded by look-up exactly as ``tokenizer.decode`` does. Built once
    per tokenizer object and size (a decode of each id: ~0.1 s for a 50k vocabulary)."""
    if tokenizer is None:
        return None
    from radixray.model_meta.byte_tokenizer import ByteTokenizer

    key = max(vocab_size, getattr(tokenizer, "vocab_size", 0))
    # every ByteTokenizer decodes alike: one table for them all (a test builds many engines)
    owner = ByteTokenizer if type(tokenizer) is ByteTokenizer else tokenizer
    try:
        per_size = _cache.setdefault(owner, {})
    except TypeError:  # not weakly referable: build each time
        per_size = {}
    if key not in per_size:
        table = _build(tokenizer, key)
        why = "no byte table for it" if table is None else _differs(tokenizer, table, key)
        per_size[key] = None if why else table
        if why:
            log.info("detokenizing %s by decode windows: %s", type(tokenizer).__name__, why)
    return per_size[key]


def _build(tokenizer, size: int) -> TokenBytes | None:
    from radixray.model_meta.byte_tokenizer import ByteTokenizer

    if type(tokenizer) is ByteTokenizer:
        specials = set(tokenizer.SPECIAL_TOKENS.values())
        return TokenBytes(
            [bytes((i,)) if i < 256 else BREAK if i in specials else b"" for i in range(size)]
        )
    backend = getattr(tokenizer, "_tok", None)  # a BPETokenizer's tokenizers.Tokenizer
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    to_byte = _byte_level_chars()
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    table: list[bytes | None] = []
    for i in range(size):
        tok = backend.id_to_token(i)
        if tok is None or i in special:
            table.append(b"")  # no such token, or one skip_special_tokens drops
        elif all(c in to_byte for c in tok):
            table.append(bytes(to_byte[c] for c in tok))
        else:  # a character outside the table: the decoder takes the token's own UTF-8
            table.append(tok.encode())
    return TokenBytes(table)


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 bytes are their own
    character; the others (controls, space, 0x7F-0xA0, 0xAD) take 256, 257, ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in keep}
    others = [b for b in range(256) if b not in set(keep)]
    chars.update({chr(256 + n): b for n, b in enumerate(others)})
    return chars


def _differs(tokenizer, table: TokenBytes, size: int, seed: int = 0) -> str | None:
    """Why ``table`` does not decode as ``tokenizer`` (the first sequence that differs), or
    None when every check agrees."""
    decode: Callable[[list[int]], str] = tokenizer.decode
    awkward = []
    for i in range(size):
        want = decode([i])
        if table.decode([i]) != want:
            return f"id {i} decodes to {want!r}"
        if not want or "\ufffd" in want or table.table[i] is BREAK:
            awkward.append(i)
    for text in PROBES:
        ids = tokenizer.encode(text)
        for n in range(1, len(ids) + 1):
            if table.decode(ids[:n]) != decode(ids[:n]):
                return f"ids {ids[:n]} decode to {decode(ids[:n])!r}"
    rng = random.Random(seed)
    for _ in range(RANDOM_SEQUENCES):
        ids = [
            rng.choice(awkward) if awkward and rng.random() < 0.5 else rng.randrange(size)
            for _ in range(rng.randint(2, 12))
        ]
        if table.decode(ids) != decode(ids):
            return f"ids {ids} decode to {decode(ids)!r}"
    return None
