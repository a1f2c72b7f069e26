"""Whether the simulators' compiled CPU steps can run: numba installed, and not switched off.

The compiled kernels repeat the numpy kernels' operations in the same order on the same IEEE doubles (the
transcendental functions computed by torch outside them), so whether numba is installed changes the speed, never
the trajectories. ``RLSTRUCT_JIT=0`` (or numba's ``NUMBA_DISABLE_JIT=1``) keeps the numpy kernels. Loading numba
costs a short run more than it saves, so a simulator starts on its numpy kernels and moves to the compiled ones
after :func:`jit_after` env steps (``RLSTRUCT_JIT_AFTER=N``; ``0``: from the first step).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from types import ModuleType

__all__ = ["jit_kernels", "jit_module", "jit_wanted", "jit_after", "JIT_ENV_VAR", "JIT_AFTER_ENV_VAR",
           "JIT_AFTER_DEFAULT"]

JIT_ENV_VAR = "RLSTRUCT_JIT"
JIT_AFTER_ENV_VAR = "RLSTRUCT_JIT_AFTER"
#: env steps (rows) a simulator steps on its numpy kernels before it loads the compiled ones
JIT_AFTER_DEFAULT = 65_536
_KERNELS = "rlstruct.envs._jit_kernels"
_log = logging.getLogger(__name__)
_loaded: dict[str, ModuleType | None] = {}


def jit_wanted() -> bool:
    """True unless ``RLSTRUCT_JIT`` switches the compiled steps off or numba is not installed (imports nothing)."""
    if os.environ.get(JIT_ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _loaded.get(_KERNELS, True) is None:  # tried, and unusable here
        return False
    if "numba" in sys.modules:
        return sys.modules["numba"] is not None
    return importlib.util.find_spec("numba") is not None


def jit_after() -> int:
    """Env steps a simulator runs on its numpy kernels before its compiled ones (``RLSTRUCT_JIT_AFTER``, default
    :data:`JIT_AFTER_DEFAULT`; ``0``: from the first step).

    Raises:
        ValueError: ``RLSTRUCT_JIT_AFTER`` is not an integer >= 0.
    """
    raw = os.environ.get(JIT_AFTER_ENV_VAR, "").strip()
    if not raw:
        return JIT_AFTER_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{JIT_AFTER_ENV_VAR} must be an integer >= 0 (env steps before the compiled CPU steps), "
                         f"got {raw!r}; unset it for {JIT_AFTER_DEFAULT}, or set 0 for compiled steps from the start")
    return value


def jit_kernels() -> ModuleType | None:
    """The module of compiled kernels (:mod:`rlstruct.envs._jit_kernels`), or ``None`` when numba is missing,
    disabled, or cannot compile here (see :func:`jit_module`)."""
    return jit_module(_KERNELS)


def jit_module(name: str) -> ModuleType | None:
    """The module of compiled kernels ``name`` (one that imports numba), or ``None`` when numba is missing,
    disabled, or cannot compile here.

    Imported on first use only (numba's import is slow), and once per process; ``RLSTRUCT_JIT``
    is read at every call, so it applies to the envs built after it is set.
    """
    if os.environ.get(JIT_ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if name not in _loaded:
        _loaded[name] = _import_kernels(name)
    return _loaded[name]


def _import_kernels(name: str) -> ModuleType | None:
    try:
        import numba

        if numba.config.DISABLE_JIT:
            return None
        module = importlib.import_module(name)
    except ImportError:
        return None
    except Exception as e:  # numba present but unusable here (e.g. no writable cache location)
        _log.warning("compiled CPU steps unavailable, using the uncompiled ones: %s: %s", type(e).__name__, e)
        return None
    return module
