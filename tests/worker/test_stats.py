from radixray.worker.stats import StepCostModel


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
