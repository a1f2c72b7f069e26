"""The harness every torch-native simulator shares: :class:`SimEnv`.

A simulator (the classic-control systems of :class:`~rlstruct.envs._torch_env.TorchVecEnv`, the MinAtar games, the
mujoco-torch tasks) keeps its state in tensors and steps every env at once. What is not the system is the same for
all of them and lives here: the settings every one takes (``n_envs``, ``device``, ``seed``, ``env_index``,
``autoreset``), the call order, the step's checks and its two variants, the observations of a reset and of both step
variants, the countdown to a compiled CPU step, ``step_into``, the guard of the graph state and the tail of
``set_state``. A subclass supplies its state and its steps through the hooks below.
"""

from __future__ import annotations

import torch

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._base import CallOrder, StepResult, VecEnv, check_some_running
from rlstruct.envs._jit import jit_after
from rlstruct.envs._rng import env_keys
from rlstruct.errors import EnvStateError
from rlstruct.seeding import check_env_index, check_seed
from rlstruct.structures import DictTensor

__all__ = ["SimEnv"]


class SimEnv(CallOrder, VecEnv):
    """The shared harness of the torch-native simulators (see the module docstring).

    Observations (``B`` rows, keys in this order): ``frame``, ``reward`` ``float32 [B]``, ``done`` ``bool [B]``
    (``terminated | truncated``), ``terminated``, ``truncated``, ``initial_state`` (``bool [B]``), ``last_action``.

    A subclass calls :meth:`_init_harness` in its ``__init__``, before it builds its state, and implements
    :meth:`_checked_action`, :meth:`_step_autoreset` and :meth:`_step_episodic`; one with a compiled CPU step also
    calls :meth:`_start_jit_countdown` and implements :meth:`_move_to_jit`, :meth:`writes_in_place` and
    :meth:`_step_into`.
    """

    # ------------------------------------------------------------------ setup
    def _init_harness(self, n_envs: int, *, device: DeviceLike, seed: int, env_index: int, autoreset: bool
                      ) -> torch.Tensor:
        """Checks and keeps the settings every simulator takes; returns the envs' RNG keys (``int64 [n_envs]``:
        row ``j`` is env ``env_index + j`` of ``seed``).

        Raises:
            SeedError: ``seed`` is not an int in ``[0, 2**31)``. ValueError: ``env_index`` is negative.
            DeviceUnavailableError: ``device`` does not exist on this machine.
        """
        self.seed = check_seed(seed)
        self.device = check_device_exists(device)
        self.autoreset = bool(autoreset)
        self._n = int(n_envs)
        self._ids_all = torch.arange(self._n, dtype=torch.int64, device=self.device)
        self._ids = self._ids_all
        self._started = False
        self._closed = False
        # The compiled CPU step waits for jit_after() env steps (a short run never pays numba's load); _jit_in
        # counts the env steps left (None: no move pending).
        self._jit_in: int | None = None
        return env_keys(self.seed, self._n, self.device, first=check_env_index(env_index))

    def _start_jit_countdown(self) -> None:
        """Moves the steps to the compiled CPU step after :func:`~rlstruct.envs._jit.jit_after` env steps."""
        self._jit_in = jit_after()
        self._count_toward_jit(0)

    def _count_toward_jit(self, rows: int) -> None:
        """Counts ``rows`` env steps toward the move to the compiled step, and makes it when they are due."""
        self._jit_in -= rows
        if self._jit_in <= 0:
            self._jit_in = None
            self._move_to_jit()

    def _move_to_jit(self) -> None:
        """Makes the steps run the compiled CPU step, where it can load (numba installed and not switched off)."""

    # ------------------------------------------------------------------ hooks
    def _checked_action(self, action: DictTensor, n_rows: int, ids: torch.Tensor | None
                        ) -> tuple[torch.Tensor, object]:
        """``action["action"]`` checked and copied: ``(tensor [n_rows, ...], host view or None)``; ``ids``: the
        env of each row (``None``: every env in order)."""
        raise NotImplementedError

    def _step_autoreset(self, a: torch.Tensor, a_host: object) -> StepResult:
        """The auto-reset step of every env with the checked actions ``a``."""
        raise NotImplementedError

    def _step_episodic(self, ids: torch.Tensor, a: torch.Tensor, a_host: object) -> StepResult:
        """The episodic step of the running envs ``ids`` with the checked actions ``a`` (one row each)."""
        raise NotImplementedError

    def _step_into(self, a_host: object, nxt: dict, run: dict) -> None:
        """The compiled step of every env, writing both observations into the host arrays ``nxt`` and ``run``."""
        raise NotImplementedError

    def _release(self) -> None:
        """Drops what a closed env no longer needs."""

    # ------------------------------------------------------------------ contract
    def n_envs(self) -> int:
        """The number of environments."""
        return self._n

    def close(self) -> None:
        """Ends the env: every later ``reset``, ``step`` or ``get_state`` raises :class:`EnvStateError`; idempotent."""
        self._closed = True
        self._started = False
        self._release()

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs (see :meth:`VecEnv.step <rlstruct.envs.VecEnv.step>`) with ``action["action"]``
        (``[B]`` integers in ``[0, n_actions)`` for a discrete action space, finite floating ``[B, *shape]``
        otherwise), on :attr:`device`. Episodic: ``observation_running`` holds the rows of ``observation_next``
        that did not finish.

        Raises:
            ActionRangeError: an action out of range, or a NaN or infinite one (on the CPU; on an accelerator the
                check is recorded for :meth:`deferred_action_check`).
        """
        self._check_steppable("step")
        ids = self._ids
        n_rows = ids.shape[0]
        check_some_running(n_rows, self._n)
        a, a_host = self._checked_action(action, n_rows, None if self.autoreset else ids)
        if self._jit_in is not None:
            self._count_toward_jit(n_rows)
        if self.autoreset:
            return self._step_autoreset(a, a_host)
        return self._step_episodic(ids, a, a_host)

    def writes_in_place(self) -> bool:
        """True for an auto-reset env on its compiled CPU step: :meth:`step_into` then has it write both
        observations straight into the destinations."""
        return False

    def step_into(self, action: DictTensor, observation_next: DictTensor, observation_running: DictTensor) -> None:
        """:meth:`step`, writing both observations into the given tensors (see
        :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`): with the compiled CPU step, the step writes
        them; otherwise :meth:`step` runs (and counts toward the compiled step) and its observations are copied."""
        if not self.writes_in_place():
            return super().step_into(action, observation_next, observation_running)
        self._check_steppable("step_into")
        _, a_host = self._checked_action(action, self._n, None)
        nxt = self._destinations(observation_next, "observation_next")
        self._step_into(a_host, nxt, self._destinations(observation_running, "observation_running"))

    # ------------------------------------------------------------------ observations
    def _reset_observation(self, frame: torch.Tensor, last_action: torch.Tensor) -> tuple[DictTensor, torch.Tensor]:
        """Every env restarted: the reset's observation of the first frames ``frame`` and the ids."""
        self._ids = self._ids_all
        self._started = True
        n, dev = self._n, self.device
        flags = torch.zeros((4, n), dtype=torch.bool, device=dev)
        obs = DictTensor._trusted({
            "frame": frame, "reward": torch.zeros(n, dtype=torch.float32, device=dev), "done": flags[0],
            "terminated": flags[1], "truncated": flags[2], "initial_state": ~flags[3], "last_action": last_action,
        })
        return obs, self._ids_all

    def _autoreset_result(
        self, a: torch.Tensor, frame: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, frame_r: torch.Tensor, reward_r: torch.Tensor, last_action_r: torch.Tensor, *,
        done: torch.Tensor | None = None, initial_r: torch.Tensor | None = None,
        false: tuple[torch.Tensor, ...] | None = None,
    ) -> StepResult:
        """The auto-reset step's two observations of every env: the one reached (``frame``, ``reward``, the flags,
        the actions ``a``) and the one the envs act on next (``frame_r``, ``reward_r``, ``initial_state`` where an
        episode ended, ``last_action_r``). ``done`` defaults to ``terminated | truncated``, ``initial_r`` to a copy
        of ``done``; ``false``: four all-false ``bool [B]`` tensors already made."""
        if done is None:
            done = terminated | truncated
        if initial_r is None:
            initial_r = done.clone()
        if false is None:  # one allocation for the four all-false flags; each row is a separate tensor to the caller
            false = torch.zeros((4,) + done.shape, dtype=torch.bool, device=self.device).unbind(0)
        nxt = DictTensor._trusted({
            "frame": frame, "reward": reward, "done": done, "terminated": terminated, "truncated": truncated,
            "initial_state": false[0], "last_action": a,
        })
        run = DictTensor._trusted({
            "frame": frame_r, "reward": reward_r, "done": false[1], "terminated": false[2], "truncated": false[3],
            "initial_state": initial_r, "last_action": last_action_r,
        })
        return (nxt, self._ids_all), (run, self._ids_all)

    def _episodic_result(self, ids: torch.Tensor, a: torch.Tensor, frame: torch.Tensor, reward: torch.Tensor,
                         terminated: torch.Tensor, truncated: torch.Tensor, *, done: torch.Tensor | None = None
                         ) -> StepResult:
        """The episodic step's observations of the running envs ``ids`` (one row each); the ones that finished drop
        out of the running set. ``done`` defaults to ``terminated | truncated``."""
        if done is None:
            done = terminated | truncated
        nxt = DictTensor._trusted({
            "frame": frame, "reward": reward, "done": done, "terminated": terminated, "truncated": truncated,
            "initial_state": torch.zeros_like(done), "last_action": a,
        })
        # The one host sync of the episodic variant: the size of the running set.
        rows = torch.nonzero(~done).squeeze(1)
        self._ids = ids.index_select(0, rows)
        return (nxt, ids), (nxt.index(rows), self._ids)

    # ------------------------------------------------------------------ state
    def graph_state(self) -> dict[str, torch.Tensor] | None:
        """The env's state tensors by name (no copies) for an auto-reset env, ``None`` for an episodic one, whose
        running set shrinks (see :meth:`VecEnv.graph_state <rlstruct.envs.VecEnv.graph_state>`)."""
        return self._graph_state() if self.autoreset else None

    def _graph_state(self) -> dict[str, torch.Tensor] | None:
        """The auto-reset env's state tensors, or ``None`` where its step cannot be captured."""
        return None

    def set_graph_state(self, state: dict[str, torch.Tensor]) -> None:
        """Makes the env's state the tensors ``state`` (no copy: the next step reads them), with the keys, shapes,
        dtypes and device of :meth:`graph_state`'s.

        Raises:
            EnvStateError: the env is episodic (:meth:`graph_state` is ``None``).
            SpaceError: a key is missing or extra, or a tensor has another shape or dtype.
            DeviceMismatchError: a tensor is on another device.
        """
        if not self.autoreset:
            raise EnvStateError(
                f"set_graph_state needs an auto-reset env (graph_state() is not None), {type(self).__name__} has "
                "autoreset=False; build it with autoreset=True"
            )
        self._set_graph_state(state)

    def _set_graph_state(self, state: dict[str, torch.Tensor]) -> None:
        """The auto-reset env's state made ``state``'s tensors; here: no capturable step, :class:`EnvStateError`."""
        VecEnv.set_graph_state(self, state)

    def _running(self) -> torch.Tensor:
        """``bool [n_envs]``: which envs run (``get_state``'s ``running``)."""
        return torch.zeros(self._n, dtype=torch.bool, device=self.device).index_fill_(0, self._ids, True)

    def _resume(self, running: torch.Tensor) -> None:
        """After a state was set: the envs ``running`` (``bool [n_envs]``) run, and the env can step."""
        self._ids = self._ids_all if bool(running.all()) else torch.nonzero(running).squeeze(1)
        self._started = True
