"""Execute notebooks/policy_experiments.ipynb headless on a short slice of the Mooncake trace."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # notebook

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "policy_experiments.ipynb"


def test_policy_notebook_runs(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("RADIXRAY_NB_LIMIT", "300")
    # The kernel inherits the environment: the slice size and a headless matplotlib.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    outputs = "".join(o.get("text", "") for c in cells for o in c.get("outputs", []))
    # The slice ran (300 requests), every policy and the custom one are in the table.
    assert outputs.startswith("300 requests,"), outputs[:200]
    for name in ("round_robin", "least_load", "consistent_hash", "cache_aware", "kv_cost"):
        assert re.search(rf"^{name}\b", outputs, re.M), name
    assert re.search(r"^ttft\b", outputs, re.M) and re.search(
        r"^match_unless_queued\b", outputs, re.M
    )
    # The four index views each report a finite hit rate in [0, 1] and finite latencies.
    views = re.findall(r"^(.+?)\s+hit (\S+)\s+p50 (\S+)\s+p99 (\S+)$", outputs, re.M)
    assert [v[0].strip() for v in views] == [
        "decisions + events 50 ms",
        "decisions only",
        "events only, 0 s",
        "events only, 1 s",
    ]
    for _, hit, p50, p99 in views:
        assert 0.0 <= float(hit) <= 1.0 and math.isfinite(float(p50)) and float(p99) >= float(p50)
