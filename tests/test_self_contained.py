"""A clone needs nothing outside itself: no tracked file names a folder beside the repository
(a workspace that only the team had). The shipped workloads are tested in tests/sim/test_data.py."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built from parts so that this file does not match itself.
OUTSIDE = ("../" + "shared", "/work/" + "shared")


def _tracked_text_files():
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, out):
        path = ROOT / name.decode()
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:  # binary (plots, gzipped data)
            continue
        yield path.relative_to(ROOT).as_posix(), data.decode("utf-8", errors="replace")


def test_no_tracked_file_points_outside_the_repository():
    hits = [
        f"{rel}:{i}: {line.strip()[:120]}"
        for rel, text in _tracked_text_files()
        for i, line in enumerate(text.splitlines(), 1)
        if any(s in line for s in OUTSIDE)
    ]
    assert not hits, "files that point outside the repository:\n" + "\n".join(hits)
