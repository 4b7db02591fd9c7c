"""The GPU kit (benchmarks/gpu/): engine_check.py's JSON, and the wheels it carries cover every
import of the GPU path that the device machine's image lacks. No network, no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "benchmarks" / "gpu"


def _names(path: Path) -> dict[str, str]:
    """Normalized distribution name -> its line (comments kept), from a kit list."""
    out = {}
    for line in path.read_text().splitlines():
        name = re.split(r"[=<>#\s\[;]", line.strip(), maxsplit=1)[0]
        if name:
            out[re.sub(r"[-_.]+", "-", name).lower()] = line
    return out


IMAGE, WHEELS = _names(KIT / "image_packages.txt"), _names(KIT / "wheels.txt")


def test_every_wheel_is_pinned_and_missing_from_the_image_unless_an_override():
    for name, line in WHEELS.items():
        assert re.match(r"^[A-Za-z0-9._-]+==[0-9][^\s#]*", line), line
        if name in IMAGE:
            assert "override" in line, f"{name} is in the image: mark the line an override"


def test_every_runtime_dependency_missing_there_is_carried_or_off_the_gpu_path():
    """pyproject's runtime dependencies that the image lacks: each is a wheel, or is one that the
    GPU path never imports (the integration test below proves it by blocking them)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[=<>;\[\s]", d, maxsplit=1)[0] for d in deps}
    names = {re.sub(r"[-_.]+", "-", n).lower() for n in names}
    missing = names - set(IMAGE)
    assert missing - set(WHEELS) == {"gguf", "ray", "llguidance"}


def _engine_check():
    spec = importlib.util.spec_from_file_location("engine_check", KIT / "engine_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_check_quick_json(tmp_path, monkeypatch):
    out = tmp_path / "e.json"
    argv = ["engine_check.py", "--quick", "--runs", "1", "--batches", "1", "3", "--host"]
    monkeypatch.setattr(sys, "argv", [*argv, "--json", str(out)])
    assert _engine_check().main() == 0
    got = json.loads(out.read_text())
    assert set(got) == {"info", "model", "args", "exactness", "decode", "host"}
    assert got["info"]["device"] == "cpu" and got["model"]["config"]["num_layers"] == 2
    ex = got["exactness"]
    assert ex["equal"] and ex["first_difference"] == [None] * ex["prompts"] and ex["prompts"] == 5
    assert ex["overlap_equal"] and ex["overlap_first_difference"] == [None] * ex["prompts"]
    assert [(r["dtype"], r["batch"]) for r in got["decode"]] == [
        ("bfloat16", 1),
        ("bfloat16", 3),
        ("float32", 1),
        ("float32", 3),
    ]
    assert all(r["tokens_per_s"] > 0 and len(r["runs"]) == 1 for r in got["decode"])
    assert not ex["cuda_graphs"] and not any(r["cuda_graphs"] for r in got["decode"])  # CPU
    host = got["host"]
    assert host["same_outputs"]
    for mode in ("layered", "before_forward"):
        assert host[mode]["loaded_pages"] > 0 and host[mode]["demoted_pages"] > 0


def test_smollm2_config_is_the_ggufs():
    from radixray.model_meta import open_checkpoint
    from radixray.worker.model.gguf_file import GGUFCheckpoint
    from radixray.worker.model.hf_checkpoint import HFCheckpoint

    want = open_checkpoint("smollm2", GGUFCheckpoint, HFCheckpoint).config()
    assert _engine_check().model_config(quick=False) == want


# Only the standard library, the image's packages and the kit's wheels import; then the GPU
# path's modules import, engine_check runs and pytest collects every GPU test (with the
# repository's conftests).
_ONLY_THE_IMAGE = """
import importlib.abc, importlib.machinery, importlib.metadata as md, re, runpy, sys
allowed = set(sys.argv[1].split(","))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
owners = md.packages_distributions()
local = {"radixray", "tests", "benchmarks", "engine_check"}
blocked = set()

find = importlib.machinery.PathFinder.find_spec


def there(top):
    if top in sys.stdlib_module_names or top in local:
        return True
    if any(norm(d) in allowed for d in owners.get(top, [])):
        return True
    spec = None if top in owners else find(top)  # the interpreter's own (_sysconfigdata_...)
    return bool(spec and spec.origin and "-packages" not in spec.origin)


class OnlyTheImage(importlib.abc.MetaPathFinder):  # the path finder, blind to the rest
    def find_spec(self, name, path=None, target=None):
        if not there(name.split(".")[0]):
            blocked.add(name.split(".")[0])
            return None
        return find(name, path, target)


i = sys.meta_path.index(importlib.machinery.PathFinder)
sys.meta_path[i] = OnlyTheImage()
import radixray.worker, radixray.kernels  # noqa
sys.argv = ["engine_check.py", "--quick", "--runs", "1", "--batches", "2", "--dtypes", "float32"]
try:
    runpy.run_path(sys.argv_kit, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
import pytest
code = pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *sys.tests])
print("blocked (imports that fell back):", sorted(blocked))
sys.exit(code)
"""


@pytest.mark.integration
@pytest.mark.parallel_safe
def test_the_gpu_path_imports_only_the_image_and_the_kit(tmp_path):
    tests = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("*.py")
        if "mark.gpu" in p.read_text(encoding="utf-8")
    )
    assert tests
    setup = f"import sys; sys.argv_kit = {str(KIT / 'engine_check.py')!r}; sys.tests = {tests!r}"
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "OMP_NUM_THREADS": "1",
    }
    allowed = ",".join(set(IMAGE) | set(WHEELS))
    proc = subprocess.run(
        [sys.executable, "-c", setup + "\n" + _ONLY_THE_IMAGE, allowed],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert "exactness vs CPU: EQUAL" in proc.stdout, tail


def test_profile_step_quick_splits_the_step_and_profiles_it(tmp_path):
    """profile_step.py on the CPU: the step's parts add up, and both profiles name the forward."""
    proc = subprocess.run(
        [sys.executable, str(KIT / "profile_step.py"), "--quick", "--batch", "2"]
        + ["--max-tokens", "5", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    split = (tmp_path / "split.txt").read_text()
    steps = int(re.match(r"steps (\d+),", split).group(1))
    assert steps == 5  # one prefill step (both prompts) and four decode steps
    total = float(re.search(r"total ([\d.]+)", split).group(1))
    parts = [float(x) for x in re.findall(r": ([\d.]+) ms/step", split)]
    assert len(parts) == 3 and sum(parts) == pytest.approx(total, abs=0.05)
    assert "model_runner.py" in (tmp_path / "cprofile.txt").read_text()
    ops = (tmp_path / "torch_ops.txt").read_text()
    assert ops.startswith("# 5 steps\n## by self CPU time")
    per_step = dict(reversed(line.split()) for line in ops.split("per step")[1].splitlines()[1:])
    assert float(per_step["aten::item"]) == 1.0  # one host sync a step: the sampled tokens
    # no device kernels on the CPU: the count reads 0 (on CUDA, issue 43's per-layer figure)
    kernels = (tmp_path / "kernels.txt").read_text()
    assert re.match(r"eager decode, 5 steps: 0\.0 device kernels a step, 0\.0 a layer", kernels)


# --- step (g): radixray serve through Ray (serve_check.py, ray_site.sh, ray_trim.txt). The real
# serve (Ray, an actor, the router) takes 20-40 s here: run by hand (benchmarks/README.md).


def _serve_check():
    spec = importlib.util.spec_from_file_location("serve_check", KIT / "serve_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ray_trim_drops_only_what_radixray_never_imports():
    """Each dropped path has a reason and is in the installed Ray of ray_site.sh's version (the
    list matches the wheel), and no module of radixray imports from it."""
    md = pytest.importorskip("importlib.metadata")
    ray_version = re.search(r"^RAY_VERSION=(\S+)", (KIT / "ray_site.sh").read_text(), re.M)[1]
    assert md.version("ray") == ray_version
    site = Path(md.distribution("ray").locate_file(""))
    dropped = []
    for line in (KIT / "ray_trim.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, reason = line.partition("#")
            assert reason.strip(), f"no reason given for {path.strip()}"
            assert (site / path.strip()).exists(), path
            dropped.append(path.strip().replace("/", "."))
    assert "ray.jars" in dropped
    code = "\n".join(p.read_text() for p in (REPO / "radixray").rglob("*.py"))
    for module in dropped:
        assert not re.search(rf"\b(from|import) {re.escape(module)}\b", code), module


def test_rays_own_dependencies_are_in_the_image_or_the_kit():
    md = pytest.importorskip("importlib.metadata")
    reqs = [r for r in md.requires("ray") or [] if "extra ==" not in r]  # ray, not ray[serve]
    needs = {re.sub(r"[-_.]+", "-", re.split(r"[=<>!~;\[\s(]", r)[0]).lower() for r in reqs}
    assert "jsonschema" in needs and needs <= set(IMAGE) | set(WHEELS), needs - set(IMAGE)


def test_serve_check_model_folder_loads_with_the_byte_tokenizers_ids(tmp_path):
    from radixray.model_meta import ByteTokenizer, load_model_meta
    from radixray.worker.model.loader import load_model

    sc = _serve_check()
    sc.write_model(tmp_path / "m", quick=True, device="cpu")
    meta = load_model_meta(str(tmp_path / "m"))
    assert meta.config.architecture == "qwen3" and meta.config.qk_norm
    assert meta.vocab_size == 512 and meta.config.tie_word_embeddings
    text = meta.tokenizer.apply_chat_template([{"role": "user", "content": "hé [300]"}])
    assert meta.tokenizer.encode(text) == ByteTokenizer().encode(text)
    assert meta.tokenizer.decode([104, 105, 300, 511]) == "hi[300][511]"
    assert 258 in meta.tokenizer.stop_token_ids  # <|im_end|> ends a sequence
    loaded = load_model(str(tmp_path / "m"))
    assert loaded.model.embed_tokens.weight.shape == (512, 64)


def test_serve_check_full_vocab_tokenizer_and_cli_flags():
    """The fillers reach the last id of the vocab; both command lines parse."""
    from tokenizers import Tokenizer

    from radixray.cli import build_parser

    sc = _serve_check()
    tok = Tokenizer.from_str(sc.tokenizer_files(1000, 4096)["tokenizer.json"])
    assert tok.get_vocab_size() == 1000 and tok.id_to_token(258) == "<|im_end|>"
    assert tok.decode([999]) == "[999]"
    for quick, device in ((True, "cpu"), (False, "cuda")):
        argv = sc.serve_command(Path("/m"), 8000, "t", quick)
        args = build_parser().parse_args(argv[3:])
        assert (args.cmd, args.workers, args.device) == ("serve", 1, device)
        assert (args.host, args.port, args.admin_token) == ("127.0.0.1", 8000, "t")


def test_serve_check_reads_streams_and_judges_them():
    sc = _serve_check()
    lines = ['data: {"choices": []}', "", ": keep-alive", "data: [DONE]", 'data: {"x": 1}']
    assert list(sc.sse_chunks(lines)) == [{"choices": []}]
    with pytest.raises(ValueError, match="DONE"):
        list(sc.sse_chunks(['data: {"choices": []}']))
    req = {"finish_reason": "length", "completion_tokens": 8, "cached_tokens": 0}
    reqs = {"warm_up": req, "shared_a": req, "shared_b": req | {"cached_tokens": 320}}
    names = ("streams_complete", "second_shared_prefix_cached", "worker_on_device")
    held = {"gpus": 1, "gpus_held": 1}
    assert sc.checks(reqs, ["cuda:0"], "cuda", held) == dict.fromkeys(
        (*names, "worker_holds_a_gpu_in_ray"), True
    )
    cold = sc.checks(reqs | {"shared_b": req}, ["cpu"], "cuda", {"gpus": 1, "gpus_held": 0})
    assert list(cold.values()) == [True, False, False, False]
    bad = reqs | {"warm_up": req | {"finish_reason": None}}
    assert not sc.checks(bad, ["cpu"], "cpu", {"gpus": 0, "gpus_held": 0})["streams_complete"]
    assert not sc.checks(reqs, ["cuda:0"], "cuda", {"error": "no cluster"})[
        "worker_holds_a_gpu_in_ray"
    ]
    prompts = sc.prompts(quick=True)
    a, b = prompts["shared_a"], prompts["shared_b"]
    shared = len(os.path.commonprefix([a, b]))
    assert shared >= sc.SHARED_PREFIX_CHARS[True] and a != b


def test_image_only_refuses_what_the_image_lacks(tmp_path):
    """benchmarks/gpu/image_only on PYTHONPATH: a package the image lacks (openai) is missing,
    the image's (yaml), the kit's (msgspec) and ray are found; the refusal is logged."""
    code = (
        "import importlib.util as u, sys\n"
        "try:\n    import openai\nexcept ImportError:\n    print('refused')\n"
        "import msgspec, yaml\n"
        "print(u.find_spec('ray') is not None, u.find_spec('jsonschema') is not None)\n"
    )
    log = tmp_path / "refused.txt"
    env = os.environ | {
        "PYTHONPATH": f"{KIT / 'image_only'}{os.pathsep}{REPO}",
        "RADIXRAY_IMAGE_ONLY_LOG": str(log),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["refused", "True", "True"]
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["openai"]


def test_serve_check_config_is_big_checks_qwen3_06b(tmp_path):
    """The served folder's config.json reads as the Qwen3-0.6B shapes big_check.py measures
    (only the token ids differ: the byte tokenizer's end-of-sequence)."""
    from radixray.model_meta import HFMetadata

    spec = importlib.util.spec_from_file_location("big_check", KIT / "big_check.py")
    big = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(big)
    (tmp_path / "config.json").write_text(json.dumps(_serve_check().QWEN3_06B))
    got, want = HFMetadata(tmp_path).config(), big.QWEN3_06B
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")
    fields += ("num_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings")
    assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert (got.architecture, got.qk_norm, got.eos_token_id) == ("qwen3", True, 258)
