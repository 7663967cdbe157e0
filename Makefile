# The two entry points: `make demo` and `make test`. Everything else is a helper for them.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: slow-test gpu-test install demo test lint typecheck deploy-check pytest compose-test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement would pull multi-GB CUDA wheels.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,dev]'
	bash scripts/ensure-gl.sh $(PY)
	bash scripts/ensure-chromium.sh
	touch $(STAMP)

install: $(STAMP)

# A random-init Qwen2.5-VL learns Sokoban (its image and text grid) on this CPU: solver demonstrations,
# SFT, GRPO, and held-out success before, between and after (configs/sokoban_demo.yaml, README
# "What make demo shows").
DEMO_MODEL := runs/demo-model-tiny
# glibc keeps freed memory for the next step instead of handing it back and faulting it in again: on this
# CPU that took 10 of the demo's SFT steps from 27-32 to 17-19 CPU-seconds (docs/results.md, "The CPU demo as a test").
DEMO_MALLOC := MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=1073741824

demo: install
	test -d $(DEMO_MODEL) || $(PY) -m vistarl.cli.main model tiny --shape tiny --out $(DEMO_MODEL)
	$(DEMO_MALLOC) $(PY) -m vistarl.cli.main demo learn --config configs/sokoban_demo.yaml

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: install
	$(PY) -m mypy

# docker-compose.yml, the Dockerfile, the scripts and the Kubernetes manifests and overlays, with the
# pinned tools of the dev extra (see docs/deploy.md, "Checks").
deploy-check: install
	bash scripts/check-deploy.sh $(VENV)/bin

# Three workers on the 2-core machine: a test that waits (a server starting, a sleep, a subprocess) leaves
# its core to another. Each file runs whole on one worker, so module fixtures start once; the slowest
# files go first (tests/conftest.py). The 30 slowest tests close the log.
PYTEST_WORKERS ?= 3

pytest: install
	bash scripts/ensure-redis.sh
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 -m "not slow"

# The tests marked slow, a minute or more of CPU each, so that `make test` stays within 10 minutes on 2
# cores: `vistarl[train]` alone in a fresh venv, the benchmark scripts (train_step, weight_sync, grpo_step)
# end to end, the compiled model, the learning curves (GRPO, PPO with GAE, turn-level GAE), resuming from a
# checkpoint, torchrun ranks (FSDP2 update, rank commands, bucketed weight push), the compose file's
# services training twice, `vistarl sft` to a checkpoint, a run whose env server dies, and the VSI smoke
# eval. CI runs them after `make test`.
slow-test: install
	bash scripts/ensure-redis.sh
	$(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=10 -m slow

# The tests marked gpu, which need CUDA and are skipped without it, so CI (CPUs only) never runs them: the
# varlen FlashAttention kernel (packed rows, and cached keys before a prompt's rest), the HF engine's decode
# steps captured in CUDA graphs against eager ones, and its prefix cache on the static cache in graphs.
# Run it on a machine with a GPU (docs/engines.md, "Prefix cache"), with a Python that holds a CUDA build of
# torch and vistarl's train extra (GPU_PYTHON; `make install`'s venv has the CPU build, so it is not used).
# Only the files that hold gpu tests are collected: a GPU host needs none of the other tests' tools.
GPU_PYTHON ?= python3
GPU_TESTS := $(shell grep -l 'pytest.mark.gpu' tests/test_*.py)

gpu-test:
	$(GPU_PYTHON) -m pytest -q -p no:cacheprovider --durations=10 -m gpu $(GPU_TESTS)

# Lint, mypy and the deploy checks run beside pytest, each check's output whole when it ends (-Otarget);
# pytest prints as it goes. Every check and pytest run to the end; any failure fails `make test`.
CHECKS := lint typecheck deploy-check

test: install
	$(MAKE) --no-print-directory -j3 -k -Otarget $(CHECKS) & checks=$$!; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$checks && exit $$tests

# `docker compose up` for real (tests/test_compose_docker.py; docs/deploy.md, "The real compose test"):
# starts a Docker daemon if none answers, builds the image, trains through a crashed worker and env
# server. Where Docker cannot run it is skipped, except under CI (CI=true), where that fails.
compose-test: install
	@if bash scripts/ensure-docker.sh; then \
		VISTARL_COMPOSE_TEST=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout=3600 tests/test_compose_docker.py; \
	elif [ "$${CI:-}" = "true" ]; then \
		echo "compose-test: Docker cannot run here, and under CI that is a failure" >&2; exit 1; \
	else \
		echo "compose-test: skipped: Docker cannot run here (scripts/ensure-docker.sh says why)"; \
	fi

clean:
	rm -rf $(VENV) runs .mypy_cache .ruff_cache .pytest_cache
