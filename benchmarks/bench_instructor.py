"""instructor against a real radixray worker: how often a small model returns the pydantic
object, in instructor's JSON-schema and tools modes, with the server's closed schemas (an object
gets no properties its schema did not name) and with the schema explicitly open
(``additionalProperties: true``, what JSON Schema allows when a schema says nothing, and what
the server did before).

SmolLM2-135M on one worker served on its own (``radixray worker``'s app, in process), the tries
sent at once (one batch), temperature 0.8, max_tokens 120, each try seeded, no re-ask
(``max_retries=0``). A try succeeds when instructor returns the object; an extra property is
counted from the raw answer.

    .venv/bin/python benchmarks/bench_instructor.py              # 20 tries per cell
    .venv/bin/python benchmarks/bench_instructor.py --tries 5
    .venv/bin/python benchmarks/bench_instructor.py --quick    # a dry run: tiny model, 2 tries
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import instructor
import openai
from pydantic import BaseModel, ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.router.serving import worker_server  # noqa: E402

TEXT = "Paris is the capital of France. About 2 million people live there."


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=100)


class OpenCity(City):
    """The same object, its schema saying extra properties are allowed."""

    model_config = ConfigDict(json_schema_extra={"additionalProperties": True})


async def _cell(url: str, served: str, mode: str, model: type[BaseModel], tries: int) -> dict:
    client = instructor.from_openai(
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600),
        mode=getattr(instructor.Mode, mode),
    )

    async def one(seed: int):
        try:
            obj, completion = await client.chat.completions.create_with_completion(
                model=served,
                response_model=model,
                messages=[{"role": "user", "content": f"Extract the city: {TEXT}"}],
                temperature=0.8,
                max_tokens=120,
                seed=seed,
                max_retries=0,
            )
        except Exception as e:  # instructor's validation / parse failure: a failed try
            return False, False, type(e).__name__
        message = completion.choices[0].message
        raw = message.tool_calls[0].function.arguments if mode == "TOOLS" else message.content
        extra = bool(set(json.loads(raw)) - set(City.model_fields))
        return isinstance(obj, City), extra, completion.choices[0].finish_reason

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(s) for s in range(tries)))
    return {
        "ok": sum(r[0] for r in results),
        "extra": sum(r[1] for r in results),
        "length": sum(r[2] == "length" for r in results),
        "s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model file")
    ap.add_argument("--quick", action="store_true", help="tiny model, JSON-schema mode, 2 tries")
    args = ap.parse_args()
    if args.quick:
        args.tries, args.model = 2, "tiny"
    server, host = worker_server("w0", model=args.model, num_pages=2048)
    rows = []
    try:
        with server as url:
            for mode in ("JSON_SCHEMA",) if args.quick else ("JSON_SCHEMA", "TOOLS"):
                for label, model in (("closed (default)", City), ("open", OpenCity)):
                    print(f"{mode} / {label}: {args.tries} tries ...", flush=True)
                    r = asyncio.run(_cell(url, args.model, mode, model, args.tries))
                    rows.append((mode, label, r))
    finally:
        host.shutdown()
    print(f"\n{'mode':<12} {'schema':<17} {'object':>8} {'extra':>6} {'length':>7} {'s':>6}")
    for mode, label, r in rows:
        n = args.tries
        print(
            f"{mode:<12} {label:<17} {r['ok']:>4}/{n:<3} {r['extra']:>6} {r['length']:>7} "
            f"{r['s']:>6.1f}"
        )


if __name__ == "__main__":
    main()
