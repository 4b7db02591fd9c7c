"""Logprobs and echo at the OpenAI edge, through the official ``openai`` client, against the
router over real in-process workers and against one worker's own server, streamed and not: the
values equal a separate engine's (tests/worker/test_logprobs.py checks those against a float64
reference), in OpenAI's shapes; a prompt-logprob request is computed whole, never from cached
pages; bad values are 400s naming the field."""

from __future__ import annotations

import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.worker import Engine, EngineConfig, SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
MESSAGES = [{"role": "user", "content": "Say something."}]
TOL = 1e-5  # batches differ in shape between the two engines


@pytest.fixture(scope="module")
def tok():
    return load_model_meta("tiny").tokenizer


@pytest.fixture(scope="module")
def reference():
    """(token ids, their logprobs, prompt logprobs) of a separate engine, greedy."""
    e = Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))

    def run(ids, n, k, prompt_k=None):
        params = SamplingParams(
            max_tokens=n, temperature=0.0, logprobs=k, prompt_logprobs=prompt_k, ignore_eos=True
        )
        e.add_request(ids, params, request_id="ref")
        chunks = []
        while e.has_work():
            chunks += e.step()
        out = [t for c in chunks for t in c.token_ids]
        return out, [x for c in chunks for x in c.logprobs], chunks[0].prompt_logprobs

    return run


def text_of(tok, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False)


def check_completion_lps(lp, tok, ids, entries, k, offset=0):
    assert lp.tokens == [text_of(tok, t) for t in ids]
    for got, e in zip(lp.token_logprobs, entries, strict=True):
        assert (got is None) == (e is None)
        if e is not None:
            assert abs(got - e.logprob) < TOL
    for top, t, e in zip(lp.top_logprobs, ids, entries, strict=True):
        if e is None:
            assert top is None
            continue
        want = {}
        for i, v in zip(e.top_ids, e.top_logprobs, strict=True):
            want.setdefault(text_of(tok, i), v)
        want.setdefault(text_of(tok, t), e.logprob)
        assert top.keys() == want.keys() and len(want) <= k + 1
        assert all(abs(top[s] - want[s]) < TOL for s in want)
    offsets = [offset]
    for s in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(s))
    assert lp.text_offset == offsets


@pytest.mark.parametrize("k", [0, 3, 5])
def test_completion_logprobs(client, reference, tok, k):
    ids = tok.encode(PROMPT)
    out, entries, _ = reference(ids, 5, k)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0.0, "logprobs": k}
    r = client.completions.create(**kw, extra_body={"ignore_eos": True})
    check_completion_lps(r.choices[0].logprobs, tok, out, entries, k)
    # streamed: each chunk carries its own tokens' logprobs, offsets continue
    tokens, values = [], []
    for c in client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True}):
        for ch in c.choices:
            if ch.logprobs is not None:
                tokens += ch.logprobs.tokens
                values += ch.logprobs.token_logprobs
    assert tokens == [text_of(tok, t) for t in out]
    assert values == pytest.approx([e.logprob for e in entries], abs=1e-5)


def test_echo_with_prompt_logprobs_skips_the_cache(client, reference, tok):
    ids = tok.encode(PROMPT)
    out, entries, prompt_entries = reference(ids, 3, 2, 2)
    kw = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 3,
        "temperature": 0.0,
        "logprobs": 2,
        "echo": True,
    }
    first = client.completions.create(**kw, extra_body={"ignore_eos": True})
    ch = first.choices[0]
    assert ch.text.startswith(PROMPT)
    assert ch.logprobs.token_logprobs[0] is None and ch.logprobs.top_logprobs[0] is None
    check_completion_lps(ch.logprobs, tok, ids + out, prompt_entries + entries, 2)
    again = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert again.choices[0].logprobs == ch.logprobs
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    # Plain requests reuse the cache again (the echo requests cached the prompt's pages).
    # Through a router either may go to the other worker: for a prompt this short ttft
    # recomputes rather than wait behind a holder whose last report still shows it busy (a
    # poll taken while the previous request ran; seen on a loaded machine). Of two requests one
    # hits: the holder's, or the second on the worker the first one cached it on.
    plain = [client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1) for _ in "ab"]
    assert max(p.usage.prompt_tokens_details.cached_tokens for p in plain) > 0
    # streamed: the prompt's text and logprobs come in the first chunk
    chunks = list(client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True}))
    first_choice = next(c.choices[0] for c in chunks if c.choices)
    assert first_choice.text.startswith(PROMPT)
    assert first_choice.logprobs.tokens[: len(ids)] == [text_of(tok, t) for t in ids]
    lps = [v for c in chunks for x in c.choices if x.logprobs for v in x.logprobs.token_logprobs]
    assert lps[0] is None
    assert lps[1:] == pytest.approx(ch.logprobs.token_logprobs[1:], abs=1e-5)


def test_echo_without_logprobs(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, echo=True)
    assert r.choices[0].text.startswith(PROMPT) and r.choices[0].logprobs is None


@pytest.mark.parametrize("top", [0, 4, 20])
def test_chat_logprobs(client, reference, tok, top):
    ids = tok.encode(tok.apply_chat_template(MESSAGES, add_generation_prompt=True))
    out, entries, _ = reference(ids, 4, top)
    kw = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": True,
    }
    kw["top_logprobs"] = top
    r = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [text_of(tok, t) for t in out]
    for c, e in zip(content, entries, strict=True):
        assert abs(c.logprob - e.logprob) < TOL
        assert c.bytes == list(c.token.encode())
        assert [t.token for t in c.top_logprobs] == [text_of(tok, i) for i in e.top_ids]
        assert all(
            abs(t.logprob - v) < TOL for t, v in zip(c.top_logprobs, e.top_logprobs, strict=True)
        )
    streamed = []
    for c in client.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True}):
        for ch in c.choices:
            if ch.logprobs is not None:
                streamed += ch.logprobs.content
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-5)


def test_no_logprobs_unless_asked(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert r.choices[0].logprobs is None
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("completions", {"logprobs": 6}, "logprobs"),
        ("completions", {"logprobs": -1}, "logprobs"),
        ("completions", {"logprobs": True}, "logprobs"),
        ("completions", {"echo": "yes"}, "echo"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("chat", {"top_logprobs": 3}, "top_logprobs"),
        ("chat", {"logprobs": 2}, "logprobs"),
    ],
)
def test_bad_values_are_400s_naming_the_field(client, route, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        if route == "completions":
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body=body)
        else:
            client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=1, extra_body=body
            )
    assert e.value.body["param"] == param
