"""The optional backends' imports, each with what it needs set first, and a :class:`MissingDependencyError` that
names the extra to install when the package is missing."""

from __future__ import annotations

import os
from types import ModuleType

from rlstruct.errors import MissingDependencyError

__all__ = ["import_jax", "import_ale", "import_mujoco", "import_mujoco_torch"]


def import_jax() -> ModuleType:
    """``jax``, imported with GPU preallocation off unless the user chose otherwise: JAX's GPU backend would
    otherwise take most of the GPU's memory when it starts, and starve torch on the same GPU (set
    ``XLA_PYTHON_CLIENT_PREALLOCATE`` yourself before importing jax if your code imports it first).

    Raises:
        MissingDependencyError: jax is not installed.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.dlpack  # noqa: F401  (a submodule jax does not always import)
    except ImportError as e:
        raise MissingDependencyError(
            "JAX envs need jax; install them with `pip install 'rlstruct[jax]'` (jax and gymnax)"
        ) from e
    return jax


def import_ale() -> ModuleType:
    """``ale_py`` (whose import registers its ROMs).

    Raises:
        MissingDependencyError: ale-py is not installed.
    """
    try:
        import ale_py
    except ImportError as e:
        raise MissingDependencyError(
            "Atari envs need ale-py; install it with `pip install 'rlstruct[atari]'` (ale-py ships the ROMs), "
            "or use another backend"
        ) from e
    return ale_py


def import_mujoco(backend: str) -> ModuleType:
    """``mujoco``, or a :class:`MissingDependencyError` naming the extra that installs it."""
    try:
        import mujoco
    except ImportError as e:
        raise MissingDependencyError(
            f"backend={backend!r} needs mujoco; install it with `pip install 'rlstruct[mujoco]'` (mujoco, mujoco-mjx, "
            "mujoco-torch)"
        ) from e
    return mujoco


def import_mujoco_torch() -> ModuleType:
    """``mujoco_torch``, its solver's loop pointed at :func:`_eager_while_loop`: torch's eager ``while_loop``
    traces its body with dynamo, which fails on vmap's batched tensors, and mujoco-torch calls it under
    ``torch.vmap``.

    Raises:
        MissingDependencyError: mujoco or mujoco-torch is not installed.
    """
    import_mujoco("mujoco_torch")
    try:
        import mujoco_torch
    except ImportError as e:
        raise MissingDependencyError(
            "backend='mujoco_torch' needs mujoco-torch (which imports with mujoco 3.4-3.6 only); install it with "
            "`pip install 'rlstruct[mujoco]'`"
        ) from e
    from mujoco_torch._src import solver

    solver._torch_while_loop = _eager_while_loop
    return mujoco_torch


def _eager_while_loop(cond_fn, body_fn, carried_inputs):
    """``torch._higher_order_ops.while_loop`` without its eager-mode dynamo trace, which fails on vmap's batched
    tensors: the operator itself, so that vmap's batching rule for it runs mujoco-torch's solver loop."""
    import torch.utils._pytree as pytree
    from torch._higher_order_ops.while_loop import while_loop_op

    flat, spec = pytree.tree_flatten(tuple(carried_inputs))

    def flat_cond(*args):
        return cond_fn(*pytree.tree_unflatten(list(args), spec))

    def flat_body(*args):
        return tuple(pytree.tree_leaves(body_fn(*pytree.tree_unflatten(list(args), spec))))

    return pytree.tree_unflatten(list(while_loop_op(flat_cond, flat_body, tuple(flat), ())), spec)
