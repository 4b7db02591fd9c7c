"""What the OpenAI edge serves from: the router (many workers) or one worker's own engine.

The edge parses, tokenizes and validates a request, builds the typed ``GenerateRequest`` and
asks its backend to open a stream; everything after that (which worker, retries, the cache)
is the backend's business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from radixray.model_meta import ModelMeta
from radixray.protocol import GenerateRequest, StreamChunk

__all__ = ["Backend", "TokenStream"]


class TokenStream(Protocol):
    """An opened request: its first chunk has arrived (so errors before the first token were
    answered with a status code), the rest follow. ``aclose()`` before the end aborts it; it is
    called exactly once, at the end or when the client leaves."""

    worker_id: str
    first: StreamChunk  # the first chunk (the whole answer when it is final)

    @property
    def cached_tokens(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[StreamChunk]: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    meta: ModelMeta
    max_tokens_limit: int  # the largest max_tokens a request may ask for
    retry_after_s: int  # what a 429 / 503 tells clients to wait

    async def open(
        self, req: GenerateRequest, session_key: str | None, cache_key: str | None = None
    ) -> TokenStream:
        """Start ``req``; return once its first chunk is there. ``session_key``: the client's
        session (``prompt_cache_key``, else ``user``); ``cache_key``: its ``prompt_cache_key``
        (``serve_path.session_key``). Raises ``RequestError`` (its
        kind sets the HTTP status) when it cannot."""
        ...
