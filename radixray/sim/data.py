"""Where the workload files live, and the one reader of the Mooncake trace (the simulator
and the live benchmark both replay it). The one place that reads RADIXRAY_DATA_DIR.

The public workloads ship inside the package, gzipped, each folder with its LICENSE and
SOURCE.md (``radixray/data/``)::

    radixray/data/
      mooncake/conversation_trace.jsonl.gz           Apache-2.0
      azure_llm_2023/AzureLLMInferenceTrace_{code,conv}.csv.gz   CC-BY-4.0
      text_prompts/mt_bench_question.jsonl.gz        Apache-2.0
      text_prompts/sonnet_llmperf.txt.gz             public domain

``$RADIXRAY_DATA_DIR`` replaces that folder: the same layout, each file plain or ``.gz``.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, NamedTuple

__all__ = [
    "data_dir",
    "data_file",
    "open_text",
    "data_text",
    "display_path",
    "mooncake_trace_path",
    "azure_trace_path",
    "read_mooncake",
    "MooncakeRow",
    "MOONCAKE_BLOCK_TOKENS",
    "DATA_ENV",
    "PACKAGE_DATA_DIR",
]

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the upstream trace

DATA_ENV = "RADIXRAY_DATA_DIR"
PACKAGE_DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def data_dir() -> Path:
    """``$RADIXRAY_DATA_DIR`` if set, else the package's own ``radixray/data``."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return PACKAGE_DATA_DIR


def data_file(relpath: str, root: str | Path | None = None) -> Path:
    """The file ``relpath`` (e.g. ``"mooncake/conversation_trace.jsonl"``) under ``root``
    (default :func:`data_dir`): the plain file if it is there, else its ``.gz``. Neither raises
    FileNotFoundError, one line naming the variable to set."""
    base = data_dir() if root is None else Path(root).expanduser()
    for path in (base / relpath, base / f"{relpath}.gz"):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{relpath} (or {relpath}.gz) not found under {base}: set {DATA_ENV} to a folder that "
        f"holds {relpath}"
    )


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """Open a data file for reading text, through gzip when its name ends in ``.gz``
    (``newline`` as for ``open``: the csv module wants ``""``)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return path.open(encoding="utf-8", newline=newline)


def data_text(relpath: str) -> str:
    """The whole text of the data file ``relpath`` (see :func:`data_file`)."""
    with open_text(data_file(relpath)) as f:
        return f.read()


def display_path(path: str | Path) -> str:
    """How a data file is named in reports: ``radixray/data/...`` for a shipped file (the same
    on every machine), else the path as given."""
    path = Path(path)
    try:
        rel = path.resolve().relative_to(PACKAGE_DATA_DIR)
    except ValueError:
        return str(path)
    return f"radixray/data/{rel.as_posix()}"


def mooncake_trace_path() -> Path:
    """The Mooncake conversation trace (FileNotFoundError naming RADIXRAY_DATA_DIR if absent)."""
    return data_file("mooncake/conversation_trace.jsonl")


def azure_trace_path(service: str = "conv") -> Path:
    """One of the two Azure LLM inference traces, ``"conv"`` or ``"code"``."""
    if service not in ("conv", "code"):
        raise ValueError(f"azure service must be 'conv' or 'code', got {service!r}")
    return data_file(f"azure_llm_2023/AzureLLMInferenceTrace_{service}.csv")


class MooncakeRow(NamedTuple):
    """One request of the Mooncake trace."""

    timestamp_ms: float
    input_length: int  # tokens, upstream
    output_length: int
    hash_ids: list[int]  # one per MOONCAKE_BLOCK_TOKENS-token block, chained

    @property
    def conversation(self) -> int:
        """The conversation it belongs to: its first block after the shared system block 0
        (every turn of a conversation repeats it)."""
        ids = self.hash_ids
        return ids[1] if len(ids) > 1 else ids[0]


def read_mooncake(path: str | Path) -> Iterator[MooncakeRow]:
    """The trace's rows in order (rows without blocks are skipped); a malformed line raises
    ValueError naming the file and line. A ``.gz`` file is read through gzip."""
    path = Path(path)
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                row = MooncakeRow(
                    float(obj["timestamp"]),
                    int(obj["input_length"]),
                    int(obj["output_length"]),
                    [int(h) for h in obj["hash_ids"]],
                )
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{lineno}: not a Mooncake trace line (need timestamp, input_length, "
                    f"output_length, hash_ids): {e}"
                ) from None
            if row.hash_ids:
                yield row
