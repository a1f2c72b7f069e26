"""Deterministic mode: the same seed gives the same bits on the same device.

What torch needs for it (its reproducibility notes): ``torch.use_deterministic_algorithms(True)`` (a deterministic
kernel where torch has one, e.g. the sorted ``index_add_``/``scatter_add_``/``index_put_(accumulate=True)`` on CUDA,
and an error where it has none), cuDNN's deterministic convolutions without its benchmark (which may pick another
algorithm each launch), inductor's own deterministic mode (no on-device benchmarking that changes the numerics from one
launch to the next), and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (or ``:16:8``), which cuBLAS reads once, when the CUDA
context is made: it must be in the environment before the process's first CUDA call.

:func:`deterministic_mode` sets all of that for a run and restores it after; it also puts :data:`DETERMINISTIC_ENV`
and the cuBLAS setting in ``os.environ``, which spawned worker processes inherit, and a worker calls
:func:`apply_from_environment` before it builds anything.

>>> with deterministic_mode():
...     torch.are_deterministic_algorithms_enabled(), os.environ[CUBLAS_WORKSPACE_ENV]
(True, ':4096:8')
>>> torch.are_deterministic_algorithms_enabled()
False
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch

from rlstruct.errors import ConfigError

__all__ = ["CUBLAS_WORKSPACE_ENV", "CUBLAS_WORKSPACE_VALUES", "DETERMINISTIC_ENV", "apply_from_environment",
           "check_cublas_workspace", "deterministic_mode", "set_workspace_at_start", "worker_environment"]

#: cuBLAS's workspace setting, read when the CUDA context is made
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
#: the values with which cuBLAS is deterministic (NVIDIA's cuBLAS notes); the first is the one rlstruct sets
CUBLAS_WORKSPACE_VALUES = (":4096:8", ":16:8")
#: set to ``1`` by :func:`deterministic_mode`: a worker process started under it turns deterministic mode on too
DETERMINISTIC_ENV = "RLSTRUCT_DETERMINISTIC"
#: inductor's deterministic mode (``torch._inductor.config.deterministic``), read when inductor is imported
_INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"


def set_workspace_at_start() -> None:
    """Puts :data:`CUBLAS_WORKSPACE_ENV` in the environment unless it is set already: what ``rlstruct train
    --deterministic`` calls first, before anything can make a CUDA context."""
    os.environ.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE_VALUES[0])


def check_cublas_workspace(title: str, *, cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized) -> None:
    """Checks that cuBLAS can be deterministic in this process.

    Args:
        title: the algorithm's name, for the message.
        cuda_initialized: whether this process has made its CUDA context (torch's; a test passes its own).

    Raises:
        ConfigError: :data:`CUBLAS_WORKSPACE_ENV` holds a value with which cuBLAS is not deterministic, or CUDA was
            initialised in this process before it was set (cuBLAS has read it already).
    """
    value = os.environ.get(CUBLAS_WORKSPACE_ENV)
    if value is not None and value not in CUBLAS_WORKSPACE_VALUES:
        raise ConfigError(
            f"{title}: deterministic=True needs {CUBLAS_WORKSPACE_ENV} to be one of {list(CUBLAS_WORKSPACE_VALUES)} "
            f"(cuBLAS's deterministic workspaces), got {value!r}; unset it or export {CUBLAS_WORKSPACE_ENV}=:4096:8"
        )
    if value is None and cuda_initialized():
        raise ConfigError(
            f"{title}: deterministic=True needs {CUBLAS_WORKSPACE_ENV}=:4096:8 in the environment before the process's "
            f"first CUDA call (cuBLAS reads it when the CUDA context is made), got a CUDA context made without it; "
            f"export {CUBLAS_WORKSPACE_ENV}=:4096:8 before starting Python, or launch with rlstruct train "
            "--deterministic"
        )


def _use_deterministic_algorithms(enabled: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms(enabled, warn_only=...)`` without its import of inductor to set inductor's
    flag (about 2 CPU s: a worker of a deterministic run paid it at its start); :func:`_set_torch` sets that flag
    where inductor is loaded, and in the environment it reads when it is."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without it: the public call, import and all
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    else:
        setter(enabled, warn_only=warn_only)


def _set_torch(enabled: bool) -> None:
    _use_deterministic_algorithms(enabled, warn_only=False)
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False
    # Inductor reads its setting from the environment when it is first imported; a run that compiles nothing never
    # imports it (seconds of imports), so it is set on the module only where that is loaded already.
    os.environ[_INDUCTOR_ENV] = "1" if enabled else "0"
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = enabled


def worker_environment() -> dict[str, str]:
    """The variables a worker process must start with to run in deterministic mode, for a process that does not
    inherit this one's environment (a Ray actor: its ``runtime_env``'s ``env_vars``).

    >>> sorted(worker_environment())
    ['CUBLAS_WORKSPACE_CONFIG', 'RLSTRUCT_DETERMINISTIC', 'TORCHINDUCTOR_DETERMINISTIC']
    """
    return {CUBLAS_WORKSPACE_ENV: os.environ.get(CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE_VALUES[0]),
            DETERMINISTIC_ENV: "1", _INDUCTOR_ENV: "1"}


def apply_from_environment() -> bool:
    """Turns deterministic mode on in this process when :data:`DETERMINISTIC_ENV` is ``1`` (a worker started by a
    deterministic run); returns whether it did."""
    if os.environ.get(DETERMINISTIC_ENV) != "1":
        return False
    _set_torch(True)
    return True


@contextlib.contextmanager
def deterministic_mode() -> Iterator[None]:
    """Within the ``with`` body: torch's deterministic algorithms (an error, never a warning, from an operation
    without a deterministic kernel), cuDNN deterministic without benchmark, inductor's deterministic mode, and
    :data:`CUBLAS_WORKSPACE_ENV` and :data:`DETERMINISTIC_ENV` in ``os.environ`` for the processes it starts. Each
    setting is restored on exit. Check :func:`check_cublas_workspace` first."""
    def inductor() -> bool | None:
        module = sys.modules.get("torch._inductor.config")
        return None if module is None else module.deterministic

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, inductor())
    environ = {name: os.environ.get(name) for name in (CUBLAS_WORKSPACE_ENV, DETERMINISTIC_ENV, _INDUCTOR_ENV)}
    set_workspace_at_start()
    os.environ[DETERMINISTIC_ENV] = "1"
    try:
        _set_torch(True)
        yield
    finally:
        _use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        for name, value in environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        module = sys.modules.get("torch._inductor.config")
        if module is not None:  # imported before the run, or by its compiles
            module.deterministic = before[4] if before[4] is not None else environ[_INDUCTOR_ENV] == "1"
