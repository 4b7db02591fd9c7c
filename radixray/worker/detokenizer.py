"""Incremental detokenization with stop strings, for streaming.

Decoding the whole output on every token costs O(n^2) over a long answer. Instead, each step
decodes a short window (the standard prefix/read offsets): the text of ``ids[prefix:read]`` is
already released; decoding ``ids[prefix:]`` and taking what follows it gives the new text, with
the tokens before ``prefix`` giving context so that merges across token boundaries are right.
A window that ends in an incomplete UTF-8 sequence (a replacement character) waits for more
tokens. Text that could still grow into a stop string is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    def __init__(
        self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = (), min_tokens: int = 0
    ):
        self._decode = decode
        self.stop = stop
        self.min_tokens = min_tokens  # no stop string ends an output of fewer tokens (vLLM's)
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # decoded text so far (cut before a stop string once one is found)
        self.emitted = 0  # characters already released
        self.stopped = False
        self._prefix = 0  # token offsets of the decode window
        self._read = 0
        self._before = ""  # the text of output_ids[prefix:read]: unchanged until they move

    def update(self, output_ids: list[int]) -> str:
        """Take the output so far (one more token than last time, or more); return the text that
        can be released now. Sets ``stopped`` on a stop string (the text is cut before it)."""
        if self.stopped:
            return ""
        before = self._before
        window = self._decode(output_ids[self._prefix :])
        if len(window) > len(before) and not window.endswith("\ufffd"):
            self.text += window[len(before) :]
            self._prefix, self._read = self._read, len(output_ids)
            self._before = self._decode(output_ids[self._prefix : self._read])
        for s in self.stop if len(output_ids) > self.min_tokens else ():
            # A new match can only start in the part not yet released (or overlap its end).
            i = self.text.find(s, max(0, self.emitted - len(s) + 1))
            if i != -1:
                self.text = self.text[:i]
                self.stopped = True
                return self.flush()
        end = len(self.text) - self._hold if self.stop else len(self.text)
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def flush(self, output_ids: list[int] | None = None) -> str:
        """Release everything (the request ended). With ``output_ids``, text still waiting in
        the window (e.g. an incomplete character at the very end) is decoded as it is."""
        if output_ids is not None and not self.stopped and self._read < len(output_ids):
            window = self._decode(output_ids[self._prefix :])
            self.text += window[len(self._before) :]
            self._prefix = self._read = len(output_ids)
            self._before = ""
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta
