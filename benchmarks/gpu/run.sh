#!/usr/bin/env bash
# Runs THERE, on the device machine, from the repository root: one command, ~5 minutes (at most
# 570 s: RADIXRAY_GPU_BUDGET), every step time-boxed, everything under $OUT (benchmarks/README.md,
# "Running on a GPU"):
#
#     bash benchmarks/gpu/run.sh        # carry [".whl"] (benchmarks/gpu/prepare.sh made it)
#     bash benchmarks/gpu/run.sh big    # a second call: the machine, then big_check.py (8B and
#                                       # 0.6B shapes against the card's limits, ~3 minutes)
#
# Here, without CUDA (or with RADIXRAY_GPU_DRY=1), it runs the CPU-safe parts with .venv's
# python and no install, marks the CUDA ones skipped and writes to $OUT or a new /tmp folder:
# a check of the script itself. Files back: log, summary.txt, env.txt, pytest_gpu.xml,
# bench_kernels.txt, state_kernels.txt, engine_check.json, serve_check.json (the device tool
# returns at most 8).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} RAY_AUTH_MODE=disabled
OUT=${OUT:-$(mktemp -d /tmp/radixray-gpu.XXXXXX)}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
TEE=$!
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
T0=$SECONDS

PY=python3
DRY=${RADIXRAY_GPU_DRY:-0}
if [ "$DRY" != 1 ] && ! nvidia-smi -L >/dev/null 2>&1; then
    DRY=1
    echo "# no GPU (nvidia-smi failed): dry run"
fi
if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    export PYTHONPATH=$PWD
else
    # the device README's line: the wheels that the image lacks, beside its own packages
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; then
        echo "install rc=1" >>"$SUMMARY"
    fi
    # Ray, trimmed (prepare.sh, ray_site.sh): for step (g), radixray serve
    tar -xJf .whl/ray-trimmed.tar.xz -C /tmp/site || echo "install_ray rc=1" >>"$SUMMARY"
    export PYTHONPATH=/tmp/site:$PWD
fi

# step NAME SECONDS CMD...: run CMD under `timeout`, record "NAME rc=N Ns" in summary.txt.
# rc 124/137: it ran out of time.
# The steps' limits add up to more than one device call may run (600 s): each step also stops
# where the run's budget ends (RADIXRAY_GPU_BUDGET, 570 s less 20 s kept for the summary), so a
# slow step costs the steps after it, never the summary and the files already in $OUT.
BUDGET=${RADIXRAY_GPU_BUDGET:-570}
step() {
    local name=$1 limit=$2 start=$SECONDS rc left
    shift 2
    left=$((BUDGET - 20 - (SECONDS - T0)))
    if [ "$left" -lt 10 ]; then
        echo "$name skipped (out of time: ${left}s of the budget left)" | tee -a "$SUMMARY"
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo
    echo "=== $name (at most ${limit}s, $((SECONDS - T0))s into the run) ==="
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$SUMMARY"
}
skip() {
    echo "$1 skipped (no CUDA)" | tee -a "$SUMMARY"
}

# (a) the machine and the stack
env_info() {
    nvidia-smi || echo "nvidia-smi: none"
    "$PY" - <<'EOF'
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "sm", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count,
          "memory GiB", round(p.total_memory / 2**30, 1))
try:
    import triton
    print("triton", triton.__version__)
except ImportError as e:
    print("triton: not importable:", e)
import radixray.worker, msgspec, fastapi, pydantic  # the kit's imports resolve
print("radixray imports ok; msgspec", msgspec.__version__, "pydantic", pydantic.VERSION)
EOF
}
step env 45 bash -c "$(declare -f env_info); PY=$PY; env_info" > >(tee "$OUT/env.txt")

finish() {
    echo
    echo "=== summary ($((SECONDS - T0))s) ==="
    cat "$SUMMARY"
    ls -la "$OUT"
    local status=0
    grep -q 'rc=[1-9]' "$SUMMARY" && status=1
    exec >&- 2>&-
    wait "$TEE" # the log complete before the command returns
    exit $status
}

# `run.sh big`: the engine at 8B and 0.6B shapes against the card's limits, on its own; also
# the simulator's timing fitted at 8B (~75 s), timing_<card>_<date>_<shapes>.json in $OUT
if [ "${1:-all}" = big ]; then
    if [ "$DRY" = 1 ]; then
        step big_check 120 "$PY" benchmarks/gpu/big_check.py --quick --json "$OUT/big_check.json"
    else
        step big_check 420 "$PY" benchmarks/gpu/big_check.py --json "$OUT/big_check.json"
    fi
    finish
fi

# (b) the repository's GPU tests (the files that mark any), junit XML kept. A conftest that
# cannot import (a package the kit lacks) fails collection: then once more without conftests.
gpu_tests=$(grep -rl "mark.gpu" tests --include='*.py' | sort | tr '\n' ' ')
gpu_pytest() {
    "$PY" -m pytest -m gpu -x -q -p no:cacheprovider --timeout 60 \
        --junitxml="$OUT/pytest_gpu.xml" "$@" $gpu_tests
    local rc=$?
    if [ $rc -eq 2 ] || [ $rc -eq 4 ]; then
        echo "# collection failed (rc=$rc): again with --noconftest"
        "$PY" -m pytest -m gpu -x -q -p no:cacheprovider --timeout 60 --noconftest \
            --junitxml="$OUT/pytest_gpu.xml" "$@" $gpu_tests
        rc=$?
    fi
    return $rc
}
# 180 s: issue 43's fused-kernel GPU tests add three pairs of engines and a compiled subprocess
step pytest_gpu 180 bash -c "$(declare -f gpu_pytest); PY=$PY OUT=$OUT gpu_tests='$gpu_tests' gpu_pytest"

# (c) the decode kernels at realistic sizes (its markdown table; the script writes no JSON)
if [ "$DRY" = 1 ]; then
    skip bench_kernels
    step bench_kernels_cpu_quick 60 "$PY" benchmarks/bench_kernels.py --quick
else
    step bench_kernels 120 "$PY" benchmarks/bench_kernels.py --reps 10 \
        > >(tee "$OUT/bench_kernels.txt")
fi

# (c2) the state layers' decode kernels: Triton against the reference at Granite-4.0-H's shapes,
# batch 1/8/64 (checked, then timed); without CUDA, compiled for sm_90 and the reference timed
if [ "$DRY" = 1 ]; then
    step state_kernels_quick 60 "$PY" benchmarks/gpu/state_kernels.py --quick
else
    step state_kernels 90 "$PY" benchmarks/gpu/state_kernels.py > >(tee "$OUT/state_kernels.txt")
fi

# (d) + (e) the engine: greedy tokens equal the CPU's, decode tokens/s, the host tier's copies
if [ "$DRY" = 1 ]; then
    step engine_check 120 "$PY" benchmarks/gpu/engine_check.py --quick --host \
        --json "$OUT/engine_check.json"
else
    step engine_check 180 "$PY" benchmarks/gpu/engine_check.py --device cuda --host \
        --json "$OUT/engine_check.json"
fi

# (f) where a decode step's time goes now (its split and profiles to the log; files stay there)
if [ "$DRY" = 1 ]; then
    step profile_step 60 "$PY" benchmarks/gpu/profile_step.py --quick --out "$(mktemp -d)"
else
    step profile_step 90 "$PY" benchmarks/gpu/profile_step.py --batch 8 --out /tmp/profile
fi

# (g) radixray serve: Ray, one worker actor (num_gpus=1), the router; streamed chat requests,
# two sharing a prefix (cached tokens reported), at Qwen3-0.6B's shapes with random weights
if [ "$DRY" = 1 ]; then
    step serve_check_quick 90 "$PY" benchmarks/gpu/serve_check.py --quick \
        --json "$OUT/serve_check.json"
else
    step serve_check 120 "$PY" benchmarks/gpu/serve_check.py --json "$OUT/serve_check.json"
fi

finish
