"""Incremental detokenization with stop strings, for streaming.

Each step decodes the whole output (short for chat answers; correct across multi-byte
characters) and releases only text that cannot change: never a trailing replacement character
(an incomplete UTF-8 sequence) and never a suffix that could still grow into a stop string.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self._decode = decode
        self.stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # full text so far (truncated at a stop string once found)
        self.emitted = 0  # characters already released
        self.stopped = False

    def update(self, output_ids: list[int]) -> str:
        """Decode ``output_ids``; return newly releasable text. Sets ``stopped`` on a stop
        string (the text is cut before it)."""
        text = self._decode(output_ids)
        for s in self.stop:
            # Search only where a new match can start: the last emitted char onward.
            i = text.find(s, max(0, self.emitted - len(s)))
            if i != -1:
                self.text = text[:i]
                self.stopped = True
                return self.flush()
        self.text = text
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1
        end = max(self.emitted, end - self._hold) if self.stop else end
        delta = text[self.emitted : end]
        self.emitted = end
        return delta

    def flush(self) -> str:
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta
