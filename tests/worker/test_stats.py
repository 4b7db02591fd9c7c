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


def test_decode_cost_is_the_slope_of_step_period_against_batch():
    """Decode-only steps of 1 to 8 sequences at 20 ms + 3 ms a sequence: the report says 3 ms a
    sequence, and the mean tokens the sequences that ended decoded. While every decode step had
    one sequence the slope cannot be told from the fixed cost: no decode cost (None), not the
    20 ms step charged to one sequence."""
    from radixray.worker.stats import EngineStats

    s = EngineStats()
    for _ in range(6):
        s.record_step((1, 64, 0, 0), 0.02, 0.023)
    assert s.as_dict()["decode_seq_s"] is None
    for batch in (1, 4, 8, 2) * 6:
        s.record_step((batch, 64 * batch, 0, 0), 0.02, 0.02 + 0.003 * batch)
    d = s.as_dict()
    assert abs(d["decode_seq_s"] - 0.003) < 1e-9
    assert d["answer_tokens"] is None
    for tokens in (10, 30, 20):
        s.record_answer(tokens)
    d = s.as_dict()
    assert d["completion_tokens"] == 60
    expected = 10.0
    for tokens in (30, 20):
        expected += (tokens - expected) / 64
    assert abs(d["answer_tokens"] - expected) < 1e-9


def test_decode_costs_pool_over_a_class_and_unknown_ones_borrow_the_mean():
    """Two workers of one class saw one batch size each (1 and 8): neither alone has a slope,
    together they have 3 ms a sequence. A worker of another class with nothing separable borrows
    that mean; with no fit anywhere the cost is 0 (left out), never a guess."""
    from radixray.step_cost import pooled_decode_seq_s

    a, b, c = StepCostModel(), StepCostModel(), StepCostModel()
    for _ in range(5):
        a.update(1, 0.02 + 0.003)
        b.update(8, 0.02 + 0.003 * 8)
        c.update(4, 0.05)
    fleet = [("a", "gpu", a.moments), ("b", "gpu", b.moments), ("c", "cpu", c.moments)]
    costs = pooled_decode_seq_s([*fleet, ("d", None, None)])
    assert abs(costs["a"] - 0.003) < 1e-9 and costs["a"] == costs["b"]
    assert costs["c"] == costs["d"] == costs["a"]
    alone = pooled_decode_seq_s([("a", None, a.moments), ("c", None, c.moments)])
    assert alone == {"a": 0.0, "c": 0.0}
