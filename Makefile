# Two commands set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# On a machine without an NVIDIA GPU, install the CPU build of torch (a bare `torch` is a multi-GB CUDA build).
TORCH_REQ := $(if $(shell command -v nvidia-smi 2>/dev/null),,-r requirements/cpu.txt)

.PHONY: demo test quick lint install bench clean

$(VENV)/.installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_REQ) -e '.[test,tensorboard,plot,progress,ray,fast,atari,minatar,jax,mujoco,brax]'
	touch $@

install: $(VENV)/.installed

demo: install
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
