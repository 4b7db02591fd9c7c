"""The GPU machine's imports, here: with this folder on PYTHONPATH, every Python process (Ray's
raylet-started workers and agents too: they inherit PYTHONPATH and run ``sitecustomize``) can
import only the standard library, the device image's packages (``image_packages.txt``), the
kit's wheels (``wheels.txt``), ray and the repository's own packages. Any other top-level name
is refused as if missing, and appended to $RADIXRAY_IMAGE_ONLY_LOG (pid, name, argv) when set:
most are optional imports that fall back; one that breaks the run is a package to carry.

    PYTHONPATH=/tmp/ray311:benchmarks/gpu/image_only:$PWD RADIXRAY_IMAGE_ONLY_LOG=/tmp/b.txt \\
        .venv/bin/python benchmarks/gpu/serve_check.py --quick

(benchmarks/README.md, "Running on a GPU": the proof that the trimmed Ray and the kit suffice.)
tests/benchmarks/test_gpu_kit.py blocks the same way inside one process.
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
from pathlib import Path


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed(path: Path) -> set[str]:
    names = (re.split(r"[=<>#\s\[;]", line.strip(), maxsplit=1)[0] for line in path.open())
    return {_norm(n) for n in names if n}


_KIT = Path(__file__).resolve().parents[1]
_ALLOWED = _listed(_KIT / "image_packages.txt") | _listed(_KIT / "wheels.txt") | {"ray"}
_LOCAL = {"radixray", "tests", "benchmarks", "sitecustomize"}
_OWNERS = importlib.metadata.packages_distributions()
_FIND = importlib.machinery.PathFinder.find_spec
_REFUSED: set[str] = set()


def _allowed(top: str) -> bool:
    if top in sys.stdlib_module_names or top in _LOCAL:
        return True
    if any(_norm(d) in _ALLOWED for d in _OWNERS.get(top, [])):
        return True
    spec = None if top in _OWNERS else _FIND(top)  # the interpreter's own, Ray's vendored ones
    return bool(spec and spec.origin and "-packages" not in spec.origin)


class _ImageOnly(importlib.abc.MetaPathFinder):
    """The path finder, blind to what the image lacks (distributions still found: metadata)."""

    find_distributions = staticmethod(importlib.machinery.PathFinder.find_distributions)

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if _allowed(top):
            return _FIND(name, path, target)
        log = os.environ.get("RADIXRAY_IMAGE_ONLY_LOG")
        if log and top not in _REFUSED:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {top} {' '.join(sys.argv)[:160]}\n")
        _REFUSED.add(top)
        return None


sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = _ImageOnly()
