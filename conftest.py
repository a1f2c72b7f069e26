"""Collection settings for ``pytest --doctest-modules`` over the packages (see the Makefile's ``test``)."""

import importlib.util

# The compiled kernels import numba at module level (the extra ``fast``); without it the simulators run their
# numpy kernels, and the module is never imported.
collect_ignore = [] if importlib.util.find_spec("numba") else ["rlstruct/envs/_jit_kernels.py"]
