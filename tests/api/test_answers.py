"""The per-token SSE event is rendered from a template: it must be byte-identical to the event
the general path (build the chunk dict, serialize it) gives for the same text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from radixray.api.answers import ChatAnswer, TextAnswer
from radixray.api.answers import event as sse_event
from radixray.api.openai_routes import json_answer


@given(text=st.text(min_size=1, max_size=40), model=st.text(min_size=1, max_size=20))
def test_text_event_equals_the_serialized_chunk(text, model):
    for answer in (TextAnswer(model), ChatAnswer(model)):
        event = answer.text_event(text)
        assert event == sse_event(answer.chunk(text, None))
        payload = json.loads(event.removeprefix(b"data: ").removesuffix(b"\n\n"))
        choice = payload["choices"][0]
        assert choice.get("text", choice.get("delta", {}).get("content")) == text
        assert payload["created"] == answer.created and payload["id"] == answer.id


@given(text=st.text(min_size=1, max_size=20), index=st.integers(0, 600))
def test_each_choice_has_its_own_template(text, index):
    answer = TextAnswer("tiny")
    event = answer.text_event(text, index)
    assert event == sse_event(answer.chunk(text, None, None, index))
    assert json.loads(event.removeprefix(b"data: "))["choices"][0]["index"] == index


def test_choice_index_is_prompt_index_times_n_plus_sample():
    answer = TextAnswer("tiny", [[1], [2], [3]])
    assert [answer.index(i) for i in range(3)] == [0, 1, 2]
    answer.n = 2  # n > 1: the samples of a prompt sit side by side, OpenAI's order
    assert [answer.index(i, j) for i in range(3) for j in range(2)] == list(range(6))
    # Each choice carries its own prompt's ids once, on its first chunk.
    assert answer.chunk("a", None, [7], 3)["choices"][0]["prompt_token_ids"] == [2]
    assert "prompt_token_ids" not in answer.chunk("b", None, [8], 3)["choices"][0]
    whole = answer.response([(1, "y", [5], "stop"), (0, "x", [4], "length")], {})
    assert [(c["index"], c["text"], c["prompt_token_ids"]) for c in whole["choices"]] == [
        (0, "x", [1]),
        (1, "y", [1]),
    ]


@given(text=st.text(max_size=40), reason=st.sampled_from(["stop", "length", None]))
def test_a_whole_answer_is_the_bytes_json_response_writes(text, reason):
    """Without floats, the whole answer is written by msgspec (``json_answer``): byte for byte
    what Starlette's ``JSONResponse`` (``json.dumps``) writes, escapes and non-ASCII included."""
    use = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    for answer in (TextAnswer("tiny", [[1, 2]]), ChatAnswer("tiny")):
        body = answer.response([(0, text, [7], reason)], use)
        fast = json_answer(body, {"x-radixray-worker": "w0"}, floats=False)
        slow = JSONResponse(body, headers={"x-radixray-worker": "w0"})
        assert fast.body == slow.body and fast.raw_headers == slow.raw_headers
