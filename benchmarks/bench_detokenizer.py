"""The detokenizer alone, per token, over long outputs: before and after a change, alternated.

A streamed output calls ``IncrementalDetokenizer.update`` once a token with the output's ids so
far (the same growing list, as the engine passes ``req.output_ids``) and ``flush`` at the end.
This times that loop for outputs of ``--lengths`` tokens of English text (SmolLM2's tokenizer,
its checked byte table), with no stop string and with two that never match (the path that holds
text back and searches it), for three detokenizers in the same process:

- ``before``: ``radixray/worker/detokenizer.py`` as it was at ``--rev`` (loaded from git, beside
  today's ``token_bytes``), default ``0993880^``: the text one string, ``text += piece``, a copy
  of the whole text a token;
- ``after``: today's (the text in pieces and a short tail: O(piece + longest stop) a token);
- ``windows``: today's without the table (two ``decode`` calls a token): what a tokenizer the
  table check refuses pays, as SentencePiece ones did before ``TokenPieces``.

Each repeat runs every detokenizer once per case, in a rotated order; the figure is the median
microseconds a token over the repeats (this thread's CPU time, ``time.thread_time``: on shared
cores the waits for a core are left out; ``--clock wall`` for the wall clock), and after / before.

    .venv/bin/python benchmarks/bench_detokenizer.py                # 1k and 16k tokens, 7 repeats
    .venv/bin/python benchmarks/bench_detokenizer.py --quick        # the byte tokenizer, 64/256
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (
    "The cache-aware router sends each request to the worker whose radix tree already holds the "
    "longest part of its prompt, unless that worker is much busier than the others. Decoding "
    "then streams one token at a time: each token's text is released as soon as no stop string "
    "could still begin inside it.\n\n"
)
STOPS = ("</answer>", "\n\nUser:")


def load_detokenizer_at(rev: str):
    """``radixray.worker.detokenizer`` as it was at ``rev``, as a module of its own (its relative
    imports resolve to today's package); None where git or the revision is not there (a shallow
    clone: the quick run still runs, today's against itself)."""
    try:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:radixray/worker/detokenizer.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"--rev {rev!r}: no radixray/worker/detokenizer.py there ({e}); before = today's")
        return None
    name = "radixray.worker._detokenizer_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "radixray.worker"
    sys.modules[name] = module
    exec(compile(source, f"{rev}:detokenizer.py", "exec"), module.__dict__)
    return module


def time_one(make, ids: list[int], clock=time.thread_time) -> float:
    """Microseconds a token: one output's updates, token by token, and its flush."""
    d = make()
    out: list[int] = []
    t0 = clock()
    for i in ids:
        out.append(i)
        d.update(out)
    d.flush(out)
    return (clock() - t0) / len(ids) * 1e6


def run(tok, table, before_cls, lengths, repeats, clock) -> list[tuple]:
    from radixray.worker.detokenizer import IncrementalDetokenizer

    base = tok.encode(TEXT)
    rows = []
    for n in lengths:
        ids = (base * (n // len(base) + 1))[:n]
        for stop in ((), STOPS):
            makers = {
                "before": lambda stop=stop: before_cls(tok.decode, stop, 0, table),
                "after": lambda stop=stop: IncrementalDetokenizer(tok.decode, stop, 0, table),
                "windows": lambda stop=stop: IncrementalDetokenizer(tok.decode, stop, 0, None),
            }
            names = list(makers)
            times: dict[str, list[float]] = {k: [] for k in names}
            for r in range(repeats):
                for k in names[r % 3 :] + names[: r % 3]:  # rotated: each first in turn
                    times[k].append(time_one(makers[k], ids, clock))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((n, "2 (never met)" if stop else "none", med))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rev", default="0993880^", help="git revision of the 'before' detokenizer")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread")
    ap.add_argument("--quick", action="store_true", help="the byte tokenizer, 64/256 tokens, 2x")
    args = ap.parse_args(argv)
    from radixray.worker.token_bytes import token_bytes

    if args.quick:
        from radixray.model_meta.byte_tokenizer import ByteTokenizer

        tok, lengths, repeats = ByteTokenizer(), [64, 256], 2
    else:
        from radixray.model_meta import load_model_meta

        tok, lengths, repeats = load_model_meta("smollm2").tokenizer, args.lengths, args.repeats
    table = token_bytes(tok)
    from radixray.worker.detokenizer import IncrementalDetokenizer

    before = load_detokenizer_at(args.rev)
    before_cls = before.IncrementalDetokenizer if before else IncrementalDetokenizer
    print(
        f"{type(tok).__name__}, table {'yes' if table else 'no'}, before = {args.rev}, "
        f"clock = {args.clock}"
    )
    print("| tokens | stop strings | before us/token | after us/token | after / before | windows |")
    print("|---|---|---|---|---|---|")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    for n, stop, med in run(tok, table, before_cls, lengths, repeats, clock):
        ratio = med["after"] / med["before"]
        print(
            f"| {n} | {stop} | {med['before']:.2f} | {med['after']:.2f} | {ratio:.2f}x "
            f"| {med['windows']:.2f} |"
        )


if __name__ == "__main__":
    main()
