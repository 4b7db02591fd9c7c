"""A Responses API answer as it is written: output items (an assistant ``message``, a
``function_call`` per tool call) built from the generated text, the stream's events in OpenAI's
order, and the whole ``response`` object.

One builder serves both ways of answering: a streamed answer feeds each chunk's text as it
comes and sends the events; a whole one feeds all of it and sends only the object. So the
items are the same either way. With tools the text goes through the template family's
tool-call reader (``tool_calls.ToolCallStream``): content becomes ``output_text`` of a message
item, each whole call a ``function_call`` item (its arguments in one delta, as the reader sends
a call once it has all of it). Text after a call opens a new message item.

Events (every one with ``sequence_number``, counting from 0): ``response.created``,
``response.in_progress``; per message ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; per call
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
``response.output_item.done``; then ``response.completed`` carrying the whole response, or
``response.incomplete`` (``max_output_tokens`` reached) or ``response.failed`` (a worker failed
after the answer started).
"""

from __future__ import annotations

import copy
import time
import uuid

from radixray.protocol import StreamChunk

from .tool_calls import ToolCallParser

__all__ = ["ResponseDraft"]


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseDraft:
    """One response being written. ``echo``: the request's fields the response object carries
    back (instructions, tools, tool_choice, sampling, metadata, ...)."""

    def __init__(self, rid: str, model: str, echo: dict, tools: ToolCallParser | None = None):
        self.id = rid
        self.model = model
        self.echo = echo
        self.created_at = int(time.time())
        self.status = "in_progress"
        self.items: list[dict] = []
        self.usage: dict | None = None
        self.incomplete: dict | None = None
        self.error: dict | None = None
        self.completed_at: int | None = None
        self._seq = 0
        self._tools = tools.stream() if tools is not None else None
        # The message item being written: always the last item (a call's head closes it).
        self._message: dict | None = None

    # ------------------------------------------------------------------ the object

    def response(self) -> dict:
        """The response object as it stands (a snapshot: later events do not change it)."""
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "model": self.model,
            "output": copy.deepcopy(self.items) if self.status != "in_progress" else [],
            "usage": self.usage,
            "completed_at": self.completed_at,
        }
        out.update(self.echo)
        return out

    # ------------------------------------------------------------------ events

    def _event(self, kind: str, **fields) -> dict:
        e = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return e

    def opening(self) -> list[dict]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def feed(self, text: str) -> list[dict]:
        """The events of the next generated text."""
        if not text:
            return []
        if self._tools is None:
            return self._content(text)
        events: list[dict] = []
        for delta in self._tools.feed(text):
            events += self._delta(delta)
        return events

    def finish(self, last: StreamChunk, usage: dict) -> list[dict]:
        """The events that end the answer: what the tool reader still held, every open item
        closed, and ``response.completed`` (or ``.incomplete`` when the token limit cut it)."""
        events: list[dict] = []
        if self._tools is not None:
            for delta in self._tools.finish():
                events += self._delta(delta)
        cut = last.finish_reason == "length"
        events += self._close_message("incomplete" if cut else "completed")
        self.usage = usage
        self.completed_at = int(time.time())
        if cut:
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            return events + [self._event("response.incomplete", response=self.response())]
        self.status = "completed"
        return events + [self._event("response.completed", response=self.response())]

    def fail(self, message: str) -> list[dict]:
        """A worker failed after the answer started: the open item is left incomplete and the
        response ends ``failed``."""
        events = self._close_message("incomplete")
        self.status = "failed"
        self.error = {"code": "server_error", "message": message}
        return events + [self._event("response.failed", response=self.response())]

    # ------------------------------------------------------------------ items

    def _delta(self, delta: dict) -> list[dict]:
        if "content" in delta:
            return self._content(delta["content"])
        events: list[dict] = []
        for call in delta["tool_calls"]:
            if "id" in call:  # a call's head: its name (its arguments follow in one delta)
                events += self._close_message("completed")
                item = {
                    "id": f"fc_{uuid.uuid4().hex}",
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": "",
                }
                self.items.append(item)
                events.append(self._added(item))
            else:
                events += self._arguments(self.items[-1], call["function"]["arguments"])
        return events

    def _arguments(self, item: dict, arguments: str) -> list[dict]:
        index = len(self.items) - 1
        item["arguments"] = arguments
        item["status"] = "completed"
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            ),
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=dict(item)),
        ]

    def _added(self, item: dict) -> dict:
        return self._event(
            "response.output_item.added", output_index=len(self.items) - 1, item=copy.deepcopy(item)
        )

    def _content(self, text: str) -> list[dict]:
        events: list[dict] = []
        if self._message is None:
            self._message = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.items.append(self._message)
            events.append(self._added(self._message))
            self._message["content"].append(_part(""))
            where = self._where(self._message)
            events.append(self._event("response.content_part.added", **where, part=_part("")))
        self._message["content"][0]["text"] += text
        where = self._where(self._message)
        events.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        return events

    def _where(self, msg: dict) -> dict:
        """Where the open message's text is: its item, its output index (the last), its part."""
        return {"item_id": msg["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _close_message(self, status: str) -> list[dict]:
        msg, self._message = self._message, None
        if msg is None:
            return []
        msg["status"] = status
        text = msg["content"][0]["text"]
        where = self._where(msg)
        index = where["output_index"]
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=_part(text)),
            self._event("response.output_item.done", output_index=index, item=copy.deepcopy(msg)),
        ]
