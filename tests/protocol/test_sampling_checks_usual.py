"""``check_sampling_params`` decides a usual request in one test (``_usual``) and sends every
other through the field-by-field checks (``_check_each``, the checks as they were): on random
params, valid and not (bools, ints for floats, NaN, out of range, lists, empty and non-empty
containers), both raise the same error or leave the same fields."""

from __future__ import annotations

import math
import random

import msgspec

from radixray.protocol import InvalidRequest, SamplingParams
from radixray.protocol.sampling_checks import _check_each, check_sampling_params

CHOICES = {
    "max_tokens": [1, 16, 0, -1, True, 2.0],
    "temperature": [0.0, 0.7, 1, 100.0, 100.5, -0.1, True, math.nan, "1"],
    "top_p": [1.0, 0.5, 0.0, 1, 1.5, False],
    "top_k": [-1, 1, 40, 0, -2, True, 3.0],
    "seed": [None, 0, 7, -(2**63), 2**63, True, 1.5],
    "stop": [(), ("a",), ("a", "bc"), ("",), ["x"], "x", (1,)],
    "stop_token_ids": [(), (2, 3), [4], (-1,), (True,)],
    "min_p": [0.0, 0, 0.1, 1.5, False],
    "presence_penalty": [0.0, 0.5, -3.0],
    "frequency_penalty": [0.0, 2.0, True],
    "repetition_penalty": [1.0, 1, 1.2, 0.0, math.inf],
    "logit_bias": [(), {}, [], {5: 1}, ((5, 1.0),), None, {3: 200}],
    "min_tokens": [0, 1, 20, -1, False],
    "logprobs": [None, 0, 5, 21, True],
    "prompt_logprobs": [None, 2, -1],
    "n": [1, 4, 0, 129, True],
}


def _params(values: dict) -> SamplingParams:
    p = SamplingParams()
    for name, v in values.items():
        msgspec.structs.force_setattr(p, name, v)
    return p


def _outcome(check, values: dict):
    p = _params(values)
    try:
        check(p)
    except InvalidRequest as e:
        return "raised", str(e), e.param
    return "ok", msgspec.structs.asdict(p)


def test_the_usual_path_decides_as_the_field_by_field_checks():
    rng = random.Random(0)
    usual = 0
    for _ in range(3000):
        # mostly valid values, each field off its usual one now and then
        values = {k: (c[0] if rng.random() < 0.8 else rng.choice(c)) for k, c in CHOICES.items()}
        got = _outcome(check_sampling_params, values)
        assert got == _outcome(_check_each, values), values
        usual += got[0] == "ok"
    assert usual > 300


def test_a_usual_request_from_the_edge_is_normalised_as_before():
    p = SamplingParams(max_tokens=4, temperature=0.0, stop=("\n",), logit_bias={})
    assert p.logit_bias == () and type(p.logit_bias) is tuple and p.stop == ("\n",)
