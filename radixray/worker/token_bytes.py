"""Each token id's bytes, so that detokenizing a token is a look-up, not a ``decode`` call.

The tokenizers served here decode an output from its tokens' bytes (or pieces), in one of three
ways this module repeats by table look-up:

* ``ByteTokenizer`` (the tiny model): ids 0-255 are the bytes; a special token (skipped) ends
  a run of bytes, so an incomplete character before it decodes as U+FFFD there (``BREAK``);
* a byte-level BPE (``BPETokenizer`` with a ``ByteLevel`` decoder: SmolLM2, Llama 3, Qwen):
  each token's string maps back to bytes through GPT-2's byte <-> character table (a token with
  a character outside the table is its own UTF-8, as the ``tokenizers`` decoder does); a special
  token is dropped (``skip_special_tokens``) without ending anything;
* a SentencePiece-style decoder (Llama 2, Mistral, Gemma, Phi-3: ``Replace("▁", " ")``, then
  ``ByteFallback``, ``Fuse`` and, where the model adds a dummy prefix, ``Strip`` of one leading
  space; or a ``Metaspace`` decoder): each piece is its text with ``▁`` as a space, a ``<0xNN>``
  piece is a byte. Two rules make these differ from plain bytes, and ``PieceStream`` keeps both:
  a run of byte pieces decodes as UTF-8 only when the whole run is valid, else each of its bytes is
  U+FFFD (so a run's text is released when the run ends: a later byte can still spoil it); and the
  decode of an output alone drops the space its first piece starts with (``Strip``: the first
  character of the text, if a space; ``Metaspace``: every ``▁`` of the first piece).

``token_bytes`` builds that table once per tokenizer (cached while the tokenizer lives) and
keeps it only if it decodes exactly as the tokenizer does: every single id, every prefix of a few
probe texts' ids (characters cut between tokens, spaces before punctuation, which a
``clean_up_tokenization_spaces`` would change) and a few hundred random sequences, half their ids
from the awkward ones (a partial character, special, empty). A tokenizer that differs anywhere
(another decoder, or a wrapper that cleans up spaces) gets ``None``: the detokenizer then decodes
windows of ids as before.
"""

from __future__ import annotations

import codecs
import json
import logging
import random
import re
import weakref
from collections.abc import Callable, Sequence

from .grammar_vocab import byte_level_chars

__all__ = ["BREAK", "ByteStream", "PieceStream", "TokenBytes", "TokenPieces", "token_bytes"]

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


class TokenPieces(TokenBytes):
    """A SentencePiece-style tokenizer's table: each id's piece text (``▁`` already a space), an
    int for a ``<0xNN>`` byte piece, None for an id its decode skips (special or unknown);
    ``texts``: the piece text, None for a byte piece, "" for a skipped id. ``lead``: how the
    decode of a whole output treats its start: "space" (``Strip``: one leading space dropped),
    "first" (``Metaspace``: the first piece's text is ``first[id]``, its ``▁`` all dropped) or
    None."""

    def __init__(self, table: list, lead: str | None = None, first: list[str] | None = None):
        self.table, self.lead, self.first = table, lead, first
        self.texts = [e if type(e) is str else "" if e is None else None for e in table]

    def stream(self) -> PieceStream:
        return PieceStream(self)


class PieceStream:
    """One output's text from a ``TokenPieces`` table, with ``ByteStream``'s interface. A run of
    byte pieces is held until a piece or the end closes it (a skipped id does not): only then is
    it known whether the run is valid UTF-8 (its text) or not (one U+FFFD a byte, as the
    ``ByteFallback`` decoder does). ``waiting`` is truthy while the next token's text is not just
    its ``texts`` entry: a run is open or the output's start is still to come."""

    __slots__ = ("_table", "_texts", "_first", "_strip", "_run", "waiting")

    def __init__(self, table: TokenPieces):
        self._table, self._texts = table.table, table.texts
        self._first = table.first if table.lead == "first" else None
        self._strip = table.lead == "space"
        self._run = bytearray()
        self.waiting = table.lead is not None

    def text(self, ids: Sequence[int], start: int = 0) -> str:
        """The text the tokens ``ids[start:]`` (the next ones of the output) complete."""
        out = []
        table = self._table
        for k in range(start, len(ids)):
            e = table[ids[k]]
            if e is None:  # skipped: no text, and a run of bytes goes on across it
                continue
            if type(e) is int:
                self._run.append(e)
                continue
            if self._run:
                out.append(self._close_run())
            if self._first is not None:  # the output's first piece (Metaspace)
                e, self._first = self._first[ids[k]], None
            out.append(e)
        return self._lead("".join(out))

    def end(self) -> str:
        """The output ended: an open run of bytes is closed."""
        return self._lead(self._close_run()) if self._run else ""

    def _close_run(self) -> str:
        run, self._run = bytes(self._run), bytearray()
        try:
            return run.decode()
        except UnicodeDecodeError:
            return "\ufffd" * len(run)

    def _lead(self, text: str) -> str:
        if self._strip and text:  # the output's first character, if a space, goes (Strip)
            self._strip = False
            text = text[1:] if text[0] == " " else text
        self.waiting = bool(self._run) or self._strip or self._first is not None
        return text


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
    if backend is None or backend.decoder is None:
        return None
    try:
        spec = json.loads(backend.decoder.__getstate__())
    except Exception:  # a decoder that does not serialize (a custom one): no table for it
        return None
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    if spec.get("type") != "ByteLevel":
        rules = _piece_rules(spec)
        return None if rules is None else _pieces(backend, size, special, *rules)
    to_byte = byte_level_chars()
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


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _piece_rules(spec: dict) -> tuple[str, bool, str | None] | None:
    """A SentencePiece-style decoder's rules from its JSON: (the piece's space character, whether
    ``<0xNN>`` pieces are bytes, the lead rule for ``TokenPieces``), or None for another decoder.
    Taken: ``Metaspace``; ``Sequence`` of ``Replace("▁", " ")`` then any of ``ByteFallback``,
    ``Fuse``, ``Strip(" ", 1, 0)`` in that order, the strip after a fuse (else it is per piece)."""
    if spec.get("type") == "Metaspace":
        scheme = spec.get("prepend_scheme", "always" if spec.get("add_prefix_space") else "never")
        return spec["replacement"], False, None if scheme == "never" else "first"
    steps = spec.get("decoders") if spec.get("type") == "Sequence" else None
    if not steps or steps[0] != {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}:
        return None
    kinds = [d["type"] for d in steps[1:]]
    order = ["ByteFallback", "Fuse", "Strip"]
    if any(k not in order for k in kinds) or kinds != sorted(kinds, key=order.index):
        return None
    strip = steps[-1] if "Strip" in kinds else None
    if strip and (
        "Fuse" not in kinds or (strip["content"], strip["start"], strip["stop"]) != (" ", 1, 0)
    ):
        return None
    return "▁", "ByteFallback" in kinds, "space" if "Strip" in kinds else None


def _pieces(backend, size: int, special: set[int], space: str, byte_fallback: bool, lead):
    """The ``TokenPieces`` of a SentencePiece-style ``backend`` over ids ``0 .. size - 1``."""
    table: list[str | int | None] = []
    first: list[str] | None = [] if lead == "first" else None
    for i in range(size):
        tok = backend.id_to_token(i)
        if tok is None or i in special:
            table.append(None)
        elif byte_fallback and _BYTE_PIECE.fullmatch(tok):
            table.append(int(tok[3:5], 16))
        else:
            table.append(tok.replace(space, " "))
        if first is not None:
            first.append(tok.replace(space, "") if tok is not None else "")
    return TokenPieces(table, lead, first)


def _differs(tokenizer, table: TokenBytes, size: int, seed: int = 0) -> str | None:
    """Why ``table`` does not decode as ``tokenizer`` (the first sequence that differs), or
    None when every check agrees."""
    decode: Callable[[list[int]], str] = tokenizer.decode
    awkward = []
    for i in range(size):
        want = decode([i])
        if table.decode([i]) != want:
            return f"id {i} decodes to {want!r}"
        if not want or "\ufffd" in want or table.texts[i] in ("", None):
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
