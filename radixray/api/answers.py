"""The shapes of an answer: a /v1/completions one (``TextAnswer``) and a /v1/chat/completions
one (``ChatAnswer``), streamed as chunks or whole, with one choice per prompt and sample."""

from __future__ import annotations

import json
import os
import time
from json.encoder import encode_basestring_ascii

from radixray.protocol import StreamChunk

from . import schemas as oa
from .logprobs import LogprobFormatter
from .tool_calls import ToolCallParser, ToolCallStream

__all__ = ["Answer", "ChatAnswer", "TextAnswer", "event"]


def event(obj: dict) -> bytes:
    """One SSE event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


_SLOT = "\x01radixray-text\x01"


class Answer:
    """The shape of one answer. A mid-stream text chunk is the one event sent per token: it is
    rendered once per choice with a placeholder (the same builder as every other chunk), and
    each token's text is escaped into it (``text_event``), instead of building and serializing
    a dict.

    Choices: sample j of prompt i is choice ``i * n + j`` (OpenAI's order).
    ``prompt_ids`` (``return_token_ids``), one list per prompt: each choice carries its prompt's
    token ids once (in its first chunk when streaming) and every chunk its tokens' ids; such
    chunks are built as dicts."""

    def __init__(
        self,
        kind: str,
        model: str,
        prompt_ids: list[list[int]] | None = None,
        logprobs: LogprobFormatter | None = None,
        n: int = 1,
    ):
        self.n = n  # samples per prompt
        self.opening: list[dict] = []  # chunks streamed before any token (chat's roles)
        self.lp = logprobs  # set when the request asked for logprobs
        self.id = f"{kind}-{os.urandom(16).hex()}"  # as random as uuid4().hex, 1/6 the CPU
        self.model = model
        self.created = int(time.time())
        self.with_ids = prompt_ids is not None
        self.prompt_ids = prompt_ids
        self._prompt_sent: set[int] = set()
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def request_id(self, prompt_index: int) -> str:
        """The id of prompt ``prompt_index``'s request (the answer's own id for a lone one)."""
        return self.id if prompt_index == 0 else f"{self.id}-{prompt_index}"

    def index(self, prompt_index: int, sample: int = 0) -> int:
        return prompt_index * self.n + sample

    def text_event(self, text: str, index: int = 0) -> bytes:
        template = self._templates.get(index)
        if template is None:  # only used without ids, so the chunk carries none
            rendered = event(self.chunk(_SLOT, None, None, index))
            head, tail = rendered.split(json.dumps(_SLOT).encode())
            template = self._templates[index] = (head, tail)
        return template[0] + encode_basestring_ascii(text).encode() + template[1]

    def _stream_ids(
        self, index: int, token_ids: list[int] | None
    ) -> tuple[list[int] | None, list[int] | None]:
        """A streamed chunk's (prompt ids, token ids): the prompt's only on its choice's first."""
        if not self.with_ids:
            return None, None
        prompt = None
        if index not in self._prompt_sent:
            self._prompt_sent.add(index)
            prompt = self.prompt_ids[index // self.n]
        return prompt, list(token_ids or ())

    def needs_dict(self, index: int) -> bool:
        """Whether choice ``index``'s next chunk is built as a dict (not the text template)."""
        return self.with_ids or self.lp is not None

    def plain(self) -> bool:
        """Whether every mid-stream chunk of every choice is its text alone (``text_event``):
        no ids, logprobs, echo or tools; the per-token path then asks nothing else."""
        return not self.with_ids and self.lp is None

    @staticmethod
    def _by_index(choices: list[tuple], finals: list[StreamChunk] | None) -> list[tuple]:
        """Each ``(index, text, token ids, finish reason)`` choice with its final chunk (None
        without them), in index order: what ``response`` builds its choices from."""
        finals = finals or [None] * len(choices)
        return sorted(zip(choices, finals, strict=True), key=lambda c: c[0][0])

    def chunk(
        self,
        text: str,
        reason: str | None,
        token_ids: list[int] | None = None,
        index: int = 0,
        c: StreamChunk | None = None,
    ) -> dict:
        raise NotImplementedError


class TextAnswer(Answer):
    """The shape of a /v1/completions answer. ``echo``: each prompt's text, put before its
    completion (and, with logprobs, its tokens' logprobs before the completion's)."""

    def __init__(
        self,
        model: str,
        prompt_ids: list[list[int]] | None = None,
        logprobs: LogprobFormatter | None = None,
        echo: list[str] | None = None,
        echo_ids: list[list[int]] | None = None,
        n: int = 1,
    ):
        super().__init__("cmpl", model, prompt_ids, logprobs, n)
        self.echo = echo
        self.echo_ids = echo_ids
        self._echoed: set[int] = set()
        self._offsets: dict[int, int] = {}  # choice -> text_offset of its next token

    def needs_dict(self, index: int) -> bool:
        return super().needs_dict(index) or (self.echo is not None and index not in self._echoed)

    def plain(self) -> bool:
        return super().plain() and self.echo is None

    def _logprobs(self, index: int, c: StreamChunk, echo: bool) -> dict | None:
        """The completions logprobs of chunk ``c`` (its prompt's first when ``echo``)."""
        if self.lp is None or c.logprobs is None:
            return None
        ids, entries = list(c.token_ids), list(c.logprobs)
        if echo and c.prompt_logprobs is not None:
            ids = self.echo_ids[index // self.n] + ids
            entries = list(c.prompt_logprobs) + entries
        out, self._offsets[index] = self.lp.completion(ids, entries, self._offsets.get(index, 0))
        return out

    def chunk(
        self,
        text: str,
        reason: str | None,
        token_ids: list[int] | None = None,
        index: int = 0,
        c: StreamChunk | None = None,
    ) -> dict:
        prompt, ids = self._stream_ids(index, token_ids)
        echo = self.echo is not None and index not in self._echoed
        if echo:
            self._echoed.add(index)
            text = self.echo[index // self.n] + text
        lps = self._logprobs(index, c, echo) if c is not None else None
        return oa.completion_chunk(
            self.id, self.model, text, reason, None, self.created, prompt, ids, index, lps
        )

    def usage_chunk(self, use: dict) -> dict:
        c = oa.completion_chunk(self.id, self.model, "", None, use, created=self.created)
        c["choices"] = []
        return c

    def response(
        self,
        choices: list[tuple[int, str, list[int], str]],
        use: dict,
        finals: list[StreamChunk] | None = None,
    ) -> dict:
        """The whole answer from its ``(index, text, token ids, finish reason)`` choices;
        ``finals``: each choice's final chunk carrying all its logprobs (``streams.collect``)."""
        out = []
        for (index, text, token_ids, reason), final in self._by_index(choices, finals):
            prompt = self.prompt_ids[index // self.n] if self.with_ids else None
            ids = token_ids if self.with_ids else None
            lps = None
            if final is not None:
                lps = self._logprobs(index, final, self.echo is not None)
            if self.echo is not None:
                text = self.echo[index // self.n] + text
            out.append(oa.completion_choice(index, text, reason, prompt, ids, lps))
        return oa.completion_response(self.id, self.model, out, use)


class ChatAnswer(Answer):
    """The shape of a /v1/chat/completions answer (a first chunk names the role). With a
    ``tools`` parser, the answer's text is read for tool calls (``tool_calls.py``): whole, or
    streamed as OpenAI's tool-call deltas (``tool_event``)."""

    def __init__(
        self,
        model: str,
        prompt_ids: list[list[int]] | None = None,
        logprobs: LogprobFormatter | None = None,
        tools: ToolCallParser | None = None,
        n: int = 1,
    ):
        super().__init__("chatcmpl", model, prompt_ids, logprobs, n)
        self.tools = tools
        self._tool_streams: dict[int, ToolCallStream] = {}
        # A role chunk per choice; the first carries the prompt's ids (beside the choices,
        # chat's place for them).
        self.opening = [
            oa.chat_chunk(
                self.id,
                model,
                {"role": "assistant", "content": ""},
                None,
                created=self.created,
                prompt_token_ids=prompt_ids[0] if prompt_ids and j == 0 else None,
                token_ids=[] if self.with_ids else None,
                index=j,
            )
            for j in range(n)
        ]

    def chunk(
        self,
        text: str,
        reason: str | None,
        token_ids: list[int] | None = None,
        index: int = 0,
        c: StreamChunk | None = None,
    ) -> dict:
        delta = {"content": text} if text else {}
        ids = list(token_ids or ()) if self.with_ids else None
        lps = None
        if self.lp is not None and c is not None and c.logprobs is not None:
            lps = self.lp.chat(list(c.token_ids), list(c.logprobs))
        return oa.chat_chunk(
            self.id,
            self.model,
            delta,
            reason,
            created=self.created,
            token_ids=ids,
            index=index,
            logprobs=lps,
        )

    def usage_chunk(self, use: dict) -> dict:
        return oa.chat_chunk(
            self.id, self.model, {}, None, use, with_choice=False, created=self.created
        )

    def response(
        self,
        choices: list[tuple[int, str, list[int], str]],
        use: dict,
        finals: list[StreamChunk] | None = None,
    ) -> dict:
        out = []
        for (index, text, token_ids, reason), final in self._by_index(choices, finals):
            lps = None
            if self.lp is not None and final is not None and final.logprobs is not None:
                lps = self.lp.chat(token_ids, list(final.logprobs))
            calls = None
            if self.tools is not None:
                text, calls = self.tools.parse(text)
                reason = _reason(reason, calls)
            ids = token_ids if self.with_ids else None
            out.append(oa.chat_choice(index, text, reason, ids, lps, calls))
        prompt = self.prompt_ids[0] if self.with_ids else None
        return oa.chat_response(self.id, self.model, out, use, prompt)

    def plain(self) -> bool:
        return super().plain() and self.tools is None

    def tool_event(self, index: int, text: str, reason: str | None, token_ids) -> bytes | None:
        """The events of one streamed chunk read for tool calls: content and tool-call deltas
        (several events in one), the finish reason on the last (``tool_calls`` if any)."""
        stream = self._tool_streams.get(index)
        if stream is None:
            stream = self._tool_streams[index] = self.tools.stream()
        deltas = stream.feed(text) if text else []
        if reason is not None:
            deltas += stream.finish()
        ids = list(token_ids or ()) if self.with_ids else None
        events = []
        for d in deltas:
            c = oa.chat_chunk(self.id, self.model, d, None, created=self.created, index=index)
            events.append(event(c))
        if reason is not None or (ids and not events):
            reason = _reason(reason, [None] * stream.calls) if reason else None
            c = oa.chat_chunk(
                self.id, self.model, {}, reason, created=self.created, token_ids=ids, index=index
            )
            events.append(event(c))
        elif ids:  # the tokens' ids ride on the chunk's first event
            first = json.loads(events[0][6:])
            first["choices"][0]["token_ids"] = ids
            events[0] = event(first)
        return b"".join(events) or None


def _reason(reason: str, calls: list) -> str:
    """OpenAI's finish reason for an answer that called tools: ``tool_calls``."""
    return "tool_calls" if calls and reason == "stop" else reason
