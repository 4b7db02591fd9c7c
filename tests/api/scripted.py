"""A backend whose model answers every request with a given text (``ScriptedBackend``), so the
edge's parsing and answer shapes are checked exactly, whatever the tiny model would say; the
``scripted`` fixture (tests/api/conftest.py) serves it to the official client."""

from __future__ import annotations

from radixray.model_meta import load_model_meta
from radixray.protocol import StreamChunk

ANSWER = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
)


class _Stream:
    worker_id = "scripted"

    def __init__(self, text: str, pieces: int, prompt_tokens: int):
        size = max(1, len(text) // pieces)
        parts = [text[i : i + size] for i in range(0, len(text), size)]
        self._chunks = [StreamChunk([1], p) for p in parts[:-1]]
        self._chunks.append(StreamChunk([1], parts[-1], 0, "stop", prompt_tokens, len(parts), None))
        self.first = self._chunks[0]
        self.cached_tokens = 0

    async def __aiter__(self):
        for c in self._chunks:
            yield c

    async def aclose(self):
        pass


class ScriptedBackend:
    """Answers every request with ``text``, in ``pieces`` chunks; keeps the prompts it saw."""

    max_tokens_limit = 4096
    retry_after_s = 1

    def __init__(self, text: str, pieces: int = 13):
        self.meta = load_model_meta("tiny")
        self.text, self.pieces = text, pieces
        self.prompts: list[list[int]] = []
        self.grammars: list = []  # each request's SamplingParams.grammar

    async def open(self, req, session_key, cache_key=None):
        self.prompts.append(list(req.prompt_ids))
        self.grammars.append(req.params.grammar)
        return _Stream(self.text, self.pieces, len(req.prompt_ids))
