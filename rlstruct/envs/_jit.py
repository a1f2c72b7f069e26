"""Whether the simulators' compiled CPU steps can run: numba installed, and not switched off.

A compiled step does in one call what the numpy kernels do in about 90 (see BENCHMARKS.md): up to
``10**4`` envs a CPU step costs its number of calls, not its arithmetic. The compiled kernels repeat
the numpy kernels' operations in the same order on the same IEEE doubles, with the transcendental
functions computed by torch outside them, so they give the same bits (``tests/test_simulators.py``):
whether numba is installed changes the speed, never the trajectories.

Set ``RLSTRUCT_JIT=0`` to run the numpy kernels even with numba installed (numba's own
``NUMBA_DISABLE_JIT=1`` does the same, rather than run the kernels as Python loops).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

__all__ = ["jit_kernels", "JIT_ENV_VAR"]

JIT_ENV_VAR = "RLSTRUCT_JIT"
_log = logging.getLogger(__name__)
_loaded: dict[str, ModuleType | None] = {}


def jit_kernels() -> ModuleType | None:
    """The module of compiled kernels, or ``None`` when numba is missing, disabled, or cannot compile here.

    Imported on first use only (numba's import costs about 0.2 s), and once per process; ``RLSTRUCT_JIT``
    is read at every call, so it applies to the envs built after it is set.
    """
    if os.environ.get(JIT_ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if "kernels" not in _loaded:
        _loaded["kernels"] = _import_kernels()
    return _loaded["kernels"]


def _import_kernels() -> ModuleType | None:
    try:
        import numba

        if numba.config.DISABLE_JIT:
            return None
        from rlstruct.envs import _jit_kernels
    except ImportError:
        return None
    except Exception as e:  # numba present but unusable here (e.g. no writable cache location)
        _log.warning("compiled CPU steps unavailable, using the numpy kernels: %s: %s", type(e).__name__, e)
        return None
    return _jit_kernels
