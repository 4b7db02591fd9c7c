"""The per-token SSE event is rendered from a template: it must be byte-identical to the event
the general path (build the chunk dict, serialize it) gives for the same text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from radixray.api.openai_routes import _ChatAnswer, _event, _TextAnswer


@given(text=st.text(min_size=1, max_size=40), model=st.text(min_size=1, max_size=20))
def test_text_event_equals_the_serialized_chunk(text, model):
    for answer in (_TextAnswer(model), _ChatAnswer(model)):
        event = answer.text_event(text)
        assert event == _event(answer.chunk(text, None))
        payload = json.loads(event.removeprefix(b"data: ").removesuffix(b"\n\n"))
        choice = payload["choices"][0]
        assert choice.get("text", choice.get("delta", {}).get("content")) == text
        assert payload["created"] == answer.created and payload["id"] == answer.id
