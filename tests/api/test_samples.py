"""``n`` > 1 through the official ``openai`` client, against a router over real in-process workers
and against one worker's own server: one request placed once, ``n`` choices indexed (prompt i's
sample j at ``i * n + j``), streamed and not; usage counts each prompt once and every
completion; with a seed, choice j is what a request seeded ``seed + j`` answers, so the choices
differ and repeat."""

from __future__ import annotations

import openai
import pytest

from ..router.serving import served

SAMPLED = {"model": "tiny", "max_tokens": 5, "temperature": 1.0, "seed": 21, "ignore_eos": True}
EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module", params=["router", "worker"])
def live(request):
    with served(request.param) as (url, hosts):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60), hosts
        for h in hosts:
            h.engine.check_integrity()


def _args(**over):
    args = {k: v for k, v in SAMPLED.items() if k != "ignore_eos"} | over
    return args | {"extra_body": EXTRA}


def test_completion_choices_are_the_seeded_requests(live):
    client, hosts = live
    r = client.completions.create(prompt="The cache", n=3, **_args())
    assert [c.index for c in r.choices] == [0, 1, 2]
    alone = [
        client.completions.create(prompt="The cache", **_args(seed=21 + j)).choices[0].text
        for j in range(3)
    ]
    assert [c.text for c in r.choices] == alone
    assert len(set(alone)) == 3
    assert r.usage.prompt_tokens == len(b"The cache")  # once, not three times
    assert r.usage.completion_tokens == 15
    again = client.completions.create(prompt="The cache", n=3, **_args())
    assert [c.text for c in again.choices] == alone


def test_prompt_list_choices_are_indexed_prompt_major(live):
    client, _ = live
    prompts = ["one prompt", "another"]
    r = client.completions.create(prompt=prompts, n=2, **_args())
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, p in enumerate(prompts):
        alone = client.completions.create(prompt=p, n=2, **_args())
        assert [c.text for c in r.choices[2 * i : 2 * i + 2]] == [c.text for c in alone.choices]
    assert r.usage.prompt_tokens == sum(len(p.encode()) for p in prompts)
    assert r.usage.completion_tokens == 4 * 5


def test_streamed_chat_choices_equal_the_whole_answer(live):
    client, _ = live
    messages = [{"role": "user", "content": "Hi there"}]
    whole = client.chat.completions.create(messages=messages, n=3, **_args())
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts, finishes, roles = {}, {}, set()
    stream = client.chat.completions.create(
        messages=messages, n=3, stream=True, stream_options={"include_usage": True}, **_args()
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.add(c.index)
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert roles == {0, 1, 2}
    assert [texts[j] for j in range(3)] == [c.message.content for c in whole.choices]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens == 15


def test_the_router_places_the_samples_once(live):
    client, hosts = live
    before = sum(h.engine.meter.requests_finished for h in hosts)
    client.completions.create(prompt="placed once, sampled four times", n=4, **_args())
    assert sum(h.engine.meter.requests_finished for h in hosts) == before + 1


def test_bad_n_is_a_400_naming_it(live):
    client, _ = live
    for n in (0, 129):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(prompt="x", n=n, **_args())
        assert e.value.body["param"] == "n"
