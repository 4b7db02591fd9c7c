"""The grammar that enforces a forced ``tool_choice`` (``radixray/api/tool_grammar.py``), in each
template family's syntax: answers sampled at random from the tokens the grammar allows (what a
model of random weights could write) always parse with that family's parser into calls of the
given tools whose arguments validate against the tool's parameters."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from radixray.api.tool_calls import parser_for
from radixray.api.tool_grammar import tool_choice_grammar
from radixray.api.tool_schemas import NamedToolChoice, Tool
from radixray.model_meta import load_model_meta
from radixray.worker.grammar import GrammarCompiler

from .test_tools import FORCED_TOOLS, NO_ARGUMENTS

TOOLS = [Tool(**t) for t in FORCED_TOOLS]
SCHEMAS = {t.function.name: t.function.parameters or NO_ARGUMENTS for t in TOOLS}


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(load_model_meta("tiny").tokenizer)


def _sample(compiler, spec, seed: int, steps: int = 3000) -> str:
    """One answer drawn uniformly from the allowed tokens at each step, up to the stop token."""
    rnd, m, ids = random.Random(seed), compiler.matcher(spec.kind, spec.spec), []
    mask = compiler.new_bitmask(1)
    for _ in range(steps):
        m.fill(mask[0])
        words = mask[0].tolist()
        allowed = [i for i in range(compiler.vocab_size) if words[i // 32] >> (i % 32) & 1]
        tok = rnd.choice(allowed)
        assert m.accept(tok), m.error
        if tok in compiler.vocab.stop_ids:
            break
        ids.append(tok)
        if m.done:  # nothing but the stop token could follow
            break
    else:
        pytest.fail("the sampled answer did not end")
    return load_model_meta("tiny").tokenizer.decode(ids)


@pytest.mark.parametrize("family", [None, "hermes", "llama3_json"])
@pytest.mark.parametrize(
    ("choice", "parallel"),
    [
        ("required", True),
        ("required", False),
        (NamedToolChoice(type="function", function={"name": "add"}), True),
    ],
    ids=["required", "one", "named"],
)
def test_every_sampled_answer_is_valid_calls(compiler, family, choice, parallel):
    spec = tool_choice_grammar(TOOLS, choice, family, parallel)
    assert spec.kind == "grammar"
    counts = []
    for seed in range(12):
        text = _sample(compiler, spec, seed)
        content, calls = parser_for(family, parallel).parse(text)
        assert content is None and calls, text
        counts.append(len(calls))
        for c in calls:
            name = c["function"]["name"]
            assert name == "add" if isinstance(choice, NamedToolChoice) else name in SCHEMAS
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
    if choice == "required" and parallel:
        assert max(counts) > 1, counts  # one or more calls
    else:
        assert set(counts) == {1}, counts


def test_only_a_forcing_choice_has_a_grammar():
    for choice in (None, "auto", "none"):
        assert tool_choice_grammar(TOOLS, choice, None) is None
    assert tool_choice_grammar(None, "required", None) is None


def test_the_calls_are_written_as_the_family_writes_them(compiler):
    """The JSON of a call is spaced as the families' own prompts write it."""
    named = NamedToolChoice(type="function", function={"name": "now"})
    hermes = _sample(compiler, tool_choice_grammar(TOOLS, named, "hermes"), 0)
    assert hermes == '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    llama = _sample(compiler, tool_choice_grammar(TOOLS, named, "llama3_json"), 0)
    assert llama == '{"name": "now", "parameters": {}}'
