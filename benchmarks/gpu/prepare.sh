#!/usr/bin/env bash
# Runs HERE (needs PyPI), from anywhere: downloads the cp312 manylinux wheels that the GPU
# machine lacks (benchmarks/gpu/wheels.txt) into the ignored folder .whl/ of the repository,
# packs Ray trimmed (ray_site.sh, ray_trim.txt: .whl/ray-trimmed.tar.xz, ~28 MB, a minute of
# xz), checks that each needs nothing more and that all of it stays under the carry budget,
# and prints the device call to make (benchmarks/README.md, "Running on a GPU").
#
#     benchmarks/gpu/prepare.sh            # PYTHON=... to choose the interpreter whose pip runs
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
BUDGET_MIB=55 # the device call carries 64 MiB with the working tree (~5 MiB) included

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

rm -rf .whl
mkdir -p .whl
mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' benchmarks/gpu/wheels.txt | grep -v '^$')
platforms=()
for n in 28 27 17 24 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"

# One wheel per pin, and none needs a package outside the image and the kit.
status=0
count=$(find .whl -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#pins[@]}" ]; then
    echo "expected ${#pins[@]} wheels, got $count" >&2
    status=1
fi
known=$(sed -e 's/#.*//' -e 's/[=<>].*//' benchmarks/gpu/image_packages.txt benchmarks/gpu/wheels.txt |
    tr 'A-Z_.' 'a-z--' | grep -v '^ *$')
# Ray, unpacked and trimmed into a scratch folder, packed into the carry
ray_tmp=$(mktemp -d)
trap 'rm -rf "$ray_tmp"' EXIT
PYTHON=$PY bash benchmarks/gpu/ray_site.sh 3.12 "$ray_tmp" .whl/ray-trimmed.tar.xz || status=1
metadata() { # the METADATA of a wheel, or of the unpacked Ray
    if [ -d "$1" ]; then cat "$1"/ray-*.dist-info/METADATA
    else unzip -p "$1" "*.dist-info/METADATA"; fi
}
for w in .whl/*.whl "$ray_tmp"; do
    # each Requires-Dist (no extras; markers ignored) must be in the image or in the kit
    for need in $(metadata "$w" | grep '^Requires-Dist' |
        grep -v 'extra ==' | sed -E 's/^Requires-Dist: *([A-Za-z0-9._-]+).*/\1/' |
        tr 'A-Z_.' 'a-z--'); do
        if ! grep -qx "$need" <<<"$known"; then
            echo "$(basename "$w") needs $need: not in the image, not in wheels.txt" >&2
            status=1
        fi
    done
done

bytes=$(du -cb .whl/* | tail -1 | cut -f1) # the wheels and Ray's archive
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "wheels ($count) and Ray: $(mib "$bytes") MiB; tracked tree $(mib "$tree") MiB"
if [ "$bytes" -gt $((BUDGET_MIB * 1048576)) ]; then
    echo ".whl/ exceeds ${BUDGET_MIB} MiB: the call could not carry it" >&2
    status=1
fi
ls -1 .whl
cat <<'EOF'

device call (one command, ~5-7 minutes of device time with the machine's start):
  carry:     [".whl"]
  timeout_s: 600
  command:   bash benchmarks/gpu/run.sh
EOF
exit $status
