# Two commands set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch's build: `cpu` (PyTorch's CPU wheels, ~0.2 GB) on a machine without nvidia-smi, else `pypi` (a bare `torch`
# from PyPI: the multi-GB CUDA build on Linux x86_64). `make demo TORCH_BUILD=cpu` asks for the CPU build anywhere.
TORCH_BUILD ?= $(if $(shell command -v nvidia-smi 2>/dev/null),pypi,cpu)
# The CPU build alone first, without its dependencies: it is the one package that comes from requirements/cpu.txt's
# index (pip asks every index for every package it resolves, and retries one it cannot reach); the next install takes
# torch's dependencies from PyPI.
INSTALL_TORCH := $(if $(filter cpu,$(TORCH_BUILD)),$(PIP) install -q --no-deps -r requirements/cpu.txt,@true)
# Everything else through uv, which pip installs into the venv at this version: uv resolves and downloads in parallel,
# and installed the extras of `make install` in 16 s on a 2-vCPU VM with an empty cache where pip took 214 s, the same
# versions. torch stays pip's install above (uv reads none of pip's configuration, where a machine may keep its
# wheels), and uv keeps the torch it finds.
UV_VERSION := 0.13.9
INSTALL_UV := $(PIP) install -q uv==$(UV_VERSION)
UV_PIP := $(VENV)/bin/uv pip install -q --python $(PY)
# The package installs editable in setuptools' strict mode: build/__editable__.rlstruct-*/ holds a link to each of its
# files, laid out as the installed package (agents/ as rlstruct/agents/, ...), and a .pth line puts that folder on
# sys.path, where editors and type checkers (jedi, pyright) find rlstruct.agents, .batchers and .algos; the default
# mode maps them with an import hook, code that static tools do not run. The links are laid at install time, so a
# module added or removed needs them laid again: `make install` does it each time it runs (`make test` runs it).
STRICT := --config-settings-package rlstruct:editable_mode=strict
# What `make demo` needs: the core, and what its run shows (learning curve, progress bar, TensorBoard events).
DEMO_EXTRAS := plot,progress,tensorboard
# What `make install` and `make test` install: every extra CI tests.
EXTRAS := test,tensorboard,plot,progress,ray,fast,atari,minatar,box2d,jax,mujoco,brax,video,stats,sweep,mlflow,wandb,trackio,export,datasets

# Python keeps compiled modules (`__pycache__`, git-ignored) even where the environment turns that off: without them
# every process the suite starts (each pytest worker, each batcher worker, each `rlstruct` command) compiles the
# package's modules again, and pytest collects in twice the time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test quick lint install bench clean docs docs-deps docs-check docs-screenshot

# A full install holds the demo's too: it stamps both.
$(VENV)/.installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH)
	$(INSTALL_UV)
	$(UV_PIP) -e '.[$(EXTRAS)]' $(STRICT)
	touch $@ $(VENV)/.demo-installed

$(VENV)/.demo-installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH)
	$(INSTALL_UV)
	$(UV_PIP) -e '.[$(DEMO_EXTRAS)]' $(STRICT)
	touch $@

# The links laid again, for a module added or removed since the last install: the stamps follow pyproject.toml only.
install: $(VENV)/.installed
	$(UV_PIP) --no-deps -e . $(STRICT)

demo: $(VENV)/.demo-installed
	$(VENV)/bin/rlstruct train a2c --env CartPole-v1 --logdir runs/demo

# Two pytest workers (pytest-xdist), one per core of a 2-core machine: every test spawns or steps work of its own
# (batcher workers, torchrun ranks), so more workers than cores only slows each test. `make test TEST_WORKERS=4` on a
# larger machine. --dist loadgroup keeps the tests of one xdist_group (the Ray tests) on one worker.
TEST_WORKERS ?= 2
# PYTEST_ARGS: more pytest options, e.g. `make quick PYTEST_ARGS=--junitxml=quick.xml` for the time guard's headroom
# (benchmarks/test_guard.py reads it).
PYTEST_ARGS ?=
# --cpu-budget: each kind of test's CPU seconds over the run against its budget, and the 25 costliest tests;
# --leak-check: no process, /dev/shm file or temp folder entry left behind (tests/suite_checks.py).
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --cpu-budget --leak-check \
	$(PYTEST_ARGS) --doctest-modules rlstruct agents batchers algos tests

test: install lint
	$(PYTEST)

# The suite without the tests marked `slow` (1.5 CPU s or more: learning runs, CLI end to end, fault injection,
# subprocesses): a quick check while editing, under 3 minutes on a 2-vCPU VM. CI runs `make test`.
quick: install lint
	$(PYTEST) -m "not slow"

lint: $(VENV)/.installed
	$(PY) -m ruff check .

bench: install
	$(PY) benchmarks/structures.py
	$(PY) benchmarks/envs.py
	$(PY) benchmarks/batchers.py
	$(PY) benchmarks/ray_batcher.py

# The documentation site: sources in docs/ and mkdocs.yml, built into site/ with --strict (a broken link, a missing
# reference or a docstring that does not render fails the build).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(INSTALL_UV)
	$(UV_PIP) -e '.[docs]' $(STRICT)
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# What tests/project/test_docs.py needs to run rather than skip: the docs extra and Debian's chromium (apt, as root or
# through sudo); and pdflatex with booktabs, which compiles `rlstruct compare --table latex` in tests/algos/test_compare.py.
# CI runs it before `make test`.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
docs-deps: $(VENV)/.docs-installed
	command -v chromium >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	command -v pdflatex >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends texlive-latex-base texlive-latex-recommended)

# The site built and read as a reader would: headless Chromium opens the start page, an algorithm page and an API page.
docs-check: docs-deps
	$(PY) -m pytest -q -p no:cacheprovider tests/project/test_docs.py

# Retakes the start page's screenshot kept under docs/ for reviewers.
docs-screenshot: docs-deps
	RLSTRUCT_DOCS_SCREENSHOT=docs/assets/start-page.png $(PY) -m pytest -q -p no:cacheprovider tests/project/test_docs.py -k screenshot

clean:
	rm -rf $(VENV) runs .pytest_cache build *.egg-info
