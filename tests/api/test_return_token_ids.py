"""``return_token_ids`` (vLLM's extension): the answer carries the prompt's token ids as the
engine saw them and the ids it sampled, streamed and not, completions and chat, through the
router over real in-process workers and through one worker's own server. Checked against a
separate engine's greedy run of the same prompt (the tiny model: one byte is one token)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.worker import Engine, EngineConfig, SamplingParams

from ..router.serving import served

PROMPT = "token ids, please: the engine's own, not a re-tokenization of the text. "
MESSAGES = [
    {"role": "system", "content": "You answer in bytes."},
    {"role": "user", "content": "Which ids did you sample?"},
]
N = 9


@pytest.fixture(scope="module")
def reference():
    """Greedy token ids of a separate engine for a prompt's ids."""
    e = Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))
    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    return lambda ids: e.generate_batch([ids], params)[0].token_ids


@pytest.fixture(scope="module", params=["router", "worker"])
def url(request):
    with served(request.param) as (u, _):
        yield u


def sse(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [x[5:].strip() for x in r.iter_lines() if x.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_completion_carries_the_engines_ids(url, reference):
    tok = load_model_meta("tiny").tokenizer
    prompt_ids = tok.encode(PROMPT)
    want = reference(prompt_ids)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    (choice,) = r["choices"]
    assert choice["prompt_token_ids"] == prompt_ids
    assert choice["token_ids"] == want
    assert tok.decode(want) == choice["text"]

    chunks = sse(url, "/v1/completions", body)
    with_choice = [c["choices"][0] for c in chunks if c["choices"]]
    assert with_choice[0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c for c in with_choice[1:])
    assert [t for c in with_choice for t in c["token_ids"]] == want
    assert "".join(c["text"] for c in with_choice) == choice["text"]

    # A prompt given as token ids comes back as given.
    r2 = httpx.post(url + "/v1/completions", json=body | {"prompt": prompt_ids}, timeout=60)
    assert r2.json()["choices"][0]["prompt_token_ids"] == prompt_ids


def test_chat_carries_the_templated_prompt_and_the_answer_ids(url, reference):
    meta = load_model_meta("tiny")
    rendered = meta.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    prompt_ids = meta.tokenizer.encode(rendered)
    want = reference(prompt_ids)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": N, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    assert r["prompt_token_ids"] == prompt_ids
    assert r["choices"][0]["token_ids"] == want

    chunks = sse(url, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == prompt_ids  # on the role chunk, once
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]] == want


def test_off_by_default_and_the_official_client_passes_it(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0)
    assert "token_ids" not in plain.choices[0].model_dump()
    asked = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=3,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    extra = asked.choices[0].model_dump()
    assert len(extra["token_ids"]) == asked.usage.completion_tokens == 3
    assert extra["prompt_token_ids"] == load_model_meta("tiny").tokenizer.encode(PROMPT)


def test_a_non_boolean_is_a_400_naming_the_field(url):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "return_token_ids": "yes"}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "return_token_ids"
