"""serve_uvicorn settles the collector once the process has started (``settle_gc``): what it
built is frozen out of the collector's walks, and the young generation is collected less often."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A served process: a bare ASGI app on a free port; on ready it reports the collector's state
# and leaves at once (os._exit: the server would otherwise serve until interrupted).
SERVED = """
import gc, json, os, sys
from radixray.api.server import serve_uvicorn

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

def ready():
    print(json.dumps([gc.get_freeze_count(), gc.get_threshold(), BEFORE]), flush=True)
    os._exit(0)

BEFORE = [gc.get_freeze_count(), gc.get_threshold()]
serve_uvicorn(app, "127.0.0.1", 0, ready)
"""


def test_a_served_process_freezes_what_it_built_and_collects_young_objects_less_often():
    proc = subprocess.run(
        [sys.executable, "-c", SERVED],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    frozen, threshold, (frozen_before, threshold_before) = json.loads(proc.stdout)
    assert frozen_before == 0 and frozen > 10_000  # the modules and the app, at least
    assert threshold_before[0] < threshold[0] == 20_000  # raised from Python's default
    assert threshold[1:] == threshold_before[1:]  # the older generations' as they were
