"""``radixray serve`` on a GPU: Ray, one worker actor with ``num_gpus=1``, the router, and a few
streamed chat requests through it (issue 43; step (g) of benchmarks/gpu/run.sh).

    python benchmarks/gpu/serve_check.py --json out.json            # CUDA: Qwen3-0.6B's shapes
    python benchmarks/gpu/serve_check.py --quick --json out.json    # CPU, tiny model: a dry run

The real CLI (``radixray.cli.main``) runs as a subprocess bound to 127.0.0.1; it starts Ray
(RAY_AUTH_MODE=disabled, a fresh RAY_TMPDIR under /tmp) and one worker actor, which gets a whole
GPU when Ray sees one. The device has no network, so the model is a folder written here: an HF
directory of architecture qwen3 with Qwen3-0.6B's config.json (28 layers, hidden 1,024, MLP 3,072,
16 / 8 heads of 128, vocab 151,936, tied embeddings) and seeded random bf16 weights. What
differs from the real 0.6B: the weights; the tokenizer, which is radixray's byte-level one
(``ByteTokenizer``'s ids, ChatML's three special tokens at 256-258) widened to the model's vocab
by filler tokens ``[259]`` .. ``[151935]`` (no merges reach them, so prompts encode as bytes and
any sampled id decodes); and the end-of-sequence id, 258 (``<|im_end|>``) for Qwen's 151,645.

Requests (streamed, usage included; the official ``openai`` client when installed, else httpx):
one warm-up, then two that share a long prefix, one after the other. Checks: every stream ends
with a finish reason and tokens; the second shared-prefix request reports cached prompt tokens
(``usage.prompt_tokens_details.cached_tokens``) and more than the first; the worker runs on the
asked device (``/admin/workers``: the worker's own ``WorkerInfo.device``); and Ray, asked by a
second driver, counts the GPUs its actors hold: 1 on CUDA (the worker's ``num_gpus=1``), 0 on the
CPU. The JSON holds each request's TTFT, tokens and cached tokens, the device, Ray's GPU count
and the start-up time. Exit status 1 when a check fails. Everything started is stopped by pid
(the server's process group, then any process left holding this run's RAY_TMPDIR).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# Qwen3-0.6B's config.json (Qwen/Qwen3-0.6B), but for the ids of the byte-level tokenizer.
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "bos_token_id": 256,  # the byte tokenizer's <|endoftext|> (Qwen's: 151643)
    "eos_token_id": 258,  # its <|im_end|> (Qwen's: 151645)
}
TINY = QWEN3_06B | {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}
SHARED_PREFIX_CHARS = {False: 2000, True: 300}  # = prompt tokens: the tokenizer is byte-level


def tokenizer_files(vocab_size: int, max_model_len: int) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json``: the byte tokenizer's (grpc_sglang's
    HF form of it, with its ChatML template), its model vocabulary widened to ``vocab_size`` by
    the filler tokens ``[i]``. The specials go into the model vocabulary too: an added token
    missing from it would be given a new id past the fillers."""
    from radixray.model_meta.byte_tokenizer import ByteTokenizer
    from radixray.worker.grpc_sglang.tokenizer_files import tokenizer_files as hf_files

    files = hf_files(ByteTokenizer(), max_model_len)
    tok = json.loads(files["tokenizer.json"])
    vocab = tok["model"]["vocab"]
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    first = len(vocab)
    if vocab_size < first:
        raise ValueError(f"vocab_size must be >= {first} (the byte tokenizer's), got {vocab_size}")
    vocab.update({f"[{i}]": i for i in range(first, vocab_size)})
    return files | {"tokenizer.json": json.dumps(tok)}


def write_model(folder: Path, quick: bool, device: str) -> dict:
    """The model folder (config, tokenizer, random weights made on ``device``); its config."""
    import torch
    from safetensors.torch import save_file

    from radixray.model_meta import HFMetadata
    from radixray.worker.model.loader import random_hf_state_dict

    config = TINY if quick else QWEN3_06B
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for name, text in tokenizer_files(config["vocab_size"], 4096).items():
        (folder / name).write_text(text)
    mcfg = HFMetadata(folder).config()
    dtype = torch.float32 if quick else torch.bfloat16
    state = random_hf_state_dict(mcfg, 0, device, dtype)
    save_file({k: v.cpu().contiguous() for k, v in state.items()}, folder / "model.safetensors")
    return config


def serve_command(model: Path, port: int, token: str, quick: bool) -> list[str]:
    """The CLI's argv: one worker, on the CPU (float32) or CUDA (bfloat16, 4 GB of KV, CUDA
    graphs up to batch 8 so that their capture stays short)."""
    argv = [sys.executable, "-c", "import sys; from radixray.cli import main; sys.exit(main())"]
    argv += ["serve", "--workers", "1", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--admin-token", token, "--max-model-len", "4096"]
    if quick:
        return argv + ["--device", "cpu", "--dtype", "float32", "--num-pages", "256"]
    return (
        argv
        + ["--device", "cuda", "--dtype", "bfloat16", "--kv-memory-gb", "4"]
        + [
            "--cuda-graph-max-batch",
            "8",
        ]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, deadline: float) -> None:
    """Until the router's /health answers 200 (its workers added, the index warm)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"radixray serve exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"radixray serve not ready at {url}/health in time")


def sse_chunks(lines):
    """The JSON chunks of an OpenAI server-sent-event stream's ``data:`` lines, to ``[DONE]``;
    raises ValueError when the stream ends without it."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)
    raise ValueError("the stream ended without data: [DONE]")


def openai_chunks(url: str, body: dict):
    """The chunks of a streamed chat request, by the official client (dicts, as on the wire)."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120)
    for chunk in client.chat.completions.create(**body):
        yield chunk.model_dump()


def httpx_chunks(url: str, body: dict):
    """The same by httpx (the GPU machine's image has no ``openai``)."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"chat request: HTTP {r.status_code}: {r.text[:300]}")
        yield from sse_chunks(r.iter_lines())


def client_name() -> str:
    try:
        import openai  # noqa: F401
    except ImportError:
        return "httpx"
    return "openai"


def stream_chat(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat request: TTFT (to the first chunk with text), tokens, cached tokens."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = openai_chunks if client_name() == "openai" else httpx_chunks
    start, first, text, finish, usage = time.perf_counter(), None, "", None, None
    for c in chunks(url, body):
        for choice in c.get("choices") or []:
            delta = (choice.get("delta") or {}).get("content") or ""
            if delta and first is None:
                first = time.perf_counter() - start
            text += delta
            finish = choice.get("finish_reason") or finish
        usage = c.get("usage") or usage
    usage = usage or {}
    return {
        "ttft_s": first,
        "total_s": time.perf_counter() - start,
        "finish_reason": finish,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "text_head": text[:60],
    }


def worker_devices(url: str, token: str) -> list[str]:
    """The device each worker reports about itself (its WorkerInfo, via the router)."""
    r = httpx.get(f"{url}/admin/workers", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    r.raise_for_status()
    return [w["info"]["device"] for w in r.json()["workers"]]


_RAY_GPUS = """
import json, ray
ray.init(address="auto", log_to_driver=False)  # the cluster under this RAY_TMPDIR
total, free = ray.cluster_resources().get("GPU", 0), ray.available_resources().get("GPU", 0)
print(json.dumps({"gpus": total, "gpus_held": total - free}))
"""


def ray_gpus(env: dict) -> dict:
    """The Ray cluster's GPUs and how many its actors hold (the worker asked for num_gpus=1), as
    a second driver sees them; an error's text instead when it cannot connect."""
    proc = subprocess.run(
        [sys.executable, "-c", _RAY_GPUS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stop(proc: subprocess.Popen, ray_tmp: str, grace_s: float = 30) -> dict:
    """SIGINT to the server (uvicorn stops, the CLI shuts Ray down), then SIGKILL to its process
    group; then any process still naming this run's RAY_TMPDIR, by pid. What was left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    left = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if pid != os.getpid() and ray_tmp.encode() in cmd + environ:
            left.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return {"server_rc": proc.returncode, "killed_leftovers": left}


def prompts(quick: bool) -> dict[str, str]:
    """A warm-up, then two prompts that share a long prefix (their questions differ)."""
    line = "Line {:03d} of the shared context: the radix cache keeps it for the next request.\n"
    prefix, i = "", 0
    while len(prefix) < SHARED_PREFIX_CHARS[quick]:
        prefix, i = prefix + line.format(i), i + 1
    return {
        "warm_up": "Hello! Say something short.",
        "shared_a": prefix + "Question one: what is line 7 about?",
        "shared_b": prefix + "Question two: how many lines are there?",
    }


def checks(requests: dict[str, dict], devices: list[str], want: str, gpus: dict) -> dict[str, bool]:
    """Each check by name: True when it passed (the module docstring says what each asks)."""
    a, b = requests["shared_a"], requests["shared_b"]
    return {
        "streams_complete": all(
            r["finish_reason"] in ("stop", "length") and (r["completion_tokens"] or 0) > 0
            for r in requests.values()
        ),
        "second_shared_prefix_cached": (b["cached_tokens"] or 0) > (a["cached_tokens"] or 0),
        "worker_on_device": len(devices) == 1 and devices[0].startswith(want),
        "worker_holds_a_gpu_in_ray": gpus.get("gpus_held") == (1 if want == "cuda" else 0),
    }


def run(args, work: Path, ray_tmp: str) -> dict:
    device = "cpu" if args.quick else "cuda"
    t0 = time.perf_counter()
    config = write_model(work / "qwen3-0.6b-random", args.quick, device)
    written = time.perf_counter() - t0
    port, token = free_port(), os.urandom(8).hex()
    env = os.environ | {
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_tmp,
        "RAY_USAGE_STATS_ENABLED": "0",  # no network there: nothing to report to
    }
    log_path = work / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            serve_command(work / "qwen3-0.6b-random", port, token, args.quick),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # its own process group: stopped as one
        )
    url, result = f"http://127.0.0.1:{port}", {"device": device, "client": client_name()}
    try:
        t1 = time.perf_counter()
        wait_ready(url, proc, time.monotonic() + args.timeout)
        result["startup_s"] = round(time.perf_counter() - t1, 2)
        result["model_write_s"] = round(written, 2)
        result["worker_devices"] = worker_devices(url, token)
        result["ray"] = ray_gpus(env)
        reqs = {}
        for name, prompt in prompts(args.quick).items():
            reqs[name] = stream_chat(url, "qwen3-0.6b-random", prompt, args.max_tokens)
            print(name, json.dumps(reqs[name]), flush=True)
        result["requests"] = reqs
        result["checks"] = checks(reqs, result["worker_devices"], device, result["ray"])
    except Exception as e:  # reported in the JSON; the server is stopped either way
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        result["stop"] = stop(proc, ray_tmp)
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print("--- radixray serve's output (last 40 lines) ---", *tail, sep="\n", flush=True)
    result["model"] = {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")}
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU, tiny model: a dry run")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--max-tokens", type=int, default=None, help="per request (32; quick 8)")
    p.add_argument("--timeout", type=float, default=80, help="seconds for the server to start")
    args = p.parse_args()
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    # run.sh's `timeout` sends SIGTERM: stop the server on the way out (run's finally) as well
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="radixray-serve-check."))
    ray_tmp = tempfile.mkdtemp(prefix="rr-ray-", dir="/tmp")  # short: Ray's socket paths
    try:
        result = run(args, work, ray_tmp)
    finally:
        subprocess.run(["rm", "-rf", str(work), ray_tmp], check=False)
    ok = "error" not in result and all(result["checks"].values())
    result["ok"] = ok
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print("serve check:", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
