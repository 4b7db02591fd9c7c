"""One source for every setting: the config dataclasses hold the defaults, the command-line flags
are generated from them, and the Serve config, the helm values, the simulator and the benchmark
harness agree with them."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from radixray.bench.local_cluster import WorkerSpec
from radixray.cli import _engine_config, build_parser
from radixray.deploy.serve_config import (
    RouterDeploymentConfig,
    ServeAppConfig,
    WorkerDeploymentConfig,
)
from radixray.router.service import RouterSettings
from radixray.settings import add_arguments, defaults, from_args, gb_to_bytes, setting
from radixray.sim.simulator import SimConfig
from radixray.sim.timing import DEFAULT_TIMING, TIMING_PRESETS
from radixray.worker.engine_config import EngineConfig
from radixray.worker.scheduler import SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class _Demo:
    size: int = setting(8, "how many")
    name: str | None = setting(None, "what it is called")
    mode: str = setting("a", "which mode", choices=("a", "b"))
    fast: bool = setting(True, "go fast")
    budget: int | None = setting(None, "in GB", flag="--budget-gb", type=float, convert=gb_to_bytes)
    hidden: bool = setting(False, "tests only", cli=False)
    ratio: float = setting(0.5, "a share", aliases=("--share",))


def _demo_parser(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, _Demo, **kw)
    return p


def test_flags_left_out_give_the_dataclass_defaults():
    assert from_args(_Demo, _demo_parser().parse_args([])) == _Demo()


def test_flags_land_in_their_fields_converted_to_the_fields_unit():
    args = _demo_parser().parse_args(
        ["--size", "3", "--name", "x", "--mode", "b", "--no-fast", "--budget-gb", "1.5"]
        + ["--share", "0.25"]
    )
    assert from_args(_Demo, args) == _Demo(
        size=3, name="x", mode="b", fast=False, budget=3 << 29, ratio=0.25
    )
    assert from_args(_Demo, args, size=9).size == 9  # overrides come last


def test_a_field_off_the_command_line_has_no_flag_and_choices_are_enforced():
    p = _demo_parser()
    with pytest.raises(SystemExit):
        p.parse_args(["--hidden"])
    with pytest.raises(argparse.ArgumentError):
        p.parse_args(["--mode", "c"])
    only = _demo_parser(only=("size",)).parse_args(["--size", "2"])
    assert vars(only) == {"size": 2}
    assert from_args(_Demo, only, only=("size",)) == _Demo(size=2)


def test_help_shows_each_fields_help_and_default():
    text = _demo_parser().format_help()
    assert "how many (default: 8)" in text and "in GB (default: None)" in text


def test_every_engine_field_has_one_default_written_in_the_dataclass():
    for f in dataclasses.fields(EngineConfig):
        assert f.default is not dataclasses.MISSING, f.name
        assert f.metadata.get("help"), f"EngineConfig.{f.name} has no help text"
    # The scheduler's settings take the scheduler's defaults: written once, over there.
    tree = ast.parse(inspect.getsource(EngineConfig))
    literal = {
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.value, ast.Call)
        and node.value.args
        and isinstance(node.value.args[0], ast.Constant)
    }
    shared = {"max_batch_tokens", "max_running", "dedupe_in_flight", "prefill_order", "packing"}
    assert not literal & shared
    engine, sched = EngineConfig(), SchedulerConfig()
    assert {n: getattr(engine, n) for n in shared} == {n: getattr(sched, n) for n in shared}


def test_the_cli_user_s_defaults_win():
    """Where two defaults disagreed, what `radixray serve/worker` ran with is the one left."""
    assert (EngineConfig().device, EngineConfig().max_batch_tokens) == ("auto", 1024)
    assert SchedulerConfig().max_batch_tokens == 1024
    # The simulator's cpu preset keeps its own measured batch limits (every sim figure used them).
    assert TIMING_PRESETS[DEFAULT_TIMING].max_batch_tokens == 512
    assert SimConfig().timing == TIMING_PRESETS["cpu"]


@pytest.mark.parametrize("cmd", ["worker", "serve"])
def test_worker_and_serve_flags_parse_to_the_engine_defaults(cmd):
    args = build_parser().parse_args([cmd])
    assert _engine_config(args, None) == EngineConfig()
    assert _engine_config(args, "w1") == EngineConfig(worker_id="w1")


@pytest.mark.parametrize("cmd", ["worker", "serve"])
def test_todays_engine_flags_keep_their_names(cmd):
    argv = [cmd, "--model", "tiny", "--page-size", "8", "--cache", "chunk", "--eviction", "lfu"]
    argv += ["--num-pages", "64", "--kv-memory-gb", "0.5", "--max-batch-tokens", "256"]
    argv += ["--max-running", "8", "--prefill-order", "shortest", "--device", "cpu"]
    argv += ["--cpu-threads", "1", "--attention-backend", "torch"]
    cfg = _engine_config(build_parser().parse_args(argv), "w")
    assert cfg == EngineConfig(
        model="tiny",
        page_size=8,
        cache="chunk",
        eviction="lfu",
        num_pages=64,
        kv_memory_bytes=1 << 29,
        max_batch_tokens=256,
        max_running=8,
        prefill_order="shortest",
        device="cpu",
        cpu_threads=1,
        attention_backend="torch",
        worker_id="w",
    )


def test_serve_flags_default_to_the_router_and_serve_settings():
    args = build_parser().parse_args(["serve"])
    assert args.policy == RouterSettings.policy
    assert args.max_inflight == RouterSettings.max_inflight
    assert args.workers == WorkerDeploymentConfig.num_replicas
    assert args.worker_cpus == WorkerDeploymentConfig.num_cpus


def test_a_setting_no_engine_accepts_is_a_usage_error(capsys):
    from radixray.cli import main

    with pytest.raises(SystemExit) as e:
        main(["worker", "--page-size", "3"])
    assert e.value.code == 2
    assert "page_size must be a power of two" in capsys.readouterr().err


def test_simulator_and_benchmark_harness_share_the_engine_defaults():
    engine = EngineConfig()
    assert SimConfig().page_size == engine.page_size == RouterSettings().page_size
    assert SimConfig().prefill_order == engine.prefill_order
    assert SimConfig().packing == engine.packing == "priced"
    assert (WorkerSpec().page_size, WorkerSpec().max_batch_tokens) == (
        engine.page_size,
        engine.max_batch_tokens,
    )


def test_serve_config_defaults_are_the_dataclasses():
    app = ServeAppConfig()
    assert (app.model, app.page_size, app.policy) == ("smollm2", 16, "ttft")
    assert EngineConfig(**app.engine_config("w0")) == EngineConfig(worker_id="w0")
    assert app.router_settings().max_inflight == RouterSettings().max_inflight


def test_serve_config_yaml_repeats_only_the_dataclass_defaults():
    (app,) = yaml.safe_load((ROOT / "deploy/serve_config.yaml").read_text())["applications"]
    args = app["args"]
    assert args["page_size"] == ServeAppConfig.page_size
    assert args["policy"] == ServeAppConfig.policy
    router_settings = defaults(RouterSettings)
    for key, value in args["router"]["settings"].items():
        assert value == router_settings[key], key
    workers = defaults(WorkerDeploymentConfig)
    assert args["workers"]["max_ongoing_requests"] == workers["max_ongoing_requests"]
    assert args["workers"]["num_cpus"] == workers["num_cpus"]


def test_helm_values_defaults_are_the_dataclass_defaults():
    values = yaml.safe_load((ROOT / "deploy/helm/radixray/values.yaml").read_text())
    assert values["model"]["name"] == ServeAppConfig.model == EngineConfig.model
    assert values["router"]["policy"] == ServeAppConfig.policy == RouterSettings.policy
    assert values["router"]["pageSize"] == ServeAppConfig.page_size == EngineConfig.page_size
    router, workers = defaults(RouterDeploymentConfig), defaults(WorkerDeploymentConfig)
    assert values["router"]["replicas"] == router["num_replicas"]
    assert values["router"]["maxOngoingRequests"] == router["max_ongoing_requests"]
    assert values["workers"]["replicas"] == workers["num_replicas"]
    assert values["workers"]["maxOngoingRequests"] == workers["max_ongoing_requests"]
    assert values["engine"] == {}  # every engine field is EngineConfig's (device "auto")
    assert values["hostPages"] == EngineConfig.host_pages  # None: sized on the GPU node


@pytest.mark.parametrize("cmd", ["worker", "serve"])
def test_host_pages_flag(cmd, capsys):
    from radixray.cli import main

    args = build_parser().parse_args([cmd, "--host-pages", "512"])
    assert _engine_config(args, None) == EngineConfig(host_pages=512)
    assert _engine_config(build_parser().parse_args([cmd]), None).host_pages is None
    with pytest.raises(SystemExit) as e:
        main([cmd, "--host-pages", "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--host-pages must be an int >= 0" in err and "host_pages" not in err


def test_ttft_settings_are_serve_and_sim_flags_that_reach_the_policy(capsys):
    """``--ttft-*`` flags (TTFTConfig) land in the router's policy spec; a spec's own arguments
    win over them; a value out of range is a usage error naming the field."""
    from radixray.cli import main
    from radixray.router.cli_args import router_settings
    from radixray.router.policies import make_policy
    from radixray.router.policies.ttft_config import TTFTConfig
    from radixray.sim.sim_cli import build_parser as sim_parser

    parser = build_parser()
    assert "--ttft-margin" in parser._subparsers._group_actions[0].choices["serve"].format_help()
    args = parser.parse_args(["serve", "--ttft-margin", "0.1", "--no-ttft-tiers"])
    policy = router_settings(args, args.policy).policy
    assert policy == "ttft:margin=0.1:tiers=False"
    built = make_policy(policy)
    assert built.config == TTFTConfig(margin=0.1, tiers=False)
    own = router_settings(args, "ttft:margin=0").policy  # the spec's own argument wins
    assert make_policy(own).config.margin == 0
    assert router_settings(args, "kv_cost").policy == "kv_cost"  # other policies: untouched
    assert router_settings(parser.parse_args(["serve"]), "ttft").policy == "ttft"
    assert "--ttft-memory" in sim_parser().format_help()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--ttft-margin", "2"])
    assert e.value.code == 2
    assert "margin must be in [0, 1), got 2.0" in capsys.readouterr().err
