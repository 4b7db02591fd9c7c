"""Where the shared workload files live. The one place the simulator reads RADIXRAY_DATA_DIR.

Data is read in place, never copied into the repository. The default is ``../shared/data`` relative
to the repository root (the layout of this project's machines).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "mooncake_trace_path", "azure_trace_path", "DATA_ENV"]

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
