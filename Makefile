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
# What `make demo` needs: the core, and what its run shows (learning curve, progress bar, TensorBoard events).
DEMO_EXTRAS := plot,progress,tensorboard
# What `make install` and `make test` install: every extra CI tests.
EXTRAS := test,tensorboard,plot,progress,ray,fast,atari,minatar,jax,mujoco,brax,video

.PHONY: demo test quick lint install bench clean

# A full install holds the demo's too: it stamps both.
$(VENV)/.installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH)
	$(PIP) install -q -e '.[$(EXTRAS)]'
	touch $@ $(VENV)/.demo-installed

$(VENV)/.demo-installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH)
	$(PIP) install -q -e '.[$(DEMO_EXTRAS)]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/rlstruct train a2c --env CartPole-v1 --logdir runs/demo

PYTEST := $(PY) -m pytest -q -p no:cacheprovider --doctest-modules rlstruct agents batchers algos tests

test: install lint
	$(PYTEST)

# The suite without the tests marked `slow` (learning runs, CLI end to end, long property runs): a quick check while
# editing. CI runs `make test`.
quick: install lint
	$(PYTEST) -m "not slow"

lint: install
	$(PY) -m ruff check .

bench: install
	$(PY) benchmarks/structures.py
	$(PY) benchmarks/envs.py
	$(PY) benchmarks/batchers.py
	$(PY) benchmarks/ray_batcher.py

clean:
	rm -rf $(VENV) runs .pytest_cache build *.egg-info
