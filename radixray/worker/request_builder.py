"""From what a caller sends (a prompt, sampling parameters, an id) to a scheduler ``Request``.

The worker's half of "validate once at the edge and once at decode": the router's edge already
refused what it could see (types, ranges, the context length), the codec checked every field's
type; what is left is what only this worker knows, its vocabulary and its context length. The
context-length rule is the edge's own (``radixray.protocol.rules``): refuse, never cut short.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from radixray.cache_index import hash_blocks
from radixray.model_meta import TokenizerProtocol
from radixray.protocol import InvalidRequest, SamplingParams
from radixray.protocol.rules import check_context, check_sampling_tokens, check_token_ids

from .request import Request

__all__ = ["RequestBuilder", "Prompt"]

Prompt = str | Sequence[int]


class RequestBuilder:
    def __init__(
        self,
        tokenizer: TokenizerProtocol | None,
        vocab_size: int,
        max_model_len: int,
        page_size: int,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.page_size = page_size
        self._ids = itertools.count()

    def token_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("this model has no tokenizer: pass token ids", "prompt")
            return self.tokenizer.encode(prompt)
        ids = list(prompt)
        check_token_ids(ids, self.vocab_size)
        return ids

    def build(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = self.token_ids(prompt)
        if not ids:
            raise InvalidRequest("prompt must not be empty", "prompt")
        check_context(len(ids), params.max_tokens, self.max_model_len)
        check_sampling_tokens(params, self.vocab_size)
        return Request(
            request_id=request_id if request_id is not None else f"req-{next(self._ids)}",
            prompt_ids=ids,
            params=params,
            block_hashes=hash_blocks(ids, self.page_size, extra_key=extra_key),
            extra_key=extra_key,
            arrival_time=time.monotonic(),
        )
