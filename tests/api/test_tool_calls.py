"""The tool-call parsers: Hermes's ``<tool_call>`` JSON and Llama 3's bare JSON, whole and
streamed; a stream split at every character boundary gives the same calls and content as the
whole text."""

from __future__ import annotations

import json

import pytest

from radixray.api.tool_calls import ToolCallStream, parser_for

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
R = '{"name": "get_weather", "arguments": {"city": "Rome", "days": [1, 2]}}'


def calls_of(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def streamed(parser, pieces: list[str]) -> tuple[str | None, list[tuple[str, dict]]]:
    """The content and calls a client rebuilds from the stream's deltas (as OpenAI's SDK)."""
    s: ToolCallStream = parser.stream()
    deltas = [d for p in pieces for d in s.feed(p)] + s.finish()
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["type"] == "function" and tc["function"]["arguments"] == ""
                assert tc["id"].startswith("call_") and tc["index"] == len(calls)
                calls[tc["index"]] = [tc["function"]["name"], ""]
            else:
                calls[tc["index"]][1] += tc["function"]["arguments"]
    assert s.calls == len(calls)
    return content or None, [(n, json.loads(a)) for n, a in calls.values()]


HERMES = {
    "one call": (f"<tool_call>\n{W}\n</tool_call>", None, [("get_weather", {"city": "Paris"})]),
    "two calls, text around": (
        f"Let me look.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>{R}</tool_call> done",
        "Let me look.\n\n done",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": [1, 2]})],
    ),
    "malformed JSON stays content": (
        '<tool_call>{"name": "x", "arguments": {</tool_call> ok',
        '<tool_call>{"name": "x", "arguments": {</tool_call> ok',
        [],
    ),
    "no name stays content": (
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        [],
    ),
    "bad then good": (
        f"<tool_call>[1]</tool_call>\n<tool_call>{W}</tool_call>",
        "<tool_call>[1]</tool_call>",
        [("get_weather", {"city": "Paris"})],
    ),
    "unclosed last call": (
        f"Sure. <tool_call>\n{W}\n",
        "Sure.",
        [("get_weather", {"city": "Paris"})],
    ),
    "plain text with a < and a partial tag": ("a < b <tool", "a < b <tool", []),
    "no calls": ("  Hello there  ", "Hello there", []),
    "arguments as a JSON string": (
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        None,
        [("f", {"a": 1})],
    ),
}
LLAMA = {
    "one call": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    "python tag, two calls": (
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}',
        None,
        [("a", {}), ("b", {"x": 1})],
    ),
    "text is content": ("  The weather is fine. ", "The weather is fine.", []),
    "malformed JSON is content": (
        '{"name": "a", "parameters": {',
        '{"name": "a", "parameters": {',
        [],
    ),
}


@pytest.mark.parametrize(
    "family,case", [("hermes", c) for c in HERMES] + [("llama3_json", c) for c in LLAMA]
)
def test_whole_and_streamed_at_every_split(family, case):
    text, content, calls = (HERMES if family == "hermes" else LLAMA)[case]
    parser = parser_for(family)
    got_content, got_calls = parser.parse(text)
    assert (got_content, calls_of(got_calls)) == (content, calls)
    assert streamed(parser, [text]) == (content, calls)
    assert streamed(parser, list(text)) == (content, calls)  # one character at a time
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 7):
            assert streamed(parser, [text[:i], text[i:j], text[j:]]) == (content, calls), (i, j)


def test_ids_are_fresh_and_arguments_are_json_strings():
    _, calls = parser_for("hermes").parse(f"<tool_call>{W}</tool_call><tool_call>{W}</tool_call>")
    assert calls[0]["id"] != calls[1]["id"]
    assert all(
        c["type"] == "function" and isinstance(c["function"]["arguments"], str) for c in calls
    )


def test_parallel_false_keeps_the_first_call():
    text = f"<tool_call>{W}</tool_call><tool_call>{R}</tool_call>"
    parser = parser_for("hermes", parallel=False)
    assert calls_of(parser.parse(text)[1]) == [("get_weather", {"city": "Paris"})]
    assert streamed(parser, list(text))[1] == [("get_weather", {"city": "Paris"})]


def test_no_family_reads_hermes():
    assert parser_for(None).family == "hermes"
