"""The vectorized-environment contract shared by every rlstruct environment."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch

from rlstruct.errors import BatchSizeError, DeviceMismatchError, EnvStateError, SpaceError
from rlstruct.structures import DictTensor

if TYPE_CHECKING:
    from rlstruct.envs._actions import ActionSpec, DeferredActionCheck

__all__ = [
    "VecEnv", "StepResult", "check_env_info", "check_no_env_info", "check_some_running", "action_rows",
    "check_sizes",
]

# ((observation_next [B'], ids [B']), (observation_running [B''], ids [B'']))
StepResult = tuple[tuple[DictTensor, torch.Tensor], tuple[DictTensor, torch.Tensor]]


class VecEnv(abc.ABC):
    """``n_envs()`` environments stepped together, exchanging DictTensors.

    At any time a subset of the envs is *running*; every returned DictTensor
    comes with ``ids`` (``int64 [rows]``, on :attr:`device`): row ``i`` is env ``ids[i]``.

    * ``reset(env_info)`` restarts every env and returns ``(observation [n_envs], arange(n_envs))``.
    * ``step(action)`` takes one row per running env, in the order of the last returned ids, and returns
      ``((observation_next [B'], ids [B']), (observation_running [B''], ids [B'']))``: the observation
      each env that acted reached (before any auto-reset), then what the still-running envs act on next.
    * Episodic envs (``autoreset=False``) drop finished envs: ``ids_running = ids[~observation_next["done"]]``,
      in the same order. Auto-reset envs keep every env running; a finished env's row in
      ``observation_running`` is its fresh reset observation.
    * ``step_into(action, observation_next, observation_running)`` (auto-reset envs) is ``step`` writing into
      given tensors; an env whose ``writes_in_place()`` is true does it without intermediate results, and the
      batchers then hand it views of their buffer.

    Every observation DictTensor holds ``reward`` (float32), ``done`` (bool, terminated or truncated),
    ``terminated``, ``truncated``, ``initial_state`` (bool), ``last_action``, and the observation itself
    (``frame``, or one key per entry of a Dict space). A fresh reset observation has
    ``initial_state=True``, ``done=False`` and ``reward=0``.

    Attributes:
        device: where observations and ids live.
        autoreset: whether finished envs are reset inside ``step``.
        action_space: the single-env gymnasium action space.
        observation_space: the single-env gymnasium observation space.
    """

    device: torch.device
    autoreset: bool
    action_space: gym.Space
    observation_space: gym.Space
    #: the check of the actions' values, for the envs that check through one (see :meth:`deferred_action_check`)
    _action_spec: ActionSpec | None = None

    @abc.abstractmethod
    def n_envs(self) -> int:
        """The number of environments."""

    @abc.abstractmethod
    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env, all of them running again.

        Args:
            env_info: ``None``, an empty DictTensor, or ``n_envs`` rows on the CPU: row ``i`` parametrises env
                ``i`` (an env whose reset takes no options refuses rows).

        Returns:
            ``(observation [n_envs], arange(n_envs))``: ``initial_state=True``, ``done``, ``terminated`` and
            ``truncated`` false, ``reward=0``, ``last_action`` zeros.

        Raises:
            EnvStateError: the env is closed.
            TypeError: ``env_info`` is not a DictTensor.
            BatchSizeError: ``env_info`` is neither empty nor ``n_envs`` rows.
            DeviceMismatchError: ``env_info`` is not on the CPU.
            ValueError: rows the env cannot take (no per-env options, or options that must be equal).
        """

    @abc.abstractmethod
    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs with ``action["action"]``.

        Args:
            action: a DictTensor whose ``action`` holds one row per running env, in the order of the last returned
                ids, on :attr:`device`, with the action space's per-row shape (``[B]`` also for a Box of shape
                ``(1,)``) and a dtype of its kind (integer or floating, cast to ``last_action``'s); other keys are
                ignored.

        Returns:
            ``((observation_next [B], ids [B]), (observation_running [B'], ids_running [B']))``: see the class
            docstring. Auto-reset: ``B' = B = n_envs``. Episodic: ``ids_running = ids[~observation_next["done"]]``.

        Raises:
            EnvStateError: ``reset`` was never called, the env is closed, or every episodic env has finished.
            TypeError: ``action`` is not a DictTensor. KeyError: it has no ``action``.
            SpaceError: the action has the wrong per-row shape or dtype kind.
            ActionRangeError: an action value is outside the action space (on an accelerator, raised later: see
                :meth:`deferred_action_check`).
            BatchSizeError: it does not have one row per running env.
            DeviceMismatchError: it is not on :attr:`device`.
        """

    def step_into(self, action: DictTensor, observation_next: DictTensor, observation_running: DictTensor) -> None:
        """An auto-reset step that writes its two observations into the given tensors instead of returning them.

        What a batcher calls, with views of its buffer, when :meth:`writes_in_place` is true: the env then fills
        the buffer directly, without a DictTensor per step and a copy. Here, the generic version: :meth:`step`,
        then one copy per key.

        Args:
            action: as for :meth:`step` (every env is running).
            observation_next: ``n_envs`` rows with the keys, per-row shapes and dtypes of :meth:`step`'s
                observations, on :attr:`device`: receives ``observation_next``.
            observation_running: the same for ``observation_running``.

        Raises:
            EnvStateError: the env does not auto-reset.
            DeviceMismatchError: the destinations are not on the env's device.
            KeyError: a destination lacks a key of the observations.
            SpaceError: an observation of :meth:`step` does not have its destination's per-row shape and dtype.
            BatchSizeError: an observation of :meth:`step` does not have its destination's rows.
            Exception: whatever :meth:`step` raises.
        """
        if not self.autoreset:
            raise EnvStateError(
                f"step_into needs an auto-reset env (every env running), {type(self).__name__} has autoreset=False; "
                "call step() instead"
            )
        (nxt, _), (running, _) = self.step(action)
        for out, obs, what in ((observation_next, nxt, "observation_next"), (observation_running, running,
                                                                             "observation_running")):
            if out.device() != obs.device():
                raise DeviceMismatchError(
                    f"step_into's {what} is on {out.device()}, the env's observations on {obs.device()}; give "
                    "destinations on the env's device"
                )
            keys = list(obs.keys())
            missing = [k for k in keys if k not in out.variables]
            if missing:
                raise KeyError(f"step_into's {what} lacks the observation keys {missing}; give every key of step()'s")
            for k in keys:
                src, dst = obs[k], out[k]
                # copy_ would broadcast a [B, 1] into [B, 2] or cast float64 to float32 without a word: the
                # destinations have the layout of reset's observations, and step must return the same.
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    name = type(self).__name__
                    if src.dim() == 0 or src.shape[0] != dst.shape[0]:
                        raise BatchSizeError(
                            f"{name}.step returned observation key {k!r} with shape {tuple(src.shape)}, but "
                            f"step_into's {what} holds {dst.shape[0]} rows; return one row per env"
                        )
                    raise SpaceError(
                        f"{name}.step returned observation key {k!r} with rows of shape {tuple(src.shape[1:])} and "
                        f"dtype {src.dtype}, but step_into's {what} holds rows of shape {tuple(dst.shape[1:])} and "
                        f"dtype {dst.dtype} (the layout of reset's observations); return the same per-row shapes and "
                        "dtypes from reset and step"
                    )
                dst.copy_(src)

    def writes_in_place(self) -> bool:
        """Whether :meth:`step_into` writes the observations where they go (cheaper than :meth:`step` and a copy),
        so that a batcher should call it; ``False`` here."""
        return False

    def graph_state(self) -> dict[str, torch.Tensor] | None:
        """For CUDA-graph capture of the step loop (``RL_Batcher(..., cuda_graph=True)``): the env's current state
        tensors by name (a fresh dict holding the env's own tensors, no copies), or ``None`` (the default) when the
        step cannot be captured.

        A capturable step runs on one device with fixed shapes (every env always running: auto-reset), never
        synchronizes with the host, reads its state from these tensors only and rebinds the env to new ones (it
        never writes into them). A replay reads the tensors the capture saw, so the batcher copies the state into
        tensors of its own, hands them over with :meth:`set_graph_state` before every replay, and copies the
        state the captured steps reached back into them at the end of the captured loop. Only a CUDA step can be
        captured; an env may return its state on any device (the batcher asks on CUDA only).
        """
        return None

    def set_graph_state(self, state: dict[str, torch.Tensor]) -> None:
        """Makes the env's state the tensors ``state`` (no copy: the next step reads them), with the keys, shapes,
        dtypes and device of :meth:`graph_state`'s.

        Raises:
            EnvStateError: here, always: the env has no capturable step (:meth:`graph_state` is ``None``).
        """
        raise EnvStateError(
            f"set_graph_state needs an env whose step can be captured, {type(self).__name__}.graph_state() is None; "
            "check graph_state() before handing it a state"
        )

    def deferred_action_check(self) -> DeferredActionCheck | None:
        """Where the env's checks of its action values wait to be read, or ``None`` (the default) when every
        ``step`` checks them at once.

        Every env refuses an action outside its action space (a Discrete or MultiDiscrete action out of range, a
        NaN or infinite Box action) with :class:`~rlstruct.errors.ActionRangeError`. On the CPU ``step`` raises it.
        On an accelerator a host read at every step would stall the device, so the env records the check on the
        device and returns a :class:`~rlstruct.envs._actions.DeferredActionCheck`: its ``check()`` reads the record
        (one host sync) and raises for the steps since the last read. The batchers read it at the end of every
        acquisition, where they synchronise anyway; a loop of one's own calls ``check()`` where it reads results
        from the device.

        The envs that check through an :class:`~rlstruct.envs._actions.ActionSpec` keep it as ``_action_spec``;
        its ``deferred`` record is the answer.
        """
        return None if self._action_spec is None else self._action_spec.deferred

    def close(self) -> None:
        """Releases the envs' resources; idempotent."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CallOrder:
    """The checks of an env's call order (``reset`` before ``step``, nothing after ``close``) over the ``_started``
    and ``_closed`` flags the env keeps, with the messages every env shares."""

    _started: bool
    _closed: bool

    def _check_steppable(self, method: str) -> None:
        self._check_open()
        if not self._started:
            raise EnvStateError(f"{type(self).__name__}.{method} was called before reset(); call env.reset() first")

    def _check_open(self) -> None:
        if self._closed:
            raise EnvStateError(f"{type(self).__name__} is closed; build a new one")


def check_env_info(env_info: DictTensor | None, n_envs: int) -> bool:
    """Checks a ``reset``'s ``env_info``: ``None``, an empty DictTensor, or ``n_envs`` rows on the CPU.

    Returns:
        Whether ``env_info`` has rows (``False`` for ``None`` or an empty DictTensor).

    Raises:
        TypeError: ``env_info`` is not a DictTensor. BatchSizeError: it does not have ``n_envs`` rows.
        DeviceMismatchError: it is not on the CPU.
    """
    if env_info is None:
        return False
    if not isinstance(env_info, DictTensor):
        raise TypeError(f"env_info must be a DictTensor or None, got {type(env_info).__name__}")
    if env_info.empty():
        return False
    if env_info.n_elems() != n_envs:
        raise BatchSizeError(
            f"env_info must have n_envs={n_envs} rows (row i parametrises env i), got {env_info.n_elems()}; "
            "build one row per env, or pass an empty DictTensor"
        )
    if env_info.device() != torch.device("cpu"):
        raise DeviceMismatchError(f"env_info must be on cpu, got {env_info.device()}; build env_info on the CPU")
    return True


def action_rows(action: DictTensor, device: torch.device, n_rows: int) -> torch.Tensor:
    """``action["action"]``, checked to be a tensor on ``device`` with one row per running env.

    Raises:
        TypeError: ``action`` is not a DictTensor.
        DeviceMismatchError: the tensor is not on ``device``.
        BatchSizeError: it does not have ``n_rows`` rows.
    """
    if not isinstance(action, DictTensor):
        raise TypeError(
            f"action must be a DictTensor with an 'action' key, got {type(action).__name__}; "
            "wrap it: DictTensor({'action': a})"
        )
    a = action["action"]
    if a.device != device:
        raise DeviceMismatchError(
            f"action['action'] must be on {device}, got {a.device}; "
            f"move it with .to({str(device)!r}) (or wrap the env in a DeviceEnv)"
        )
    if a.dim() == 0 or a.shape[0] != n_rows:
        raise BatchSizeError(
            f"action['action'] must have one row per running env ({n_rows} rows, in the order of the last "
            f"returned ids), got shape {list(a.shape)}"
        )
    return a


def check_sizes(n_envs: int, max_episode_steps: int | None) -> None:
    """Checks a simulator's ``n_envs`` (a positive int) and ``max_episode_steps`` (a positive int or ``None``).

    Raises:
        ValueError: either is out of range, or not an int (a bool is not one).
    """
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive int, got {n_envs!r}; pass e.g. n_envs=1024")
    if max_episode_steps is not None and (
        isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1
    ):
        raise ValueError(
            f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}; pass None for no time limit"
        )


def check_some_running(n_running: int, n_envs: int) -> None:
    """Refuses a step of an episodic env whose envs have all finished.

    Raises:
        EnvStateError: ``n_running`` is 0.
    """
    if n_running == 0:
        raise EnvStateError(
            f"every one of the {n_envs} episodic envs has finished; call env.reset() before stepping again "
            "(or build the env with autoreset=True)"
        )


def check_no_env_info(env_info: DictTensor | None, n_envs: int, kind: str, fix: str) -> None:
    """:func:`check_env_info` for an env whose reset takes no per-env options: rows are refused too.

    Args:
        kind: the env, as the message names it (e.g. ``"a JAX env"``).
        fix: what to do instead, for the message.

    Raises:
        ValueError: ``env_info`` has rows. And whatever :func:`check_env_info` raises.
    """
    if check_env_info(env_info, n_envs):
        raise ValueError(
            f"env_info must be empty for {kind} (its reset takes no options), got the keys {list(env_info.keys())}; "
            f"{fix}"
        )


class HostDestinations:
    """Numpy views of the CPU tensors :meth:`VecEnv.step_into` writes into, checked against the observation specs
    and cached the first time each destination DictTensor is seen (a batcher passes the same views of its buffer
    at every acquisition, so the check and the views cost nothing after the first one).

    Args:
        specs: ``{key: (per-row shape, numpy dtype)}`` of every observation key.
        n_rows: the rows of each destination (every env).
    """

    _MAX_CACHED = 4096  # destinations that change at every call are not all kept

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]], n_rows: int):
        self.specs = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in specs.items()}
        self.n_rows = n_rows
        self._cache: dict[int, tuple[DictTensor, dict[str, np.ndarray]]] = {}

    @classmethod
    def of_frame(
        cls, frame_shape: tuple[int, ...], frame_dtype: np.dtype, action_shape: tuple[int, ...], discrete: bool,
        n_rows: int,
    ) -> HostDestinations:
        """The destinations of an env whose observation is one ``frame``: float32 ``reward``, the bool flags, and
        ``last_action`` int64 (``discrete``) or float32 of ``action_shape``."""
        flag = ((), np.dtype(bool))
        return cls(
            {"frame": (tuple(frame_shape), np.dtype(frame_dtype)), "reward": ((), np.dtype(np.float32)),
             "done": flag, "terminated": flag, "truncated": flag, "initial_state": flag,
             "last_action": (tuple(action_shape), np.dtype(np.int64 if discrete else np.float32))},
            n_rows,
        )  # fmt: skip

    def __call__(self, d: DictTensor, what: str) -> dict[str, np.ndarray]:
        """The arrays of ``d`` (``what`` names it in errors).

        Raises:
            KeyError: a key is missing. DeviceMismatchError: a tensor is not on the CPU.
            SpaceError: a tensor has another shape or dtype than the observations.
        """
        hit = self._cache.get(id(d))
        if hit is not None and hit[0] is d:
            return hit[1]
        arrays = {}
        for k, (shape, dtype) in self.specs.items():
            if not isinstance(d, DictTensor) or k not in d.variables:
                raise KeyError(f"step_into's {what} lacks the key {k!r}; give every key of step()'s observations")
            v = d[k]
            if v.device.type != "cpu":
                raise DeviceMismatchError(f"step_into's {what}[{k!r}] is on {v.device}; give CPU tensors")
            a = v.numpy()
            if a.shape != (self.n_rows,) + shape or a.dtype != dtype:
                raise SpaceError(
                    f"step_into's {what}[{k!r}] must be {dtype} {[self.n_rows, *shape]}, got {a.dtype} "
                    f"{list(a.shape)}; give tensors shaped like step()'s observations"
                )
            arrays[k] = a
        if len(self._cache) >= self._MAX_CACHED:
            self._cache.clear()
        self._cache[id(d)] = (d, arrays)
        return arrays
