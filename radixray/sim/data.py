"""Where the shared workload files live, and the one reader of the Mooncake trace (the simulator
and the live benchmark both replay it). The one place that reads RADIXRAY_DATA_DIR.

Data is read in place, never copied into the repository. The default is ``../shared/data`` relative
to the repository root (the layout of this project's machines).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "data_dir",
    "mooncake_trace_path",
    "azure_trace_path",
    "read_mooncake",
    "MooncakeRow",
    "MOONCAKE_BLOCK_TOKENS",
    "DATA_ENV",
]

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the upstream trace

DATA_ENV = "RADIXRAY_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """``$RADIXRAY_DATA_DIR`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return (_REPO_ROOT.parent / "shared" / "data").resolve()


def mooncake_trace_path() -> Path:
    return data_dir() / "mooncake" / "conversation_trace.jsonl"


def azure_trace_path(service: str = "conv") -> Path:
    if service not in ("conv", "code"):
        raise ValueError(f"azure service must be 'conv' or 'code', got {service!r}")
    return data_dir() / "azure_llm_2023" / f"AzureLLMInferenceTrace_{service}.csv"


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
    ValueError naming the file and line."""
    path = Path(path)
    with path.open() as f:
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
