"""Execute notebooks/policy_experiments.ipynb headless on a short slice of the Mooncake trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixray.sim import mooncake_trace_path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "policy_experiments.ipynb"


@pytest.mark.skipif(not mooncake_trace_path().exists(), reason="shared Mooncake trace absent")
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
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "match_unless_queued" in outputs
    assert "events only, 1 s" in outputs
    assert os.environ["RADIXRAY_NB_LIMIT"] == "300"
