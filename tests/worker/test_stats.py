from radixray.step_cost import StepCostModel, fit_moments, sum_moments


def test_fit_separates_step_overhead_from_the_marginal_rate():
    m = StepCostModel()
    assert m.fit() is None
    for tokens in (16, 512, 64, 2048, 128, 1024) * 4:
        m.update(tokens, 0.05 + tokens / 4000.0)  # 50 ms per step + 4000 tokens/s
    overhead, rate = m.fit()
    assert abs(overhead - 0.05) < 1e-6 and abs(rate - 4000.0) < 1e-3


def test_two_identical_workers_with_different_prompt_mixes_report_the_same_rate():
    short, long_ = StepCostModel(), StepCostModel()
    for i in range(40):
        short.update(32 + (i % 4) * 16, 0.05 + (32 + (i % 4) * 16) / 4000.0)
        long_.update(1500 + (i % 4) * 200, 0.05 + (1500 + (i % 4) * 200) / 4000.0)
    # A tokens/seconds ratio would say ~580 vs ~3600 tokens/s for the same hardware.
    assert abs(short.fit()[1] - long_.fit()[1]) < 1.0


def test_without_spread_in_step_sizes_it_falls_back_to_the_ratio():
    m = StepCostModel()
    for _ in range(5):
        m.update(100, 0.5)
    overhead, rate = m.fit()
    assert overhead == 0.0 and abs(rate - 200.0) < 1e-9


def test_workers_that_each_saw_one_step_size_together_fit_overhead_and_rate():
    # Alone, a worker that only prefilled 100-token steps can only report a ratio (1333 tok/s)
    # and one that only saw 1000-token steps another (3333 tok/s): same hardware, 2.5x apart.
    a, b = StepCostModel(), StepCostModel()
    for _ in range(10):
        a.update(100, 0.05 + 100 / 4000.0)
        b.update(1000, 0.05 + 1000 / 4000.0)
    assert a.fit()[0] == 0.0 and b.fit()[0] == 0.0
    assert round(a.fit()[1]) == 1333 and round(b.fit()[1]) == 3333
    overhead, rate = fit_moments(sum_moments([a.moments, b.moments]))
    assert abs(overhead - 0.05) < 1e-9 and abs(rate - 4000.0) < 1e-6


def test_fit_moments_before_any_step_is_none():
    assert fit_moments([0.0] * 5) is None
    assert fit_moments(sum_moments([])) is None


def test_the_reported_costs_are_of_the_step_period_not_the_forward():
    """A router prices a queue by the rate it drains at: tokens per step period (forward plus
    scheduling, sampling, streaming out), not per forward pass. Steps of 100 and 300 prefill
    tokens whose forwards take 0.01 + t / 10,000 s and whose periods are twice that fit 0.02 s
    and 5,000 tokens/s; decode-only steps report their period too."""
    from radixray.worker.stats import EngineStats

    s = EngineStats()
    for tokens in (100, 300) * 4:
        forward = 0.01 + tokens / 10_000
        s.record_step((2, 64, tokens, tokens * tokens // 2), forward, 2 * forward)
    s.record_step((4, 128, 0, 0), 0.005, 0.008)
    d = s.as_dict()
    assert abs(d["prefill_overhead_s"] - 0.02) < 1e-9
    assert abs(d["prefill_tokens_per_s"] - 5_000) < 1e-6
    assert d["decode_step_s"] == 0.008
    assert d["decode_tokens_per_s"] == 4 / 0.008
    # the step log keeps both
    assert s.step_log[-1][-2:] == (0.005, 0.008)
