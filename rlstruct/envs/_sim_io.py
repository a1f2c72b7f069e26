"""A torch simulator's state and actions at its boundary: the DictTensor ``get_state`` hands out, and the checks of
a state given back (``set_state``, ``set_graph_state``) and of an action. ``system`` is the simulator (a
:class:`~rlstruct.envs.TorchVecEnv`), read for its settings only."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlstruct.envs._actions import host_copy
from rlstruct.envs._base import action_rows
from rlstruct.envs._rng import MASK32
from rlstruct.envs._sim_kernels import SimState
from rlstruct.errors import BatchSizeError, DeviceMismatchError, SpaceError
from rlstruct.structures import DictTensor

__all__ = ["STATE_KEYS", "state_dict", "read_state", "check_graph_state", "check_action"]

STATE_KEYS = ("physics", "elapsed_steps", "episode", "rng_key", "last_action", "running")


def state_dict(state: SimState, running_ids: torch.Tensor, n: int) -> DictTensor:
    """``state`` as ``get_state`` returns it: copies, ``physics`` transposed to ``[n, P]``, and ``running`` (bool
    ``[n]``, true at ``running_ids``)."""
    running = torch.zeros(n, dtype=torch.bool, device=state.episode.device)
    running[running_ids] = True
    return DictTensor._trusted(
        {
            "physics": state.physics.t().contiguous(),
            "elapsed_steps": state.elapsed_steps.clone(),
            "episode": state.episode.clone(),
            "rng_key": state.rng_key.clone(),
            "last_action": state.last_action.clone(),
            "running": running,
        }
    )


def read_state(system: Any, state: DictTensor) -> tuple[SimState, torch.Tensor]:
    """A state of ``get_state``, checked and copied onto ``system``'s device and dtypes: ``(state, running)``,
    ``running`` bool ``[n_envs]``.

    Raises:
        TypeError: ``state`` is not a DictTensor.
        SpaceError: a key is missing or has the wrong shape or dtype, a key or an episode is out of range, or an
            auto-reset env is given a state where some env is not running.
        BatchSizeError: ``state`` does not have ``n_envs`` rows.
    """
    n = system.n_envs()
    if not isinstance(state, DictTensor):
        raise TypeError(f"state must be a DictTensor from get_state(), got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise SpaceError(
            f"state lacks keys {missing}; pass the DictTensor returned by get_state() (keys {list(STATE_KEYS)})"
        )
    if state.n_elems() != n:
        raise BatchSizeError(
            f"state has {state.n_elems()} rows, this env has n_envs={n}; "
            f"take the state from an env with {n} envs or slice it with state.slice(0, {n})"
        )
    expected = {
        "physics": ((len(system.physics_names),), "floating"),
        "elapsed_steps": ((), "integer"),
        "episode": ((), "integer"),
        "rng_key": ((), "integer"),
        "last_action": (((), "integer") if system._discrete else (system.action_shape, "floating")),
        "running": ((), "bool"),
    }
    for k, (shape, kind) in expected.items():
        v = state[k]
        if tuple(v.shape[1:]) != shape or _dtype_kind(v.dtype) != kind:
            raise SpaceError(
                f"state[{k!r}] must be {kind} [{n}{''.join(', ' + str(s) for s in shape)}], "
                f"got {v.dtype} {list(v.shape)}; pass the DictTensor returned by get_state()"
            )
    dev = system.device
    running = state["running"].to(dev)
    if system.autoreset and not bool(running.all()):
        raise SpaceError(
            "state['running'] has finished envs but this env auto-resets (every env always runs); "
            "set it on an env built with autoreset=False, or mark every env running"
        )
    key = state["rng_key"].to(dev, torch.int64)
    episode = state["episode"].to(dev, torch.int64)
    if bool(((key < 0) | (key > MASK32)).any()) or bool((episode < 0).any()):
        raise SpaceError(
            "state['rng_key'] must be in [0, 2**32) and state['episode'] >= 0; "
            "pass the DictTensor returned by get_state()"
        )
    last_action_dtype = torch.int64 if system._discrete else torch.float32
    return SimState(
        physics=state["physics"].detach().to(dev, system.physics_dtype).t().contiguous(),
        elapsed_steps=state["elapsed_steps"].to(dev, torch.int64, copy=True),
        episode=episode.clone(),
        rng_key=key.clone(),
        last_action=state["last_action"].detach().to(dev, last_action_dtype, copy=True),
    ), running


def check_graph_state(current: SimState, state: Any) -> None:
    """Checks that ``state`` (``set_graph_state``'s) has the keys, shapes, dtypes and device of ``current``.

    Raises:
        SpaceError: a key is missing or extra, or a tensor has another shape or dtype.
        DeviceMismatchError: a tensor is on another device.
    """
    if not isinstance(state, dict) or set(state) != set(SimState._fields):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise SpaceError(
            f"set_graph_state's state must be a dict with the keys {sorted(SimState._fields)}, got {got}; "
            "pass tensors like those of graph_state()"
        )
    for name, old in zip(SimState._fields, current):
        new = state[name]
        if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype:
            got = f"{new.dtype} {list(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
            raise SpaceError(
                f"set_graph_state's state[{name!r}] must be {old.dtype} {list(old.shape)}, got {got}; pass "
                "tensors like those of graph_state()"
            )
        if new.device != old.device:
            raise DeviceMismatchError(
                f"set_graph_state's state[{name!r}] must be on {old.device}, got {new.device}; pass tensors on "
                "the env's device"
            )


def check_action(system: Any, action: DictTensor, n_rows: int, ids: torch.Tensor | None = None) -> tuple[
        torch.Tensor, np.ndarray | None]:
    """``action["action"]`` checked and copied (so that the step's last_action never aliases the caller's
    tensor): ``(tensor, array)``, the array a numpy view of the tensor on the CPU (what the host kernels take),
    ``None`` elsewhere. Its values are checked by the simulator's action spec (``ids``: the env of each row,
    ``None``: every env in order).

    Raises:
        SpaceError: wrong dtype or per-row shape. ActionRangeError: a value outside the action space (on the CPU;
        recorded for a later read on an accelerator). And whatever :func:`~rlstruct.envs._base.action_rows`
        raises.
    """
    a = action_rows(action, system.device, n_rows)
    if system._discrete:
        if a.dim() != 1 or _dtype_kind(a.dtype) != "integer":
            raise SpaceError(
                f"action['action'] must be an integer tensor of shape [{n_rows}] for {system.action_space}, "
                f"got {a.dtype} {list(a.shape)}; pass e.g. torch.randint(0, {system.n_actions}, ({n_rows},))"
            )
        copied = _copy_action(a, torch.int64, (n_rows,))
    else:
        shape = (n_rows,) + system.action_shape
        if _dtype_kind(a.dtype) != "floating" or (
            tuple(a.shape) != shape and not (a.dim() == 1 and shape[1:] == (1,))
        ):
            raise SpaceError(
                f"action['action'] must be a floating tensor of shape {list(shape)} for {system.action_space}, "
                f"got {a.dtype} {list(a.shape)}; pass e.g. torch.zeros({n_rows}, 1)"
            )
        copied = _copy_action(a, torch.float32, shape)
    system._action_spec.check_values(*copied, ids)
    return copied


def _copy_action(a: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray | None]:
    if a.device.type != "cpu":
        return a.detach().to(dtype, copy=True).view(shape), None
    return host_copy(a, np.int64 if dtype == torch.int64 else np.float32, shape)


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "floating"
    if dtype.is_complex:
        return "complex"
    return "integer"
