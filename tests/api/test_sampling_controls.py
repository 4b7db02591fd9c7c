"""The sampling controls at the OpenAI edge, through the official ``openai`` client (non-OpenAI
fields in ``extra_body``), against the router over real in-process workers and against one
worker's own server: greedy tokens equal a separate engine's with the same controls, streamed
and not; bad values are 400s naming the field and its range."""

from __future__ import annotations

import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.worker import Engine, EngineConfig, SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog, again and again and"
MESSAGES = [{"role": "user", "content": "Say something, then stop."}]
EOS = 258  # <|im_end|>: a stop token of the tiny model
CONTROLS = {
    "presence_penalty": 1.0,
    "frequency_penalty": 0.5,
    "logit_bias": {str(ord("e")): 3, str(ord("Q")): -100},
}
EXTRA = {"repetition_penalty": 1.4, "top_k": 0, "min_p": 0.0}


@pytest.fixture(scope="module")
def reference():
    """Greedy token ids of a separate engine for a prompt's ids and its controls."""
    e = Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))

    def run(ids, n, **kw):
        params = SamplingParams(max_tokens=n, temperature=0.0, **kw)
        return e.generate_batch([ids], params)[0]

    return run


def ids_of(text: str) -> list[int]:
    return load_model_meta("tiny").tokenizer.encode(text)


def test_completion_controls_equal_the_engines(client, reference):
    want = reference(
        ids_of(PROMPT),
        12,
        ignore_eos=True,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        repetition_penalty=1.4,
        logit_bias={ord("e"): 3.0, ord("Q"): -100.0},
    )
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0} | CONTROLS
    extra = EXTRA | {"ignore_eos": True, "return_token_ids": True}
    r = client.completions.create(**kw, extra_body=extra)
    assert r.choices[0].model_dump()["token_ids"] == want.token_ids
    assert r.choices[0].text == want.text
    chunks = list(client.completions.create(**kw, extra_body=extra, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text


def test_logit_bias_forces_a_token(client):
    r = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logit_bias={str(ord("Q")): 100},
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == "QQQQQ"


def test_min_tokens_delays_eos_and_stop_token_ids_stop(client):
    bias = {str(EOS): 100}
    r = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, logit_bias=bias
    )
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        logit_bias=bias,
        extra_body={"min_tokens": 4, "return_token_ids": True},
    )
    ids = r.choices[0].model_dump()["token_ids"]
    assert len(ids) == 5 and ids[-1] == EOS and r.choices[0].finish_reason == "stop"
    # stop_token_ids: a forced token that is not a stop token ends the request once listed.
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        logit_bias={str(ord("Z")): 100},
        extra_body={"stop_token_ids": [ord("Z")], "min_tokens": 2, "ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 3 and r.choices[0].message.content.endswith("Z")


def test_chat_stream_carries_the_controls(client, reference):
    meta = load_model_meta("tiny")
    rendered = meta.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    want = reference(ids_of(rendered), 8, ignore_eos=True, presence_penalty=2.0, top_k=3)
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    extra = {"ignore_eos": True, "top_k": 3}
    chunks = list(
        client.chat.completions.create(**kw, presence_penalty=2.0, extra_body=extra, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text


@pytest.mark.parametrize(
    "kw, param, words",
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -3}, "frequency_penalty", "[-2, 2]"),
        ({"logit_bias": {"5": 200}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {"100000": 1}}, "logit_bias", "vocabulary"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty", "> 0"),
        ({"extra_body": {"min_p": 2}}, "min_p", "[0, 1]"),
        ({"extra_body": {"top_k": -5}}, "top_k", "-1 or 0 (off) or an int in [1, 2**31)"),
        ({"extra_body": {"min_tokens": 9}}, "min_tokens", "max_tokens (8)"),
        ({"extra_body": {"stop_token_ids": [100000]}}, "stop_token_ids", "vocabulary"),
    ],
)
def test_bad_values_are_400s_naming_the_field_and_range(client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, **kw)
    err = info.value.body
    assert info.value.status_code == 400
    assert err["param"] == param and words in err["message"], err
