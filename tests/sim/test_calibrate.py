"""The measured timing model: the engine logs each step's shape exactly, the fit recovers a known
model, and `radixray sim calibrate` writes a file `radixray sim --timing` reads."""

from __future__ import annotations

import itertools
import json

import pytest

from radixray.protocol import SamplingParams
from radixray.sim.calibrate import fit_timing
from radixray.sim.sim_cli import main as sim_main
from radixray.sim.timing import TimingModel, load_timing
from radixray.worker import Engine, EngineConfig


def test_the_engine_logs_each_steps_shape_in_the_timing_models_terms():
    e = Engine(EngineConfig(model="tiny", page_size=4, max_batch_tokens=64, enable_events=False))
    try:
        e.meter.step_log.clear()
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        e.generate_batch([list(range(20, 25)), list(range(40, 49))], params)
        shapes = [s[:4] for s in e.meter.step_log]
        # one prefill step of 5 + 9 tokens (token j attends to j + 1 positions: 15 + 45), then
        # two decode steps at positions 5 and 9 (contexts 6 + 10), then 7 + 11
        assert shapes == [(0, 0, 14, 10 + 36), (2, 16, 0, 0), (2, 18, 0, 0)]
        assert all(s[4] > 0 for s in e.meter.step_log)
        # 64 new tokens over a cached 16-token prefix: chunked at max_batch_tokens, each chunk's
        # tokens attending to the prefix and to the chunks before them
        e.meter.step_log.clear()
        e.generate_batch([list(range(100, 117))], SamplingParams(max_tokens=1))
        e.generate_batch(
            [list(range(100, 116)) + list(range(200, 264))], SamplingParams(max_tokens=1)
        )
        (cold,), (warm,) = [[s[:4]] for s in e.meter.step_log]
        assert cold == (0, 0, 17, 17 * 16 // 2)
        assert warm == (0, 0, 64, 64 * 16 + 64 * 63 // 2)
    finally:
        e.shutdown()


def test_the_fit_recovers_a_known_model_exactly():
    truth = TimingModel(0.02, 0.004, 3e-6, 0.0015, 2e-8, 512, 32)
    samples = []
    for b, ctx, n, pos in itertools.product((0, 1, 8, 16), (64, 900), (0, 32, 512), (0, 300)):
        if not b and not n:
            continue
        d_ctx = b * ctx
        ctx_sum = n * pos + n * (n - 1) // 2
        samples.append((b, d_ctx, n, ctx_sum, truth.step_time(b, d_ctx, n, ctx_sum)))
    model, report = fit_timing(samples, 512, 32)
    for name in ("step_overhead_s", "decode_seq_s", "decode_ctx_s", "prefill_token_s",
                 "prefill_attn_s"):  # fmt: skip
        assert getattr(model, name) == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-12)
    assert report["median_rel_error"] < 1e-9
    # a term the data would make negative is dropped, never negative
    noisy = [(b, c, n, s, max(t - 0.0005 * b, 1e-4)) for b, c, n, s, t in samples]
    model, _ = fit_timing(noisy, 512, 32)
    assert min(model.step_overhead_s, model.decode_seq_s, model.decode_ctx_s,
               model.prefill_attn_s) >= 0 and model.prefill_token_s > 0  # fmt: skip
    with pytest.raises(ValueError, match="at least 5 step samples"):
        fit_timing(samples[:3], 512, 32)


def test_calibrate_writes_a_model_that_sim_reads(tmp_path, capsys):
    out = tmp_path / "timing.json"
    assert sim_main(["calibrate", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    model = load_timing(str(out))
    assert model.prefill_token_s > 0 and model.max_batch_tokens == 1024
    assert data["fit"]["samples"] == len(data["samples"]) > 5
    # the load-back fitted to the engine's own copies (a 64-page host tier unless told)
    assert model.load_bytes_per_s > 0 and model.load_overhead_s >= 0
    assert model.overlap_layers == 0  # on the CPU the copies and the forward run in series
    tiny = Engine(EngineConfig(model="tiny", enable_events=False))
    try:
        assert model.kv_bytes_per_token == tiny.pool.page_bytes // tiny.page_size
    finally:
        tiny.shutdown()
    capsys.readouterr()
    argv = ["--workload", "hot_prefix", "--limit", "200", "--workers", "2", "--no-progress"]
    assert sim_main([*argv, "--policies", "ttft", "--timing", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith("bound")
    assert sim_main([*argv, "--policies", "ttft", "--timing", str(out), "--host-pages", "64"]) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith("bound")
    assert sim_main([*argv, "--timing", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"step_overhead_s": 0.01}')
    assert sim_main([*argv, "--timing", str(tmp_path / "bad.json")]) == 2
    assert "needs the fields" in capsys.readouterr().err


def test_calibrate_measures_again_when_a_round_fits_no_prefill_cost(monkeypatch, tmp_path, capsys):
    """A round whose samples fit no positive cost per prefill token (a busy machine's burst) is
    measured again; the fit of a later round is written. Three such rounds in a row: the error."""
    import radixray.sim.calibrate as calibrate

    good = [
        (b, 64 * b, t, t * t // 2, 0.01 + 0.002 * b + 0.001 * t)
        for b in (0, 1, 4)
        for t in (0, 64, 512)
    ]
    noisy = [(b, 64 * b, 0, 0, 0.01 + 0.002 * b) for b in (1, 2, 4, 8, 16, 32)]  # no prefill
    rounds = iter([noisy, noisy, good])
    monkeypatch.setattr(calibrate, "probe_engine", lambda *a, **k: next(rounds))
    out = tmp_path / "timing.json"
    assert calibrate.main(["--model", "tiny", "--quick", "--out", str(out)]) == 0
    assert "measuring again, round 2 of 3" in capsys.readouterr().err
    assert load_timing(str(out)).prefill_token_s == pytest.approx(0.001, rel=1e-6)
    monkeypatch.setattr(calibrate, "probe_engine", lambda *a, **k: noisy)
    with pytest.raises(ValueError, match="positive cost per prefill token"):
        calibrate.main(["--model", "tiny", "--quick", "--out", str(out)])


def test_probes_time_steps_by_the_period_where_the_forward_only_queues(monkeypatch):
    """On CUDA (step_clock "period") a sample's seconds are each step's period, not the clock
    of its forward, which stops once the kernels are queued; probes are skipped past a
    deadline."""
    import radixray.sim.calibrate as calibrate

    sizes = calibrate.ProbeSizes((16, 32), (1,), (16,), 2, 1)
    tiny = Engine(EngineConfig(model="tiny", enable_events=False))
    try:
        assert calibrate.step_clock(tiny) == "forward"
        forward = calibrate.probe_engine(tiny, sizes=sizes)
        log = list(tiny.meter.step_log)  # the last probe's measured run
        assert log and forward[-len(log) :] == [s[:5] for s in log]
        monkeypatch.setattr(calibrate, "step_clock", lambda engine: "period")
        period = calibrate.probe_engine(tiny, sizes=sizes)
        log = list(tiny.meter.step_log)
        assert period[-len(log) :] == [(*s[:4], s[5]) for s in log]
        assert calibrate.probe_engine(tiny, sizes=sizes, deadline=0.0) == []
    finally:
        tiny.shutdown()


def test_a_gpu_kit_file_makes_the_gpu_preset_measured(tmp_path):
    """measured_preset (timing.py's one-line change): the file's step and load-back figures, the
    preset's batch limits, bytes a token and layers; a file of other shapes is refused."""
    from radixray.sim.calibrate import timing_record
    from radixray.sim.timing import TIMING_PRESETS, measured_preset

    gpu = TIMING_PRESETS["gpu"]
    fitted = TimingModel(0.004, 2e-5, 3e-9, 4e-5, 1e-11, 8192, 32, gpu.kv_bytes_per_token,
                         40e9, 1e-5, overlap_layers=32)  # fmt: skip
    path = tmp_path / "timing_NVIDIA-H100_2026-12-07_llama-3.1-8b-shapes.json"
    path.write_text(json.dumps(timing_record(fitted, {"samples": 40}, [], device="H100")))
    got = measured_preset(gpu, path)
    assert got == fitted.with_(max_running=gpu.max_running)  # 256, the preset's
    path.write_text(json.dumps(fitted.with_(kv_bytes_per_token=46080).to_dict()))
    with pytest.raises(ValueError, match="kv_bytes_per_token=46080, the preset models 131072"):
        measured_preset(gpu, path)
    with pytest.raises(ValueError, match=r"no such timing file: .*radixray/sim/nope\.json"):
        measured_preset(gpu, "nope.json")  # a bare name: the file copied beside timing.py
