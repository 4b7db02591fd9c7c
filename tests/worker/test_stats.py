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
