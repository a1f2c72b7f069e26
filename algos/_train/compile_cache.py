"""The compile cache a run's ``torch.compile`` calls share with the next launch, and what the run spent compiling.

Inductor keeps the kernels it generates, and AOTAutograd the forward and backward graphs it traces, in an on-disk
cache (``torch._inductor.config.fx_graph_cache`` and ``torch._functorch.config.enable_autograd_cache``, both on by
default in torch 2.13) under ``TORCHINDUCTOR_CACHE_DIR``; a second launch of the same run finds its graphs there and
skips their code generation and C++/Triton builds. torch's default folder is in the temporary directory, which a
reboot or a container's exit empties: :func:`compile_cache` points it at a folder under the user's cache directory
(:func:`compile_cache_dir`) for the run and its worker processes, unless ``TORCHINDUCTOR_CACHE_DIR`` is set already.
JAX's persistent compilation cache (the programs XLA compiles for a Brax, MJX or gymnax env) goes into that folder's
``jax`` (:func:`jax_compile_cache`), unless ``JAX_COMPILATION_CACHE_DIR`` is set already. :class:`CompileMeter`
reads back what the run spent compiling and how often the caches answered.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError

__all__ = ["COMPILE_CACHE_ENV", "INDUCTOR_CACHE_ENV", "JAX_CACHE_ENV", "CompileMeter", "check_compile_cache",
           "compile_cache", "compile_cache_dir", "jax_compile_cache"]

#: the folder of rlstruct's compile cache (default: ``$XDG_CACHE_HOME/rlstruct/compile``, else
#: ``~/.cache/rlstruct/compile``); ``off`` leaves torch's own default
COMPILE_CACHE_ENV = "RLSTRUCT_COMPILE_CACHE"
#: the folder inductor and AOTAutograd keep their caches in; set by the user, it is left as it is
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: the folder of JAX's persistent compilation cache; set by the user, it is left as it is
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"

#: the counters (torch._dynamo.utils.counters: group, name) a run's summary reports, by the name it gives them
_COUNTERS = {"graphs": ("stats", "unique_graphs"),
             "fx_graph_cache_hits": ("inductor", "fxgraph_cache_hit"),
             "fx_graph_cache_misses": ("inductor", "fxgraph_cache_miss"),
             "autograd_cache_hits": ("aot_autograd", "autograd_cache_hit"),
             "autograd_cache_misses": ("aot_autograd", "autograd_cache_miss")}


def compile_cache_dir() -> Path | None:
    """The folder of the compile cache: :data:`COMPILE_CACHE_ENV`'s, else the user's cache directory's
    ``rlstruct/compile``; ``None`` for ``off``.

    >>> os.environ[COMPILE_CACHE_ENV] = "off"
    >>> compile_cache_dir() is None
    True
    >>> del os.environ[COMPILE_CACHE_ENV]
    """
    value = os.environ.get(COMPILE_CACHE_ENV)
    if value == "off":
        return None
    if value:
        return Path(value).expanduser()
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "rlstruct" / "compile"


def check_compile_cache() -> None:
    """Checks that the compile cache's folder can be made and written, before anything is built, unless the user's
    own folders take both of its uses (``TORCHINDUCTOR_CACHE_DIR`` for torch's caches and
    ``JAX_COMPILATION_CACHE_DIR`` for JAX's, see :func:`jax_compile_cache`).

    Raises:
        ConfigError: it cannot (the message names the folder and :data:`COMPILE_CACHE_ENV`).
    """
    folder = compile_cache_dir()
    if folder is None or (INDUCTOR_CACHE_ENV in os.environ and JAX_CACHE_ENV in os.environ):
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as e:
        writable, why = False, f" ({e.strerror})"
    else:
        why = ""
    if not writable:
        raise ConfigError(
            f"{COMPILE_CACHE_ENV} must name a folder this process can write (the compile cache a second launch "
            f"reuses), got {str(folder)!r}{why}; set {COMPILE_CACHE_ENV} to another folder, or to off for torch's "
            "default"
        )


@contextlib.contextmanager
def compile_cache() -> Iterator[Path | None]:
    """Within the ``with`` body, ``torch.compile``'s on-disk caches live in :func:`compile_cache_dir` (yielded;
    ``None``: torch's choice), for this process and the worker processes it starts; ``TORCHINDUCTOR_CACHE_DIR``
    set already wins. The environment is restored on exit."""
    before = os.environ.get(INDUCTOR_CACHE_ENV)
    folder = compile_cache_dir()
    if before is not None or folder is None:
        yield None if before is None else Path(before)
        return
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(INDUCTOR_CACHE_ENV, None)


def jax_compile_cache() -> Path | None:
    """Points JAX's persistent compilation cache at the compile cache's ``jax`` folder, for this process and the
    processes it starts, and returns the folder JAX keeps its programs in (``None``: none). A setting of the user's
    wins (``JAX_COMPILATION_CACHE_DIR``, or ``jax_compilation_cache_dir`` set in a JAX already imported); so does
    :data:`COMPILE_CACHE_ENV` ``off``. JAX reads the folder at its first compile and keeps it for the process: a run
    calls this before it describes its env, which compiles a JAX env's first programs. JAX keeps a program that took
    at least ``jax_persistent_cache_min_compile_time_secs`` (1 s by default) to compile: a Brax or MJX step, not a
    small gymnax one."""
    if JAX_CACHE_ENV in os.environ:
        return Path(os.environ[JAX_CACHE_ENV])
    jax = sys.modules.get("jax")
    chosen = None if jax is None else jax.config.jax_compilation_cache_dir
    if chosen:
        return Path(chosen)
    folder = compile_cache_dir()
    if folder is None:
        return None
    folder = folder / "jax"
    os.environ[JAX_CACHE_ENV] = str(folder)
    if jax is not None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder


def _now() -> dict[str, float]:
    # Read only where torch's compiler is loaded: a run that compiles nothing never imports it (seconds of imports).
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {"seconds": 0.0, **dict.fromkeys(_COUNTERS, 0)}
    counts = {name: utils.counters[group][key] for name, (group, key) in _COUNTERS.items()}
    return {"seconds": utils.calculate_time_spent().get("total_wall_time", 0.0), **counts}


class CompileMeter:
    """What ``torch.compile`` did in this process since the meter was made: seconds compiling (dynamo's, AOTAutograd's
    and inductor's, forward and backward; a graph from the cache costs its load), the graphs dynamo captured (one
    per function and input shape: a recompilation for a new shape counts one more), and the hits and misses of
    inductor's and AOTAutograd's caches (a hit: a graph not generated again)."""

    def __init__(self) -> None:
        self._start = _now()

    def read(self) -> dict[str, Any]:
        """``{"seconds", "graphs", "fx_graph_cache_hits", "fx_graph_cache_misses", "autograd_cache_hits",
        "autograd_cache_misses"}`` since the meter was made.

        >>> CompileMeter().read()["fx_graph_cache_hits"]
        0
        """
        now = _now()
        out: dict[str, Any] = {k: now[k] - self._start[k] for k in now}
        out["seconds"] = round(out["seconds"], 3)
        return out
