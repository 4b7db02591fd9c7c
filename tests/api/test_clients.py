"""Clients nobody here wrote, unmodified, against a real server: the OpenAI Agents SDK's default
model (the Responses API) through a function-tool loop, plain and streamed, on a router over
in-process workers; instructor extracting a pydantic object from SmolLM2 in its JSON-schema and
tools modes, 10 seeded tries each at temperature 0.8 (benchmarks/bench_instructor.py runs 20)."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from ..router.serving import served, worker_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def router_url():
    with served("router") as (url, _):
        yield url


def _agent(url: str, calls: list[str]):
    """An agent whose model is the SDK's default (the Responses API, through the default
    client), with one function tool that records its calls."""
    from agents import (
        Agent,
        ModelSettings,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace export to OpenAI's servers
    set_default_openai_api("responses")
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    set_default_openai_client(client, use_for_tracing=False)

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    # The first turn must call the tool (the tiny model would not choose to); the SDK resets
    # the choice to auto after a call, so the second turn answers, in the output type's JSON
    # (structured output ends it where the random tiny model would not stop).
    settings = ModelSettings(
        tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=0
    )
    return Agent(
        name="weather",
        instructions="Answer with the tool.",
        model="tiny",
        tools=[get_weather],
        model_settings=settings,
        output_type=Report,
    )


class Report(BaseModel):
    sky: Literal["sunny", "rainy"]


def _check_run(result, calls: list[str]) -> None:
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item"
    assert len(calls) == 1 and calls[0] in ("Paris", "Oslo")
    assert result.new_items[1].output == f"It is sunny in {calls[0]}."
    assert isinstance(result.final_output, Report)
    # Two model calls, each a Responses API response from this server.
    assert [r.response_id.startswith("resp_") for r in result.raw_responses] == [True, True]


def test_the_agents_sdk_runs_a_tool_loop(router_url):
    from agents import Runner

    calls: list[str] = []
    result = asyncio.run(Runner.run(_agent(router_url, calls), "Weather in Oslo?", max_turns=4))
    _check_run(result, calls)


def test_the_agents_sdk_runs_a_tool_loop_streamed(router_url):
    from agents import Runner

    calls: list[str] = []

    async def run():
        result = Runner.run_streamed(_agent(router_url, calls), "Weather in Paris?", max_turns=4)
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds

    result, kinds = asyncio.run(run())
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    _check_run(result, calls)


class City(BaseModel):
    # No ``extra="forbid"``: its schema says nothing of additionalProperties, as most
    # libraries' models do, and the server must not let the answer add any.
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=100)


TEXT = "Paris is the capital of France. About 2 million people live there."


@pytest.fixture(scope="module")
def smollm2_url():
    server, host = worker_server("w0", model="smollm2", num_pages=2048)
    try:
        with server as url:
            yield url
    finally:
        host.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_extracts_the_object_every_time(smollm2_url, mode):
    import instructor

    client = instructor.from_openai(
        openai.AsyncOpenAI(base_url=f"{smollm2_url}/v1", api_key="x", max_retries=0, timeout=300),
        mode=getattr(instructor.Mode, mode),
    )

    async def extract(seed: int):
        return await client.chat.completions.create_with_completion(
            model="smollm2",
            response_model=City,
            messages=[{"role": "user", "content": f"Extract the city: {TEXT}"}],
            temperature=0.8,
            max_tokens=120,
            seed=seed,
            max_retries=0,  # no re-ask: every try must parse the first time
        )

    async def all_tries():
        return await asyncio.gather(*(extract(seed) for seed in range(10)))

    answers = asyncio.run(all_tries())
    cities = [city for city, _ in answers]
    assert len(cities) == 10 and all(isinstance(c, City) for c in cities)
    for _, completion in answers:  # the raw JSON: no property the schema did not name
        message = completion.choices[0].message
        raw = message.tool_calls[0].function.arguments if mode == "TOOLS" else message.content
        assert set(json.loads(raw)) == set(City.model_fields), raw
    assert sum(c.country.lower() == "france" for c in cities) >= 5, [c.country for c in cities]
