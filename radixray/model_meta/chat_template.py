"""Chat templates: the Jinja source a checkpoint ships, rendered the way HF transformers does.

Rendering settings follow transformers' ``apply_chat_template`` (a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` and ``strftime_now`` globals, the
``loopcontrols`` extension) so that the same template gives the same text, token for token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = ["CHATML", "ChatTemplate"]

# Plain ChatML without a default system prompt: what the tiny test tokenizer uses.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template called ``raise_exception`` (e.g. roles out of order)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str):
    # jinja2 comes with torch (a hard dependency of torch), so it is always importable here.
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special-token strings templates may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ValueError("ChatTemplate needs a non-empty Jinja template string")
        self.source = source
        self._special = dict(special_tokens or {})
        self._template = _compile(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) to the prompt text."""
        if isinstance(messages, (str, bytes)) or not all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError(
                "messages must be a list of {'role': str, 'content': str} mappings, "
                f"got {messages!r:.200}"
            )
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **self._special,
            **extra,
        )
