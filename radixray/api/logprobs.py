"""Logprobs in OpenAI's shapes, from the workers' ``TokenLogprob`` entries.

* /v1/completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one entry
  per token; ``top_logprobs`` is a ``{token: logprob}`` dict of the k most likely tokens and the
  sampled one (OpenAI: up to k + 1); an echoed prompt's first token has null for both.
* /v1/chat/completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.

A token's text is its id decoded alone (special tokens kept), as vLLM shows it; ``bytes`` is
that text in UTF-8 (a token that is part of a character decodes to U+FFFD). A log-probability
of -inf (a token the model rules out) is sent as -9999.0, since JSON has no infinities.
"""

from __future__ import annotations

import math

from radixray.protocol import TokenLogprob

__all__ = ["LogprobFormatter"]

_FLOOR = -9999.0


def _finite(x: float) -> float:
    return x if math.isfinite(x) else _FLOOR


class LogprobFormatter:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        t = self._texts.get(token_id)
        if t is None:
            t = self._texts[token_id] = self._tokenizer.decode(
                [token_id], skip_special_tokens=False
            )
        return t

    def completion(
        self, token_ids: list[int], entries: list[TokenLogprob | None], offset: int = 0
    ) -> tuple[dict, int]:
        """The completions shape of ``token_ids`` with their entries (None: no logprob, an
        echoed prompt's first token), text offsets from ``offset``; and the offset after."""
        tokens, values, tops, offsets = [], [], [], []
        for tok, e in zip(token_ids, entries, strict=True):
            text = self.text(tok)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if e is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(_finite(e.logprob))
            top: dict[str, float] = {}
            for t, v in zip(e.top_ids, e.top_logprobs, strict=True):
                top.setdefault(self.text(t), _finite(v))  # two ids of one text: the likelier
            top.setdefault(text, _finite(e.logprob))
            tops.append(top)
        out = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}
        out["text_offset"] = offsets
        return out, offset

    def _item(self, token_id: int, logprob: float) -> dict:
        text = self.text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    def chat(self, token_ids: list[int], entries: list[TokenLogprob]) -> dict:
        """The chat shape of ``token_ids`` with their entries."""
        content = []
        for tok, e in zip(token_ids, entries, strict=True):
            item = self._item(tok, e.logprob)
            item["top_logprobs"] = [
                self._item(t, v) for t, v in zip(e.top_ids, e.top_logprobs, strict=True)
            ]
            content.append(item)
        return {"content": content, "refusal": None}
