"""Collection settings for ``pytest --doctest-modules`` over the packages (see the Makefile's ``test``)."""

import importlib.util
import os

# The whole run's checks (--cpu-budget, --leak-check), beside each test's own time guard in tests/conftest.py.
pytest_plugins = ["tests.suite_checks"]

# Before torch loads OpenMP (here, in every xdist worker and in every subprocess a test starts): its threads sleep
# when idle instead of spinning. Spinning threads on a loaded machine charge a test's CPU time for nothing (5.2 CPU s
# instead of 0.6 for one evaluation test), and the time guard of tests/conftest.py counts CPU time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One OpenMP thread a process unless a test asks for more (torch.set_num_threads, a run's --torch-threads): the
# suite's two workers already fill two cores, and every command or tutorial it starts in a fresh process would
# otherwise start a thread per core that fights the others for them (`rlstruct eval` of a small run: 6.9 CPU s with
# torch's default threads on a busy 2-core machine, 4.0 with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The compiled kernels import numba at module level (the extra ``fast``); without it the simulators run their
# numpy kernels, and the module is never imported.
collect_ignore = [] if importlib.util.find_spec("numba") else ["rlstruct/envs/_jit_kernels.py"]
collect_ignore_glob = [] if importlib.util.find_spec("numba") else ["rlstruct/envs/minatar/_jit_*.py"]
# The mujoco-torch env's example builds an env (the extra ``mujoco``).
if not importlib.util.find_spec("mujoco_torch"):
    collect_ignore.append("rlstruct/envs/mujoco_torch_env.py")
# The Brax env's example builds a Brax env (the extra ``brax``).
if not importlib.util.find_spec("brax"):
    collect_ignore.append("rlstruct/envs/brax_env.py")
