"""Tool calls read from a model's answer, one parser per template family, whole or streamed.

- ``hermes`` (Qwen2.5, Hermes, and every template without tool syntax, which gets Hermes's
  format from us): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number,
  with text around them.
- ``llama3_json`` (Llama 3.1): the whole answer is ``{"name": ..., "parameters": {...}}``
  (several joined by ``;``), optionally after ``<|python_tag|>``.

A call that does not parse (bad JSON, no name, arguments not an object) stays plain content.
The streamed parse gives the same calls and the same content as the whole one, however the text
is split: text that may be the start of a ``<tool_call>`` tag is held back until it is not.
"""

from __future__ import annotations

import json
import re
import uuid

__all__ = ["ToolCallParser", "ToolCallStream", "PARSERS", "parser_for"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PY_TAG = "<|python_tag|>"


def _call(name: str, arguments: dict) -> dict:
    """One OpenAI tool call: a fresh id, the arguments as a JSON string."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _read_call(body: str, args_key: str) -> dict | None:
    """``{"name": str, args_key: {...}}`` as a call, or None when it is not one."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return _call(obj["name"], args)


def _content(parts: list[str]) -> str | None:
    text = "".join(parts).strip()
    return text or None


class ToolCallParser:
    """Reads ``tool_calls`` out of a family's answers. ``parallel=False`` keeps the first."""

    family = ""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """``(content, calls)`` of a whole answer: content is the text outside the calls,
        stripped (None if empty)."""
        raise NotImplementedError

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)


class HermesParser(ToolCallParser):
    family = "hermes"
    _BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)" + re.escape(_CLOSE), re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        parts, calls = [], []
        pos = 0
        for m in self._BLOCK.finditer(text):
            parts.append(text[pos : m.start()])
            call = _read_call(m.group(1), "arguments")
            if call is None:
                parts.append(m.group(0))
            else:
                calls.append(call)
            pos = m.end()
        rest = text[pos:]
        # An answer that ends inside a call (stopped at EOS before its closing tag).
        start = rest.find(_OPEN)
        if start >= 0 and (call := _read_call(rest[start + len(_OPEN) :], "arguments")):
            parts.append(rest[:start])
            calls.append(call)
        else:
            parts.append(rest)
        if not self.parallel:
            calls = calls[:1]
        return _content(parts), calls


class Llama3JsonParser(ToolCallParser):
    family = "llama3_json"

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        body = text.strip()
        if body.startswith(_PY_TAG):
            body = body[len(_PY_TAG) :].strip()
        if not body.startswith("{"):
            return _content([text]), []
        calls, pos, decoder = [], 0, json.JSONDecoder()
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except ValueError:
                return _content([text]), []
            call = _read_call(json.dumps(obj), "parameters")
            if call is None:
                return _content([text]), []
            calls.append(call)
            pos = end
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
        return None, calls if self.parallel else calls[:1]


PARSERS: dict[str, type[ToolCallParser]] = {p.family: p for p in (HermesParser, Llama3JsonParser)}


def parser_for(family: str | None, parallel: bool = True) -> ToolCallParser:
    """The parser of a template family (``ChatTemplate.tool_family``); a template without tool
    syntax is answered in Hermes's format, so None means Hermes."""
    return PARSERS[family or "hermes"](parallel)


class ToolCallStream:
    """One streamed answer's tool calls as OpenAI streams them: ``feed`` each text fragment,
    then ``finish``; each returns the chunk deltas to send (``{"content": ...}`` or
    ``{"tool_calls": [...]}``). A call is sent once it is whole: a first delta with its index,
    id, type, name and empty arguments, then its arguments. ``calls`` counts the calls sent."""

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self.calls = 0
        self._buf = ""  # text not yet decided: a possible tag start, or a call being written
        self._ws = ""  # whitespace held back: sent only if more content follows
        self._started = False  # content sent yet (leading whitespace is dropped, as parse's)
        self._whole = isinstance(parser, Llama3JsonParser)
        self._decided = False  # llama3_json: the answer is known to be (or not be) JSON

    # ------------------------------------------------------------------ content

    def _text(self, text: str, out: list[dict]) -> None:
        """Content outside the calls, stripped at both ends over the whole answer."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return
        body = text.rstrip()
        tail = text[len(body) :]
        if body:
            out.append({"content": self._ws + body})
            self._ws = ""
            self._started = True
        self._ws += tail

    def _calls(self, calls: list[dict], out: list[dict]) -> None:
        for c in calls:
            if not self.parser.parallel and self.calls >= 1:
                return
            i = self.calls
            self.calls += 1
            fn = c["function"]
            head = {"index": i, "id": c["id"], "type": "function"}
            out.append({"tool_calls": [head | {"function": {"name": fn["name"], "arguments": ""}}]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})

    # ------------------------------------------------------------------ feeding

    def feed(self, text: str) -> list[dict]:
        out: list[dict] = []
        if self._whole:
            return self._feed_json(text, out)
        self._buf += text
        while self._buf:
            if self._buf.startswith(_OPEN):
                end = self._buf.find(_CLOSE)
                if end < 0:
                    break  # a call being written
                block = self._buf[: end + len(_CLOSE)]
                self._buf = self._buf[end + len(_CLOSE) :]
                call = _read_call(block[len(_OPEN) : -len(_CLOSE)], "arguments")
                if call is None:
                    self._text(block, out)
                else:
                    self._calls([call], out)
                continue
            start = self._buf.find(_OPEN)
            if start < 0:  # hold back a suffix that may start a tag
                keep = _partial_tag(self._buf)
                self._text(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                break
            self._text(self._buf[:start], out)
            self._buf = self._buf[start:]
        return out

    def _feed_json(self, text: str, out: list[dict]) -> list[dict]:
        if self._decided:
            self._text(text, out)
            return out
        self._buf += text
        head = self._buf.lstrip()
        if head and not (head.startswith("{") or _PY_TAG.startswith(head[: len(_PY_TAG)])):
            self._decided = True
            buf, self._buf = self._buf, ""
            self._text(buf, out)
        return out  # JSON (or maybe): kept whole until the end

    def finish(self) -> list[dict]:
        """The deltas of what is still held, at the end of the answer."""
        out: list[dict] = []
        buf, self._buf = self._buf, ""
        if not buf:
            return out
        content, calls = self.parser.parse(buf)
        if calls:
            # What parse kept as content before the calls (an unclosed call at the end).
            start = buf.find(_OPEN)
            if start > 0:
                self._text(buf[:start], out)
            self._calls(calls, out)
        else:
            self._text(buf, out)
        return out


def _partial_tag(text: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(_OPEN) - 1, len(text)), 0, -1):
        if _OPEN.startswith(text[-n:]):
            return n
    return 0
