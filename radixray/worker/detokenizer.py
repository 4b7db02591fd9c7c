"""Incremental detokenization with stop strings, for streaming.

Decoding the whole output on every token costs O(n^2) over a long answer. Instead, each step
decodes a short window (the standard prefix/read offsets): the text of ``ids[prefix:read]`` is
already released; decoding ``ids[prefix:]`` and taking what follows it gives the new text, with
the tokens before ``prefix`` giving context so that merges across token boundaries are right.
A window that ends in an incomplete UTF-8 sequence (a replacement character) waits for more
tokens. Text that could still grow into a stop string is held back until it cannot.

Where the tokenizer's ids map to bytes (``token_bytes.py``: checked at start-up to decode
exactly as the tokenizer does), a token is a table look-up and an incremental UTF-8 decode
instead of two ``decode`` calls: at batch 64 on the tiny model that was most of a step's
emitting. SentencePiece tokenizers (Llama 2, Mistral, Gemma) take it too; there a run of byte
pieces comes out when it ends, a stop string in it found then, at the latest by ``flush``.
``Detokenizers`` picks the path once per tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .token_bytes import TokenBytes, token_bytes

__all__ = ["TAIL_SLACK", "Detokenizers", "IncrementalDetokenizer"]

# Released text the tail keeps past what a stop search needs before moving it to the list.
TAIL_SLACK = 256


class IncrementalDetokenizer:
    """One output's text, released as it can be (``update`` each token, ``flush`` at the end).

    The text is kept as released pieces in a list (joined only when ``text`` is read) and a short
    ``_tail``: the part not yet released plus the longest stop string's length less one before
    it (and up to ``TAIL_SLACK`` more), all that the stop search and the hold-back look at. So a
    token costs O(its text + the longest stop), not a copy of the whole text (``text += piece``
    was quadratic over a long output)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stop: tuple[str, ...] = (),
        min_tokens: int = 0,
        table: TokenBytes | None = None,
    ):
        """``decode``: the tokenizer's. ``table``: its checked id -> bytes table, if it has one
        (then ``decode`` is not called)."""
        self._decode = decode
        self._bytes = table.stream() if table is not None else None
        self._texts = table.texts if table is not None else None  # (the common token, inline)
        self.stop = stop
        self.min_tokens = min_tokens  # no stop string ends an output of fewer tokens (vLLM's)
        self._hold = max((len(s) for s in stop), default=1) - 1
        # Once searched, a new match ends in the new text: none of the stops' last characters
        # in it, no search (most tokens). _searched: a search has run (min_tokens defers it).
        ends = "".join(sorted({s[-1] for s in stop})) if stop and all(stop) else ""
        self._ends = re.compile(f"[{re.escape(ends)}]") if ends else None
        self._searched = False
        self._done: list[str] = []  # the text before the tail, in pieces
        self._done_len = 0  # its length in characters
        self._tail = ""  # the text from _done_len on
        self.emitted = 0  # characters already released
        self.stopped = False
        self._prefix = 0  # token offsets of the decode window
        self._read = 0
        self._before = ""  # the text of output_ids[prefix:read]: unchanged until they move

    @property
    def text(self) -> str:
        """The text so far, released or not (cut before a stop string once one is found)."""
        if len(self._done) > 1:
            self._done = ["".join(self._done)]
        return (self._done[0] if self._done else "") + self._tail

    def update(self, output_ids: list[int]) -> str:
        """Take the output so far (one more token than last time, or more); return the text that
        can be released now. Sets ``stopped`` on a stop string (the text is cut before it)."""
        if self.stopped:
            return ""
        if self._bytes is not None:
            new = None
            if self._read == len(output_ids) - 1 and not self._bytes.waiting:
                new = self._texts[output_ids[-1]]  # one token of whole characters: mostly
            if new is None:
                new = self._bytes.text(output_ids, self._read)
            self._read = len(output_ids)
        else:
            new = self._decode_window(output_ids)
        if not self.stop:  # nothing is held back: all of it goes (the common case, short)
            self._done.append(new)
            self._done_len += len(new)
            self.emitted = self._done_len
            return new
        tail, base = self._tail + new, self._done_len
        if len(output_ids) > self.min_tokens and (
            not self._searched or self._ends is None or self._ends.search(new)
        ):
            self._searched = True
            for s in self.stop:
                # A new match can only start in the part not yet released (or overlap its end).
                i = tail.find(s, max(0, self.emitted - len(s) + 1 - base))
                if i != -1:
                    self._tail, self.stopped = tail[:i], True
                    return self.flush()
        end = base + len(tail) - self._hold
        if end > self.emitted:
            delta = tail[self.emitted - base : end - base]
            self.emitted = end
            cut = end - self._hold - base  # what no stop search looks at again: to the list
            if cut > TAIL_SLACK:  # in batches: an item a token costs more than a short copy
                self._done.append(tail[:cut])
                self._done_len, tail = base + cut, tail[cut:]
        else:
            delta = ""
        self._tail = tail
        return delta

    def _cut_at_stop(self, num_ids: int) -> bool:
        """Cut the text before the first stop string found (``stopped``); False if none."""
        if num_ids <= self.min_tokens:
            return False
        for s in self.stop:
            # A new match can only start in the part not yet released (or overlap its end).
            i = self._tail.find(s, max(0, self.emitted - len(s) + 1 - self._done_len))
            if i != -1:
                self._tail = self._tail[:i]
                self.stopped = True
                return True
        return False

    def _decode_window(self, output_ids: list[int]) -> str:
        before = self._before
        window = self._decode(output_ids[self._prefix :])
        if len(window) > len(before) and not window.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(output_ids)
            self._before = self._decode(output_ids[self._prefix : self._read])
            return window[len(before) :]
        return ""

    def flush(self, output_ids: list[int] | None = None) -> str:
        """Release everything (the request ended). With ``output_ids``, text still waiting (an
        incomplete character at the very end, a run of byte pieces) is decoded as it is, and a
        stop string in it cuts the text as in ``update``."""
        rest = ""
        if output_ids is not None and not self.stopped and self._bytes is not None:
            rest = self._bytes.text(output_ids, self._read) + self._bytes.end()
            self._read = len(output_ids)
        elif output_ids is not None and not self.stopped and self._read < len(output_ids):
            rest = self._decode(output_ids[self._prefix :])[len(self._before) :]
            self._prefix = self._read = len(output_ids)
            self._before = ""
        if rest:
            self._tail += rest
            if self.stop:
                self._cut_at_stop(len(output_ids))
        delta = self._tail[self.emitted - self._done_len :]
        self.emitted = self._done_len + len(self._tail)
        return delta


class Detokenizers:
    """Makes each request's ``IncrementalDetokenizer`` for one tokenizer (None: no text). The
    byte table is built and checked here, once per tokenizer (``token_bytes``)."""

    def __init__(self, tokenizer, vocab_size: int = 0):
        self.tokenizer = tokenizer
        self.table = token_bytes(tokenizer, vocab_size)
        self._decode = tokenizer.decode if tokenizer is not None else _no_text

    def __call__(self, req) -> IncrementalDetokenizer:
        p = req.params
        return IncrementalDetokenizer(self._decode, p.stop, p.min_tokens, self.table)


def _no_text(ids: list[int]) -> str:
    return ""
