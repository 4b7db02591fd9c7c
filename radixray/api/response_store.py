"""Stored responses of the Responses API (``POST /v1/responses`` with ``store``, OpenAI's
default): kept in the serving process, bounded in entries and in age, so that
``previous_response_id`` can continue one and ``GET`` / ``DELETE /v1/responses/{id}`` reach it.

A stored response keeps what a continuation needs: its whole input (the earlier turns' too,
as Responses items) and its output items. A continuation's prompt is that history, then its
own input, rendered again: the prefix cache serves the earlier turns' pages.

**Which process holds an id.** Each router (and each worker served on its own) keeps the
responses it answered; there is no shared store. An id names the store that made it
(``resp_<tag>_<random>``, the tag a hash of the router's id), so a router asked for an id it
does not hold says whether the id is another router's (and whose tag) or unknown, in a 404
naming the id. A fleet of routers behind one address continues responses through the router
that stored them (sticky sessions), or the client sends the whole conversation with
``store: false`` (docs/openai_api.md, "Responses").
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from radixray.settings import setting

from .errors import ApiError

__all__ = ["ResponseStore", "ResponseStoreConfig", "StoredResponse", "store_tag"]


@dataclass(frozen=True)
class ResponseStoreConfig:
    """How many stored responses a serving process keeps, and for how long."""

    responses_store_entries: int = setting(
        4096,
        "stored responses (/v1/responses with store) kept in this process; the least recently "
        "used goes first past it (0: store nothing)",
    )
    responses_store_age_s: float = setting(
        3600.0, "seconds a stored response is kept after it was last stored or read"
    )

    def __post_init__(self):
        if self.responses_store_entries < 0:
            raise ValueError(
                "responses_store_entries must be >= 0 (0: store nothing), got "
                f"{self.responses_store_entries}"
            )
        if not self.responses_store_age_s > 0:
            raise ValueError(
                f"responses_store_age_s must be > 0 seconds, got {self.responses_store_age_s}"
            )


def store_tag(owner: str) -> str:
    """The 8 hex digits that name a store (its owner's id) inside the ids it makes."""
    return hashlib.blake2b(owner.encode(), digest_size=4).hexdigest()


@dataclass
class StoredResponse:
    response: dict  # the Response object as it was answered
    input_items: list[dict]  # the whole input: earlier turns' items, then this request's own
    stored_at: float
    listed: list[dict]  # this request's own input items, with ids (GET .../input_items)


class ResponseStore:
    """Responses by id, least recently used first out, each kept ``age_s`` after its last use."""

    def __init__(self, owner: str, config: ResponseStoreConfig | None = None, clock=time.monotonic):
        self.config = config or ResponseStoreConfig()
        self.owner = owner
        self.tag = store_tag(owner)
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def new_id(self) -> str:
        return f"resp_{self.tag}_{uuid.uuid4().hex}"

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response: dict, input_items: list[dict], listed: list[dict] = ()) -> bool:
        """Keep ``response`` (under its own id) with its whole input and its own input items as
        listed; False when this store keeps nothing."""
        if self.config.responses_store_entries == 0:
            return False
        rid = response["id"]
        self._entries[rid] = StoredResponse(response, input_items, self._clock(), list(listed))
        self._entries.move_to_end(rid)
        while len(self._entries) > self.config.responses_store_entries:
            self._entries.popitem(last=False)
        self._expire()
        return True

    def get(self, rid: str, param: str | None = None) -> StoredResponse:
        """The stored response ``rid`` (its age restarts); a 404 naming it (and ``param``, the
        request field that named it) when this store does not hold it."""
        self._expire()
        entry = self._entries.get(rid)
        if entry is None:
            raise self._missing(rid, param)
        entry.stored_at = self._clock()
        self._entries.move_to_end(rid)
        return entry

    def delete(self, rid: str) -> None:
        self._expire()
        if self._entries.pop(rid, None) is None:
            raise self._missing(rid, None)

    def _expire(self) -> None:
        limit = self._clock() - self.config.responses_store_age_s
        while self._entries:
            rid, oldest = next(iter(self._entries.items()))
            if oldest.stored_at > limit:
                return
            del self._entries[rid]

    def _missing(self, rid: str, param: str | None) -> ApiError:
        parts = rid.split("_")
        if len(parts) == 3 and parts[0] == "resp" and len(parts[1]) == 8 and parts[1] != self.tag:
            where = (
                f"it was stored by another router (store tag {parts[1]}; this one is "
                f"{self.tag}, {self.owner}): responses are kept by the router that answered "
                "them, so continue it there, or send the whole conversation with store false"
            )
        else:
            cfg = self.config
            where = (
                "it was never stored here, was deleted, or has expired (this server keeps "
                f"{cfg.responses_store_entries} responses for {cfg.responses_store_age_s:g} s "
                "after their last use)"
            )
        return ApiError(
            404,
            f"No response found with id '{rid}': {where}",
            "not_found_error",
            param,
            "response_not_found",
        )
