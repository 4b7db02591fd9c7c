"""The logits controls (logit_bias, min_tokens, the penalties, min_p) against a plain float64
reference written here, batched rows against each row alone, and greedy tokens through the
engine (the tiny model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixray.protocol import InvalidRequest, SamplingParams
from radixray.worker import Engine, EngineConfig
from radixray.worker.logits_controls import apply_controls, apply_min_p, token_counts
from radixray.worker.sampler import Sampler

VOCAB = 40
EOS = (0, 2)


# ------------------------------------------------------------------ the reference


def reference(row, p: SamplingParams, prompt, output, eos=EOS) -> np.ndarray:
    """Steps 1-4 of logits_controls' docstring, one row, plain Python over float64."""
    x = np.array(row, dtype=np.float64)
    for t, b in p.logit_bias:
        x[t] += b
    if len(output) < p.min_tokens:
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
        for t in stops:
            x[t] = -np.inf
    counts = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    seen = set(prompt) | set(output)
    for t in range(len(x)):
        if t in seen:
            r = p.repetition_penalty
            x[t] = x[t] / r if x[t] > 0 else x[t] * r
        c = counts.get(t, 0)
        x[t] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    return x


def min_p_reference(row, p: SamplingParams) -> np.ndarray:
    x = np.array(row, dtype=np.float64)
    z = x / max(p.temperature, 1e-5)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    return np.where(probs < p.min_p * probs.max(), -np.inf, x)


def logits(seed=0, n=4, vocab=VOCAB):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def histories(seed, n):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, VOCAB, rng.integers(1, 12)).tolist() for _ in range(n)]
    outputs = [rng.integers(0, VOCAB, rng.integers(0, 9)).tolist() for _ in range(n)]
    return prompts, outputs


CONTROLS = [
    {},
    {"logit_bias": {3: 100.0, 7: -100.0, 11: 2.5}},
    {"min_tokens": 50, "stop_token_ids": (5, 9)},
    {"min_tokens": 50, "stop_token_ids": (5,), "ignore_eos": True},
    {"presence_penalty": 1.5},
    {"presence_penalty": -2.0},
    {"frequency_penalty": 2.0},
    {"frequency_penalty": -0.7},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.6},
    {
        "logit_bias": {1: 4.0, 4: -3.0},
        "min_tokens": 50,
        "stop_token_ids": (1,),
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.8,
    },
]


# ------------------------------------------------------------------ each control, batched


@pytest.mark.parametrize("kw", CONTROLS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_control_matches_the_reference(kw, seed):
    lg = logits(seed)
    params = [SamplingParams(max_tokens=64, **kw)] * len(lg)
    prompts, outputs = histories(seed, len(lg))
    got = apply_controls(lg, params, prompts, outputs, EOS)
    for i in range(len(lg)):
        want = reference(lg[i].tolist(), params[i], prompts[i], outputs[i])
        np.testing.assert_allclose(got[i].double().numpy(), want, rtol=1e-6, atol=1e-5)


def test_mixed_rows_equal_each_row_alone_and_the_input_is_untouched():
    lg = logits(3, n=len(CONTROLS))
    before = lg.clone()
    params = [SamplingParams(max_tokens=64, **kw) for kw in CONTROLS]
    prompts, outputs = histories(3, len(lg))
    batched = apply_controls(lg, params, prompts, outputs, EOS)
    assert torch.equal(lg, before)
    for i in range(len(lg)):
        alone = apply_controls(lg[i : i + 1], params[i : i + 1], prompts[i : i + 1],
                               outputs[i : i + 1], EOS)  # fmt: skip
        assert torch.equal(batched[i], alone[0]), CONTROLS[i]
        want = reference(lg[i].tolist(), params[i], prompts[i], outputs[i])
        np.testing.assert_allclose(batched[i].double().numpy(), want, rtol=1e-6, atol=1e-5)


def test_a_batch_without_controls_is_returned_as_is():
    lg = logits(4)
    params = [SamplingParams(), SamplingParams(temperature=0.0, top_k=5, top_p=0.5)] * 2
    assert apply_controls(lg, params, [[1]] * 4, [[2]] * 4, EOS) is lg
    assert apply_min_p(lg, params, 1e-5) is lg
    assert not any(p.uses_controls for p in params)


def test_min_tokens_lifts_once_reached():
    lg = torch.zeros(2, VOCAB)
    p = SamplingParams(max_tokens=8, min_tokens=3, stop_token_ids=(9,))
    got = apply_controls(lg, [p, p], [[1], [1]], [[4, 4], [4, 4, 4]], EOS)
    assert torch.isinf(got[0, [0, 2, 9]]).all() and torch.isfinite(got[0, 1])
    assert torch.equal(got[1], lg[1])  # three generated: nothing held back


def test_token_counts_match_bincount():
    rows = [[1, 1, 5, 39], [], [0, 0, 0], [7]]
    got = token_counts(rows, VOCAB, "cpu")
    for i, r in enumerate(rows):
        assert got[i].tolist() == np.bincount(r, minlength=VOCAB).astype(float).tolist()


@pytest.mark.parametrize("min_p, temperature", [(0.05, 1.0), (0.3, 0.5), (0.9, 2.0), (1.0, 1.0)])
def test_min_p_matches_the_reference(min_p, temperature):
    lg = logits(5)
    params = [
        SamplingParams(min_p=min_p, temperature=temperature),
        SamplingParams(temperature=temperature),  # no min_p: untouched
        SamplingParams(min_p=min_p, temperature=0.0),  # greedy: min_p cannot change argmax
        SamplingParams(min_p=min_p / 2, temperature=temperature),
    ]
    got = apply_min_p(lg, params, 1e-5)
    assert torch.equal(got[1], lg[1]) and torch.equal(got[2], lg[2])
    for i in (0, 3):
        want = min_p_reference(lg[i].tolist(), params[i])
        assert np.array_equal(np.isinf(got[i].numpy()), np.isinf(want)), (i, min_p)
        assert torch.isfinite(got[i]).sum() >= 1


def test_min_p_restricts_what_the_sampler_draws():
    lg = logits(6, n=1, vocab=100)
    p = SamplingParams(min_p=0.2, temperature=1.0)
    keep = set(np.flatnonzero(np.isfinite(min_p_reference(lg[0].tolist(), p))).tolist())
    s = Sampler(0)
    draws = {s.sample(lg, ["r"], [p])[0] for _ in range(300)}
    assert draws <= keep


# ------------------------------------------------------------------ the sampler


def test_greedy_with_controls_is_the_argmax_of_the_reference():
    lg = logits(7, n=len(CONTROLS))
    params = [SamplingParams(max_tokens=64, temperature=0.0, **kw) for kw in CONTROLS]
    prompts, outputs = histories(7, len(lg))
    got = Sampler(0, EOS).sample(lg, [str(i) for i in range(len(lg))], params, prompts, outputs)
    for i in range(len(lg)):
        want = reference(lg[i].tolist(), params[i], prompts[i], outputs[i])
        assert got[i] == int(np.argmax(want)), CONTROLS[i]


def test_seeded_rows_without_controls_do_not_change_beside_rows_with_them():
    lg = logits(8, n=4)
    plain = [SamplingParams(seed=11, temperature=0.8), SamplingParams(seed=12, top_k=5)]
    mixed = [plain[0], SamplingParams(presence_penalty=2.0, min_p=0.1, seed=3), plain[1],
             SamplingParams(logit_bias={1: 100.0}, temperature=0.0)]  # fmt: skip
    prompts, outputs = histories(8, 4)
    s = Sampler(0, EOS)
    got = [s.sample(lg, ["a", "b", "c", "d"], mixed, prompts, outputs) for _ in range(5)]
    s0, s1 = Sampler(0, EOS), Sampler(0, EOS)
    alone = [(s0.sample(lg[0:1], ["a"], [plain[0]])[0], s1.sample(lg[2:3], ["c"], [plain[1]])[0])
             for _ in range(5)]  # fmt: skip
    assert [(g[0], g[2]) for g in got] == alone
    assert all(g[3] == 1 for g in got)


@pytest.mark.parametrize("r", [1e-30, 1e-45, 5e-324, 1e30, 1e300])
def test_extreme_repetition_penalties_still_sample(r):
    lg = logits(9, n=2)
    params = [SamplingParams(repetition_penalty=r, temperature=0.01, min_p=0.1, seed=1),
              SamplingParams(repetition_penalty=r, temperature=0.0)]  # fmt: skip
    prompts = [list(range(VOCAB))] * 2
    lg[:, 5] = 0.0  # a zero logit times an infinite penalty would be NaN
    got = Sampler(0, EOS).sample(lg, ["a", "b"], params, prompts, [[], []])
    assert all(0 <= t < VOCAB for t in got)
    assert not apply_controls(lg, params, prompts, [[], []], EOS).isnan().any()
    if r < 1:  # every positive logit became +inf: the draw is among them
        assert lg[0, got[0]] > 0 and lg[1, got[1]] > 0


# ------------------------------------------------------------------ the protocol


@pytest.mark.parametrize(
    "field, value",
    [
        ("min_p", 1.5),
        ("min_p", -0.01),
        ("min_p", float("nan")),
        ("presence_penalty", 2.01),
        ("frequency_penalty", -3),
        ("frequency_penalty", True),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
        ("logit_bias", {1: 101}),
        ("logit_bias", {-1: 1}),
        ("logit_bias", {"1": 1}),
        ("logit_bias", [(1, 2, 3)]),
        ("min_tokens", -1),
        ("min_tokens", 17),  # > max_tokens (16)
        ("min_tokens", 1.0),
    ],
)
def test_sampling_params_refuse_bad_controls(field, value):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert info.value.message.startswith(f"SamplingParams.{field} must be ")


def test_logit_bias_is_normalized_to_sorted_pairs():
    p = SamplingParams(logit_bias={9: 1, 2: -5.5})
    assert p.logit_bias == ((2, -5.5), (9, 1.0))
    assert p == SamplingParams(logit_bias=[(9, 1.0), (2, -5.5)])
    assert p.uses_controls and not SamplingParams().uses_controls


# ------------------------------------------------------------------ through the engine


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))


PROMPT = "the quick brown fox jumps over the lazy dog, again and again and"


def run(engine, n=20, **kw):
    params = SamplingParams(max_tokens=n, temperature=0.0, **kw)
    return engine.generate_batch([PROMPT], params)[0]


def test_engine_steps_take_the_argmax_of_the_reference(engine):
    """Every greedy step's token is the argmax of the reference applied to that step's logits
    (the engine's history: prompt and tokens so far)."""
    seen = []
    real = engine.sampler.sample

    def spy(lg, ids, params, prompts, outputs, **kw):
        out = real(lg, ids, params, prompts, outputs, **kw)
        for i, p in enumerate(params):
            want = reference(lg[i].tolist(), p, prompts[i], outputs[i], engine.sampler.eos_ids)
            seen.append((out[i], int(np.argmax(want))))
        return out

    engine.sampler.sample = spy
    try:
        kw = {"presence_penalty": 1.0, "frequency_penalty": 0.5, "repetition_penalty": 1.5}
        out = run(engine, 16, ignore_eos=True, logit_bias={ord("e"): 3.0}, **kw)
    finally:
        del engine.sampler.sample
    assert len(seen) == 16 and len(out.token_ids) == 16
    assert all(got == want for got, want in seen), seen


def test_logit_bias_forces_a_token(engine):
    out = run(engine, 6, ignore_eos=True, logit_bias={ord("Q"): 100.0})
    assert out.token_ids == [ord("Q")] * 6 and out.text == "QQQQQQ"
    out = run(engine, 6, ignore_eos=True, logit_bias={ord("Q"): 100.0, ord("Z"): 100.0})
    assert set(out.token_ids) <= {ord("Q"), ord("Z")}


def test_a_large_presence_penalty_prevents_repeats(engine):
    base = run(engine, 24, ignore_eos=True)
    assert len(set(base.token_ids)) <= 12  # the tiny model repeats itself without it
    out = run(engine, 24, ignore_eos=True, presence_penalty=2.0)
    assert len(set(out.token_ids)) > len(set(base.token_ids))
    out = run(engine, 24, ignore_eos=True, presence_penalty=2.0, frequency_penalty=2.0)
    assert len(set(out.token_ids)) == 24, out.token_ids


def test_min_tokens_delays_eos(engine):
    eos = 258  # <|im_end|>, one of the tiny model's stop tokens
    out = run(engine, 20, logit_bias={eos: 100.0})
    assert out.token_ids == [eos] and out.finish_reason == "stop"
    out = run(engine, 20, logit_bias={eos: 100.0}, min_tokens=5)
    assert len(out.token_ids) == 6 and out.token_ids[-1] == eos
    assert not set(out.token_ids[:5]) & set(engine.sampler.eos_ids)
    assert out.finish_reason == "stop" and out.completion_tokens == 6


def test_min_tokens_holds_stop_strings_back(engine):
    out = run(engine, 10, ignore_eos=True, logit_bias={ord("Q"): 100.0}, stop=("Q",))
    assert out.text == "" and out.finish_reason == "stop" and len(out.token_ids) == 1
    out = run(engine, 10, ignore_eos=True, logit_bias={ord("Q"): 100.0}, stop=("Q",), min_tokens=3)
    assert out.text == "QQQ" and out.finish_reason == "stop" and len(out.token_ids) == 4


def test_stop_token_ids_end_the_request(engine):
    base = run(engine, 20, ignore_eos=True).token_ids
    k = next(i for i in range(3, 20) if base[i] not in base[:i])
    out = run(engine, 20, ignore_eos=True, stop_token_ids=(base[k],))
    assert out.token_ids == base[: k + 1] and out.finish_reason == "stop"
    # min_tokens holds a stop token back too.
    out = run(engine, 20, ignore_eos=True, stop_token_ids=(base[k],), min_tokens=k + 2)
    assert base[k] not in out.token_ids[: k + 2]


def test_requests_without_controls_are_unchanged_beside_ones_with_them(engine):
    plain = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
             SamplingParams(max_tokens=12, temperature=0.9, seed=4, ignore_eos=True)]  # fmt: skip
    alone = [engine.generate_batch([PROMPT], p)[0].token_ids for p in plain]
    loud = SamplingParams(max_tokens=12, temperature=0.7, seed=1, presence_penalty=2.0,
                          logit_bias={5: 5.0}, min_tokens=3, ignore_eos=True)  # fmt: skip
    outs = engine.generate_batch([PROMPT, PROMPT + " x", PROMPT], [plain[0], loud, plain[1]])
    assert [outs[0].token_ids, outs[2].token_ids] == alone


def test_out_of_vocabulary_ids_are_refused_by_the_engine(engine):
    for kw, field in (({"logit_bias": {10**6: 1.0}}, "logit_bias"),
                      ({"stop_token_ids": (10**6,)}, "stop_token_ids")):  # fmt: skip
        with pytest.raises(InvalidRequest) as info:
            engine.add_request("hi", SamplingParams(**kw))
        assert info.value.param == field
