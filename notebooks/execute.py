"""Execute policy_experiments.ipynb on the whole Mooncake trace and save it with its outputs
(tables and figures), so that a reader sees the results without running it: `make notebook`.

Progress bars go to the terminal while it runs, not into the saved notebook.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "policy_experiments.ipynb"


def main() -> int:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(HERE.parent)}}
    )
    t0 = time.perf_counter()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            print(f"cell {i}: {cell.source.splitlines()[0][:70]}", file=sys.stderr, flush=True)
            client.execute_cell(cell, i)
            # keep results (stdout, tables, figures), drop progress bars and warnings
            cell.outputs = [
                o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")
            ]
    nbformat.write(nb, NOTEBOOK)
    print(f"{NOTEBOOK.name} executed in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
