"""The engine on the real embedded model (SmolLM2-135M-Instruct, float32 on CPU)."""

from __future__ import annotations

import pytest

from radixray.worker import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(smollm2_loaded):
    return smollm2_loaded


def chat(tok, question: str, system: str | None = None) -> str:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}
    ]
    return tok.apply_chat_template(msgs, add_generation_prompt=True)


def test_capital_of_france(loaded):
    e = Engine(EngineConfig(model="smollm2", page_size=16, num_pages=256), loaded=loaded)
    out = e.generate_batch(
        [chat(e.tokenizer, "What is the capital of France?")],
        SamplingParams(max_tokens=24, temperature=0.0),
    )[0]
    assert "Paris" in out.text, out.text
    assert out.finish_reason in ("stop", "length")


def test_real_model_reuse_is_exact(loaded):
    """Greedy tokens with the radix cache (and a second, warm pass) equal those with reuse off."""
    system = "You are a terse geography tutor. Answer in one short sentence. " * 3
    questions = ["Where is Lyon?", "What river flows through Paris?", "Name a French cheese."]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    cold = Engine(EngineConfig(model="smollm2", cache="chunk", num_pages=256), loaded=loaded)
    tok = cold.tokenizer
    prompts = [chat(tok, q, system) for q in questions]
    want = [o.token_ids for o in cold.generate_batch(prompts, params)]
    warm = Engine(EngineConfig(model="smollm2", cache="radix", num_pages=256), loaded=loaded)
    first = warm.generate_batch(prompts, params)
    second = warm.generate_batch(prompts, params)
    assert [o.token_ids for o in first] == want
    assert [o.token_ids for o in second] == want
    # The shared system prompt was computed once: later requests reused it.
    assert first[1].cached_tokens > 0 or first[2].cached_tokens > 0
    # The same prompts again: every whole page (of 16) but the last token's, exactly.
    assert [o.cached_tokens for o in second] == [(o.prompt_tokens - 1) // 16 * 16 for o in second]
    warm.check_integrity()


def test_structured_output_on_the_real_vocabulary(loaded):
    """A 49k BPE vocabulary (multi-byte tokens): the answer follows the schema and still says
    what the model knows."""
    import json

    import jsonschema

    from radixray.protocol import GrammarSpec

    schema = {
        "type": "object",
        "properties": {
            "country": {"type": "string", "maxLength": 20},
            "capital": {"type": "string", "maxLength": 20},
            "continent": {"enum": ["Europe", "Asia", "Africa", "America", "Oceania"]},
        },
        "required": ["country", "capital", "continent"],
        "additionalProperties": False,
    }
    e = Engine(EngineConfig(model="smollm2", page_size=16, num_pages=256), loaded=loaded)
    q = "Answer in JSON with country, capital and continent: what is the capital of France?"
    params = SamplingParams(
        max_tokens=80, temperature=0.0, grammar=GrammarSpec("json_schema", json.dumps(schema))
    )
    out = e.generate_batch([chat(e.tokenizer, q)], params)[0]
    assert out.finish_reason == "stop", out.text
    value = json.loads(out.text)
    jsonschema.validate(value, schema)
    assert value["capital"] == "Paris" and value["continent"] == "Europe", value
