"""The engine's structured-output side, apart from the engine: a matcher per request at
admission, the batch's next-token bitmasks computed on a helper thread while the model runs, and
each sampled token fed back. The grammar library (``grammar.py``) is imported on the first
request that asks for a grammar, so an engine that never sees one never loads it."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from radixray.protocol import GrammarSpec, InvalidRequest

__all__ = ["StructuredOutput"]

log = logging.getLogger(__name__)


class StructuredOutput:
    def __init__(self, tokenizer, model_vocab_size: int):
        self._tokenizer = tokenizer
        self._vocab_size = model_vocab_size
        self._compiler = None  # grammar.GrammarCompiler, made on first use
        self._pool: ThreadPoolExecutor | None = None

    def matcher(self, spec: GrammarSpec | None):
        """A fresh matcher for ``spec`` (None without one); InvalidRequest naming
        response_format if the library rejects it."""
        if spec is None:
            return None
        if self._compiler is None:
            if self._tokenizer is None:
                raise InvalidRequest(
                    "structured output needs the model's tokenizer", "response_format"
                )
            from .grammar import GrammarCompiler  # the grammar library: worker-only, lazy

            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._compiler.matcher(spec.kind, spec.spec)

    def start_masks(self, matchers: list) -> tuple[list[int], Future] | None:
        """``matchers``: one per sampled row (None for a free row). Starts computing the grammar
        rows' bitmasks on the helper thread; returns (rows, future [len(rows), words]) or None."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        from .grammar import fill_bitmask

        ruled = [matchers[i] for i in rows]
        bitmask = self._compiler.new_bitmask(len(rows))
        return rows, self._pool.submit(lambda: fill_bitmask(ruled, bitmask) or bitmask)

    @staticmethod
    def sampler_kwargs(masks) -> dict:
        """The sampler's ``grammar_mask`` for a step's masks (waits for them), or nothing."""
        return {"grammar_mask": (masks[0], masks[1].result())} if masks else {}

    @staticmethod
    def advance(matcher, request_id: str, tok: int, reason: str | None) -> str | None:
        """Feeds the sampled token to ``matcher``; the finish reason, "stop" once the grammar
        is complete (nothing but a stop token could follow) or was left."""
        if matcher is None:
            return reason
        if not matcher.accept(tok) and reason is None:
            log.warning("request %s left its grammar: %s", request_id, matcher.error)
            return "stop"
        return "stop" if reason is None and matcher.done else reason
