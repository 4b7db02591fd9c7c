"""Tools through chat templates: real templates with tool syntax (Qwen2.5's, Qwen3's, Llama 3.1's,
stored in tests/data/chat_templates/) render exactly as transformers' ``apply_chat_template``
renders them, and a template without tool syntax (ChatML) gets them in Hermes's format; Gemma
3's real template (no tool syntax) renders as transformers renders it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixray.model_meta.chat_template import CHATML, ChatTemplate, hermes_tools_prompt

DATA = Path(__file__).parent.parent / "data" / "chat_templates"
SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


def call(name: str, args: dict, cid: str = "call_1") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CASES = {
    "tools, no history": (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
        [WEATHER, CLOCK],
    ),
    "no system message": ([{"role": "user", "content": "Weather in Zürich?"}], [WEATHER]),
    "a call and its result": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        ],
        [WEATHER],
    ),
    "two turns of calls": (
        [
            {"role": "user", "content": "Weather in Paris, and the time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("get_weather", {"city": "Paris", "unit": "c"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
            {
                "role": "assistant",
                "content": "Now the time.",
                "tool_calls": [call("now", {}, "call_2")],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
            {"role": "assistant", "content": "21 C at noon."},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER, CLOCK],
    ),
    "no tools": ([{"role": "user", "content": "Hi"}], None),
}
# Qwen2.5's template writes several calls in one turn and several results in one user turn.
QWEN_ONLY = {
    "parallel calls and results": (
        [
            {"role": "user", "content": "Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("get_weather", {"city": "Paris"}),
                    call("get_weather", {"city": "Rome"}, "call_2"),
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21"},
            {"role": "tool", "tool_call_id": "call_2", "content": "25"},
        ],
        [WEATHER],
    ),
}


def hf_render(source: str, messages, tools, add_generation_prompt=True) -> str:
    """transformers' rendering of the template, through a small fast tokenizer that holds it."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<|begin_of_text|>": 1, "<|eot_id|>": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **SPECIALS)
    fast.chat_template = source
    return fast.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def string_contents(messages: list[dict]) -> list[dict]:
    """Qwen3's template reads every message's content as a string ('</think>' in content): an
    assistant turn of calls only sends "" there, as clients of Qwen3 do."""
    return [m | {"content": m["content"] or ""} for m in messages]


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "qwen3", "llama-3.1-instruct"])
@pytest.mark.parametrize("case", [*CASES, *QWEN_ONLY])
def test_real_templates_render_as_transformers_does(name, case):
    if case in QWEN_ONLY and name.startswith("llama"):
        pytest.skip("Llama 3.1's template raises on more than one call per turn")
    messages, tools = (CASES | QWEN_ONLY)[case]
    if name == "qwen3":
        messages = string_contents(messages)
    source = (DATA / f"{name}.jinja").read_text()
    ours = ChatTemplate(source, SPECIALS)
    for gen in (True, False):
        want = hf_render(source, messages, tools, gen)
        assert ours.render(messages, add_generation_prompt=gen, tools=tools) == want
    family = {"qwen2.5-instruct": "hermes", "qwen3": "hermes"}.get(name, "llama3_json")
    assert ours.tool_family == family


def test_chatml_gets_the_tools_in_hermes_format_as_qwen_writes_them():
    """Without tool syntax, the rendering is Qwen2.5's own for the same conversation, bar the
    default system prompt Qwen's template adds when there is no system message."""
    qwen = ChatTemplate((DATA / "qwen2.5-instruct.jinja").read_text())
    chatml = ChatTemplate(CHATML)
    assert chatml.tool_family is None
    for case in ("tools, no history", "a call and its result", "two turns of calls"):
        messages, tools = CASES[case]
        ours = chatml.render(messages, tools=tools)
        want = qwen.render(messages, tools=tools)
        default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        assert ours == want.replace("<|im_start|>system\n" + default, "<|im_start|>system\n")
    messages, tools = QWEN_ONLY["parallel calls and results"]
    assert chatml.render(messages, tools=tools) == qwen.render(
        [{"role": "system", "content": "S"}, *messages], tools=tools
    ).replace("S\n\n", "", 1)


def test_the_hermes_tools_block_is_one_json_line_per_tool():
    block = hermes_tools_prompt([WEATHER, CLOCK])
    lines = block.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    assert [json.loads(x) for x in lines] == [WEATHER, CLOCK]


GEMMA_SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>"}
GEMMA_CASES = {
    "system folded into the first user turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Weather?  "},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Tomorrow?"},
    ],
    "no system message": [{"role": "user", "content": "Hi"}],
    "content parts": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look "},
                {"type": "image"},
                {"type": "text", "text": " here"},
            ],
        },
    ],
}


def gemma_source() -> str:
    """The stored Gemma 3 template (its terms: tests/data/chat_templates/SOURCE.md)."""
    path = DATA / "gemma-3-it.jinja"
    if not path.is_file():
        pytest.skip("Gemma 3's template is not stored")
    return path.read_text()


def gemma_hf_render(source: str, messages, add_generation_prompt: bool) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<bos>": 1, "<eos>": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", **GEMMA_SPECIALS
    )
    fast.chat_template = source
    return fast.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


@pytest.mark.parametrize("case", GEMMA_CASES)
def test_gemma3_template_renders_as_transformers_does(case):
    """Gemma 3's template (no tool syntax): the system text folded into the first user turn,
    'model' for the assistant, contents trimmed, image parts as <start_of_image>."""
    source = gemma_source()
    ours = ChatTemplate(source, GEMMA_SPECIALS)
    messages = GEMMA_CASES[case]
    for gen in (True, False):
        assert ours.render(messages, add_generation_prompt=gen) == gemma_hf_render(
            source, messages, gen
        )
    two = ours.render(GEMMA_CASES["system folded into the first user turn"])
    assert two.startswith("<bos><start_of_turn>user\nBe brief.\n\nWeather?<end_of_turn>\n")
    assert two.endswith("<start_of_turn>model\n")


def test_gemma3_template_refuses_roles_that_do_not_alternate():
    source = gemma_source()
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate"):
        gemma_hf_render(source, messages, True)
    with pytest.raises(Exception, match="must alternate"):
        ChatTemplate(source, GEMMA_SPECIALS).render(messages)
