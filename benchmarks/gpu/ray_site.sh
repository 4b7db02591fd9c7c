#!/usr/bin/env bash
# Ray for the GPU machine, whose image lacks it: the ray wheel for one CPython version, unpacked
# into DEST with what radixray never imports dropped (ray_trim.txt beside this file, a reason a
# line), and with ARCHIVE, packed as an xz tar for the device call's carry (prepare.sh makes
# .whl/ray-trimmed.tar.xz; run.sh unpacks it into /tmp/site). The wheel is ~79 MB, the trimmed
# tree ~125 MB unpacked and ~28 MB packed (xz -9 takes about a minute here).
#
#     benchmarks/gpu/ray_site.sh 3.12 /tmp/ray312 .whl/ray-trimmed.tar.xz   # prepare.sh's call
#     benchmarks/gpu/ray_site.sh 3.11 /tmp/ray311   # the proof: serve_check.py --quick with
#                                                   # PYTHONPATH=/tmp/ray311:$PWD (README)
set -euo pipefail

RAY_VERSION=2.60.0 # what .venv runs here (pyproject: ray[serve]>=2.40)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYVER=${1:?usage: ray_site.sh PYTHON_VERSION DEST [ARCHIVE]}
DEST=${2:?usage: ray_site.sh PYTHON_VERSION DEST [ARCHIVE]}
ARCHIVE=${3:-}
PY=${PYTHON:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux2014_x86_64 -d "$tmp" "ray==$RAY_VERSION"
rm -rf "$DEST"
mkdir -p "$DEST"
unzip -q "$tmp"/ray-*.whl -d "$DEST"

# Each listed path must exist: a list that no longer matches the wheel is an error, not a no-op.
while read -r path; do
    if [ ! -e "$DEST/$path" ]; then
        echo "ray_trim.txt: $path is not in ray $RAY_VERSION's wheel" >&2
        exit 1
    fi
    rm -rf "${DEST:?}/$path"
done < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/ray_trim.txt" | grep -v '^$')
echo "ray $RAY_VERSION cp$PYVER trimmed: $(du -sh "$DEST" | cut -f1) unpacked in $DEST"

if [ -n "$ARCHIVE" ]; then
    XZ_OPT=-9 tar -C "$DEST" -cJf "$ARCHIVE" .
    echo "packed: $ARCHIVE, $(du -h "$ARCHIVE" | cut -f1)"
fi
