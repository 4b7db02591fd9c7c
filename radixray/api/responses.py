"""OpenAI response builders: plain dicts in OpenAI's shape, so that the official ``openai``
client parses them (a whole answer and a streamed chunk share one envelope)."""

from __future__ import annotations

import time

__all__ = [
    "chat_choice",
    "chat_chunk",
    "chat_response",
    "completion_choice",
    "completion_chunk",
    "completion_response",
    "usage",
]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _ids(choice: dict, prompt_token_ids: list[int] | None, token_ids: list[int] | None) -> dict:
    """``return_token_ids``' fields on a completion choice (vLLM's names and places)."""
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = prompt_token_ids
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def completion_choice(
    index: int,
    text: str,
    finish: str | None,
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
    logprobs: dict | None = None,
) -> dict:
    choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
    return _ids(choice, prompt_token_ids, token_ids)


def completion_response(rid: str, model: str, choices: list[dict], use: dict) -> dict:
    """A whole answer: its choices (``completion_choice``, in index order) and usage."""
    return _envelope(rid, "text_completion", model, choices, None, use)


def completion_chunk(
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    use: dict | None = None,
    created: int | None = None,
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    choices = [completion_choice(index, text, finish, prompt_token_ids, token_ids, logprobs)]
    return _envelope(rid, "text_completion", model, choices, created, use)


def _envelope(
    rid: str,
    obj: str,
    model: str,
    choices: list[dict],
    created: int | None,
    use: dict | None,
    prompt_token_ids: list[int] | None = None,
) -> dict:
    """What every answer and chunk has around its choices; ``prompt_token_ids`` beside them is
    chat's place for them (a completion has them on its choice)."""
    out = {
        "id": rid,
        "object": obj,
        "created": created or int(time.time()),
        "model": model,
        "choices": choices,
    }
    if prompt_token_ids is not None:
        out["prompt_token_ids"] = prompt_token_ids
    if use is not None:
        out["usage"] = use
    return out


def chat_choice(
    index: int,
    text: str,
    finish: str,
    token_ids: list[int] | None = None,
    logprobs: dict | None = None,
    tool_calls: list[dict] | None = None,
) -> dict:
    message = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
    return _ids(choice, None, token_ids)


def chat_response(
    rid: str,
    model: str,
    choices: list[dict],
    use: dict,
    prompt_token_ids: list[int] | None = None,
) -> dict:
    """A whole chat answer of ``choices`` (``chat_choice``)."""
    return _envelope(rid, "chat.completion", model, choices, None, use, prompt_token_ids)


def chat_chunk(
    rid: str,
    model: str,
    delta: dict,
    finish: str | None,
    use: dict | None = None,
    with_choice: bool = True,
    created: int | None = None,
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    choices = [_ids(choice, None, token_ids)] if with_choice else []
    return _envelope(rid, "chat.completion.chunk", model, choices, created, use, prompt_token_ids)
