"""The streams of one request: every prompt's request opened at once (all or nothing), then
either collected to their ends (one JSON answer) or merged as they come into one SSE answer,
each chunk under its choice's index, with one usage and one [DONE] for all of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from fastapi import Request

from radixray.protocol import GenerateRequest, RequestError, StreamChunk

from . import schemas as oa
from .answers import Answer, event
from .backend import Backend, TokenStream
from .errors import ApiError, api_error, error_body

__all__ = ["collect", "open_all", "sse_events", "usage_of"]

# How often a non-streaming request checks that its client is still there.
_DISCONNECT_POLL_S = 0.25


async def open_all(
    backend: Backend,
    reqs: list[GenerateRequest],
    session_key: str | None,
    cache_key: str | None = None,
) -> list[TokenStream]:
    """Open every request at once. If any cannot be opened, or the caller is cancelled (the
    client left) meanwhile, close (abort) the opened ones and raise the first failure."""
    if len(reqs) == 1:  # the common case, without tasks
        return [await _open(backend, reqs[0], session_key, cache_key)]
    tasks = [asyncio.ensure_future(_open(backend, r, session_key, cache_key)) for r in reqs]
    failed: BaseException | None = None
    try:
        await asyncio.wait(tasks)
    except BaseException as e:  # cancelled: stop opening the rest
        failed = e
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks)
    opened = []
    for t in tasks:
        if t.cancelled():
            continue
        if t.exception() is not None:
            failed = failed or t.exception()
        else:
            opened.append(t.result())
    if failed is None:
        return opened
    for stream in opened:
        await stream.aclose()
    raise failed


async def _open(
    backend: Backend, req: GenerateRequest, session_key: str | None, cache_key: str | None
) -> TokenStream:
    try:
        return await backend.open(req, session_key, cache_key)
    except RequestError as e:
        raise api_error(e, backend.retry_after_s) from None


def usage_of(ends: list[StreamChunk]) -> dict:
    """Usage of a request from its samples' last chunks: each prompt's tokens once (every
    sample of a prompt reports them: its sample 0 counts), every completion's tokens."""
    firsts = [f for f in ends if f.index == 0]
    return oa.usage(
        sum(f.prompt_tokens for f in firsts),
        sum(f.completion_tokens for f in ends),
        sum(f.cached_tokens for f in firsts),
    )


Sample = tuple[int, str, list[int], StreamChunk]  # index, text, token ids, last chunk


class _Gathered:
    """One sample's chunks, gathered: its text, token ids and logprobs."""

    def __init__(self):
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list | None = None
        self.prompt_logprobs = None

    def add(self, c: StreamChunk) -> None:
        self.parts.append(c.text)
        self.token_ids.extend(c.token_ids)
        if c.logprobs is not None:
            self.logprobs = self.logprobs if self.logprobs is not None else []
            self.logprobs.extend(c.logprobs)
        if c.prompt_logprobs is not None:
            self.prompt_logprobs = c.prompt_logprobs

    def sample(self, last: StreamChunk) -> Sample:
        """With logprobs, the last chunk carries all the tokens, their logprobs and the
        prompt's."""
        if self.logprobs is not None or self.prompt_logprobs is not None:
            last = msgspec.structs.replace(
                last,
                token_ids=self.token_ids,
                logprobs=self.logprobs or [],
                prompt_logprobs=self.prompt_logprobs,
            )
        return last.index, "".join(self.parts), self.token_ids, last


async def _drain(stream: TokenStream) -> list[Sample]:
    """A stream run to its end: each of its samples, by index."""
    samples: dict[int, _Gathered] = {}
    done: list[Sample] = []
    async for c in stream:
        g = samples.get(c.index)
        if g is None:
            g = samples[c.index] = _Gathered()
        g.add(c)
        if c.ended:
            done.append(g.sample(c))
        if c.final:
            return sorted(done, key=lambda s: s[0])
    raise ApiError(502, "the worker ended the stream without a final chunk")


async def collect(request: Request, streams: list[TokenStream]) -> list[list[Sample]]:
    """Run the streams to their ends (each one's samples, in order); abort them if the client
    goes away meanwhile."""
    try:
        if all(s.first.final for s in streams):  # the whole answers are here: nothing to wait for
            return [await _drain(s) for s in streams]
        if len(streams) == 1:  # the common case, without a gather's extra task
            task = asyncio.ensure_future(_drain(streams[0]))
        else:
            task = asyncio.ensure_future(asyncio.gather(*(_drain(s) for s in streams)))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
                if not done and await request.is_disconnected():
                    raise ApiError(499, "client disconnected")
            return [task.result()] if len(streams) == 1 else task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    except RequestError as e:  # a worker failed after its first token
        raise ApiError(502, e.message, "server_error", code="worker_failed") from None
    finally:
        for s in streams:
            await s.aclose()


async def sse_events(
    streams: list[TokenStream], answer: Answer, include_usage: bool
) -> AsyncIterator[bytes]:
    """The events of every stream, interleaved as they come, each chunk with its choice's
    index; the usage of all of them (``include_usage``) and one [DONE] at the end."""
    try:
        for opening in answer.opening:
            yield event(opening)
        ends: list[StreamChunk] = []
        try:
            if len(streams) == 1:  # the common case, straight from the stream
                plain = answer.plain()
                async for c in streams[0]:
                    if plain and c.finish_reason is None:  # a token's text: the per-token path
                        if c.text:
                            yield answer.text_event(c.text, c.index)
                        continue
                    if (e := _render(answer, 0, c)) is not None:
                        yield e
                    if c.ended:
                        ends.append(c)
                    if c.final:
                        break
            else:
                async with aclosing(_merge(streams)) as merged:
                    async for i, c in merged:
                        if (e := _render(answer, i, c)) is not None:
                            yield e
                        if c.ended:
                            ends.append(c)
            if include_usage:
                yield event(answer.usage_chunk(usage_of(ends)))
        except RequestError as e:  # a worker failed after the response started
            yield event(error_body(e.message, "server_error", code="worker_failed"))
        yield b"data: [DONE]\n\n"
    finally:
        # Runs on normal end and when the client disconnects (the generator is closed).
        for s in streams:
            await s.aclose()


def _render(answer: Answer, prompt_index: int, c: StreamChunk) -> bytes | None:
    """The event of prompt ``prompt_index``'s chunk ``c`` (None: nothing to send)."""
    index = answer.index(prompt_index, c.index)
    if getattr(answer, "tools", None) is not None:  # read for tool calls (``ChatAnswer``)
        return answer.tool_event(index, c.text, c.finish_reason, c.token_ids)
    if c.ended:
        return event(answer.chunk(c.text, c.finish_reason, c.token_ids, index, c))
    if answer.needs_dict(index):  # every token's id or logprob, even one that ends no character
        return event(answer.chunk(c.text, None, c.token_ids, index, c))
    return answer.text_event(c.text, index) if c.text else None


async def _merge(streams: list[TokenStream]) -> AsyncIterator[tuple[int, StreamChunk]]:
    """``(stream index, chunk)`` of all streams as they arrive, each to its final chunk."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: TokenStream) -> None:
        try:
            async for c in stream:
                await queue.put((i, c))
                if c.final:
                    return
            await queue.put((i, None))  # ended without a final chunk: no more of it
        except Exception as e:  # handed to the reader, which raises it
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while True:
                i, c = await queue.get()
                if c is None:
                    break
                if isinstance(c, Exception):
                    raise c
                yield i, c
                if c.final:
                    break
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
