"""gymnasium's v5 MuJoCo locomotion tasks (:mod:`rlstruct.envs._locomotion`) stepped by mujoco-torch (MJX ported to
PyTorch): :class:`MujocoTorchEnv`, a torch VecEnv on any device, whose auto-reset step draws from the torch
simulators' counter-based RNG and selects with ``torch.where``, with no host sync of its own."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch

from rlstruct.devices import DeviceLike
from rlstruct.envs._actions import ActionSpec
from rlstruct.envs._base import StepResult, action_rows, check_no_env_info, check_sizes
from rlstruct.envs._imports import import_mujoco, import_mujoco_torch
from rlstruct.envs._locomotion import check_max_episode_steps, locomotion_task
from rlstruct.envs._rng import draw_table, uniform_draws
from rlstruct.envs._sim_env import SimEnv
from rlstruct.errors import BatchSizeError, SpaceError
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor

__all__ = ["MujocoTorchEnv"]

_STATE_KEYS = ("qpos", "qvel", "qacc_warmstart", "elapsed_steps", "episode", "rng_key", "last_action", "running")


def _rows(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A ``[B]`` mask broadcast over ``x``'s trailing dims."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _select(mask: torch.Tensor, a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Row ``i`` of each tensor of ``a`` where ``mask[i]``, else of ``b``."""
    return tuple(torch.where(_rows(mask, u), u, v) for u, v in zip(a, b))


class MujocoTorchEnv(SimEnv):
    """``n_envs`` of gymnasium's MuJoCo locomotion tasks (``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``)
    stepped by mujoco-torch on ``device``.

    A step sets the controls to the action, runs ``frame_skip`` vmapped ``mujoco_torch.step`` over every env, then
    applies the task's observation, reward and termination; ``truncated`` is the step counter reaching
    ``max_episode_steps``. A reset draws the task's noisy ``qpos``/``qvel`` with a zero warm start, as gymnasium's
    ``reset`` leaves MuJoCo's data. Episodic envs that finished are frozen (stepped with the batch, their new state
    discarded) until :meth:`reset`.

    Args:
        name: a gymnasium id of :data:`~rlstruct.envs._locomotion.LOCOMOTION_TASKS`.
        n_envs: the number of envs (>= 1).
        seed: an int in ``[0, 2**31)``; env ``k`` of ``seed`` replays the same episodes whatever ``n_envs`` and
            device (up to the device's floating-point rounding in the physics).
        device: where the physics, the observations and the ids live.
        autoreset: reset finished envs inside ``step``.
        max_episode_steps: the time limit (``None``: the task's, 1000).

    Attributes:
        task: the task.
        max_episode_steps: the time limit.
        mj_model: the ``mujoco.MjModel`` the envs simulate.

    Raises:
        MissingDependencyError: mujoco or mujoco-torch is not installed.
        ValueError: an unknown id, or a bad ``n_envs``/``max_episode_steps``.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        DeviceUnavailableError: ``device`` does not exist on this machine.

    Shapes, for ``B`` rows: ``frame: float32 [B, obs_dim]`` (``17`` for HalfCheetah and Walker2d, ``11`` for
    Hopper); ``reward: float32 [B]``; ``done, terminated, truncated, initial_state: bool [B]``;
    ``last_action: float32 [B, nu]``; ids ``int64 [B]``.

    >>> env = MujocoTorchEnv("Hopper-v5", 2, seed=0, autoreset=True)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, obs["frame"].dtype, env.action_space.shape
    (torch.Size([2, 11]), torch.float32, (3,))
    """

    def __init__(
        self,
        name: str,
        n_envs: int,
        *,
        seed: int = 0,
        device: DeviceLike = "cpu",
        autoreset: bool = False,
        max_episode_steps: int | None = None,
    ):
        check_seed(seed)
        check_sizes(int(n_envs) if isinstance(n_envs, np.integer) else n_envs, None)
        task = locomotion_task(name, "mujoco_torch")
        self.max_episode_steps = check_max_episode_steps(max_episode_steps, task.max_episode_steps)
        mujoco_torch = import_mujoco_torch()
        mujoco = import_mujoco("mujoco_torch")
        self._key = self._init_harness(n_envs, device=device, seed=seed, env_index=0, autoreset=autoreset)
        dev, n = self.device, self._n
        self.task = task
        self.mj_model = m = mujoco.MjModel.from_xml_path(task.xml_path())
        self._nq, self._nv, self._nu = m.nq, m.nv, m.nu
        self._dt = float(m.opt.timestep) * task.frame_skip
        mx = mujoco_torch.device_put(m).to(dev)
        d = mujoco.MjData(m)
        mujoco.mj_forward(m, d)
        # The template of every step's Data: one step gives every field the shape and dtype a vmapped step returns
        # (the constraint arrays are sized by the first step); each step overwrites qpos, qvel, the warm start and
        # the controls and recomputes every other field from them.
        data0 = mujoco_torch.step(mx, mujoco_torch.device_put(d).to(dev))
        data0.time.zero_()
        self._data0 = data0.expand(n).clone()
        self._vstep = torch.vmap(lambda data: mujoco_torch.step(mx, data))
        self._qpos0 = torch.as_tensor(m.qpos0, dtype=torch.float64, device=dev)
        n_draws = self._nq + (2 if task.qvel_noise == "normal" else 1) * self._nv
        table = draw_table((0.0,) * n_draws, (1.0,) * n_draws)
        self._draws = SimpleNamespace(**{k: v.to(dev) for k, v in table.items()})
        self.observation_space, self.action_space = task.spaces(m)
        self._action_spec = ActionSpec(self.action_space, device=dev)
        self._physical: tuple[torch.Tensor, ...] = ()  # (qpos [n, nq], qvel [n, nv], qacc_warmstart [n, nv])
        self._elapsed = torch.zeros(n, dtype=torch.int64, device=dev)
        self._episode = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self._last_action = torch.zeros((n, self._nu), device=dev)

    # ---------------------------------------------------------------- pure pieces of the step
    def _fresh(self, episode: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Initial states of episode ``episode [n]`` of every env: ``((qpos, qvel, qacc_warmstart), observation
        float32 [n, obs_dim])``, the warm start zero as after ``mj_resetData``."""
        u = uniform_draws(self._key, episode, self._draws).t()  # [n, D] in (0, 1)
        nq, nv = self._nq, self._nv
        u_pos, u_vel = u[:, :nq], u[:, nq:nq + nv]
        if self.task.qvel_noise == "normal":  # Box-Muller
            u_vel = torch.sqrt(-2.0 * torch.log(u_vel)) * torch.cos(2.0 * math.pi * u[:, nq + nv:])
        qpos, qvel = self.task.initial_state(torch, self._qpos0, u_pos, u_vel)
        return (qpos, qvel, torch.zeros_like(qvel)), self.task.observation(torch, qpos, qvel).to(torch.float32)

    def _physics(self, physical: tuple[torch.Tensor, ...], action: torch.Tensor
                 ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
        """One env step of every env: ``((qpos, qvel, qacc_warmstart), observation float32, reward float32,
        terminated bool)``."""
        qpos, qvel, warm = physical
        data = self._data0.copy()
        data.qpos, data.qvel, data.qacc_warmstart = qpos, qvel, warm
        data.ctrl = action.to(torch.float64)
        for _ in range(self.task.frame_skip):
            data = self._vstep(data)
        reward, terminated = self.task.reward_and_terminated(
            torch, qpos[:, 0], data.qpos, data.qvel, action.to(torch.float64), self._dt
        )
        obs = self.task.observation(torch, data.qpos, data.qvel).to(torch.float32)
        return (data.qpos, data.qvel, data.qacc_warmstart), obs, reward.to(torch.float32), terminated

    # ---------------------------------------------------------------- VecEnv
    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.task.id!r}, n_envs={self._n}, autoreset={self.autoreset}, "
                f"device={self.device})")

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env with its next episode (see :meth:`VecEnv.reset <rlstruct.envs.VecEnv.reset>`); the
        tasks take no per-env options."""
        self._check_open()
        check_no_env_info(env_info, self._n, "a MuJoCo task", "pass None")
        n, dev = self._n, self.device
        self._episode = self._episode + 1
        self._physical, frame = self._fresh(self._episode)
        self._elapsed = torch.zeros(n, dtype=torch.int64, device=dev)
        self._last_action = torch.zeros((n, self._nu), device=dev)
        return self._reset_observation(frame, self._last_action.clone())

    def _checked_action(self, action: DictTensor, n_rows: int, ids: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        """``action["action"]`` checked (shape, dtype, finite values), as a fresh float32 ``[n_rows, nu]`` tensor
        (never the caller's), and no host view; ``ids``: the env of each row (``None``: every env in order)."""
        a = action_rows(action, self.device, n_rows)
        if not a.dtype.is_floating_point or tuple(a.shape[1:]) != (self._nu,):
            raise SpaceError(
                f"action['action'] must be a floating tensor of shape [{n_rows}, {self._nu}] for {self.action_space}, "
                f"got {a.dtype} {list(a.shape)}; pass e.g. torch.zeros({n_rows}, {self._nu})"
            )
        a = a.detach().to(torch.float32, copy=True)
        self._action_spec.check_values(a, ids=ids)
        return a, None

    def _step_autoreset(self, a: torch.Tensor, a_host: None) -> StepResult:
        physical, frame, reward, terminated = self._physics(self._physical, a)
        elapsed = self._elapsed + 1
        truncated = elapsed >= self.max_episode_steps
        done = terminated | truncated
        self._episode = self._episode + done
        fresh, frame_fresh = self._fresh(self._episode)
        self._physical = _select(done, fresh, physical)
        self._elapsed = torch.where(done, 0, elapsed)
        self._last_action = torch.where(_rows(done, a), 0.0, a)
        return self._autoreset_result(
            a, frame, reward, terminated, truncated, torch.where(_rows(done, frame), frame_fresh, frame),
            torch.where(done, 0.0, reward), self._last_action, done=done, initial_r=done,
        )

    def _step_episodic(self, ids: torch.Tensor, a: torch.Tensor, a_host: None) -> StepResult:
        n = self._n
        partial = ids.shape[0] < n
        if partial:
            full = torch.zeros((n, self._nu), device=self.device).index_copy_(0, ids, a)
            running = torch.zeros(n, dtype=torch.bool, device=self.device).index_fill_(0, ids, True)
        else:
            full = a
        physical, frame, reward, terminated = self._physics(self._physical, full)
        elapsed = self._elapsed + 1
        if partial:
            physical = _select(running, physical, self._physical)
            elapsed = torch.where(running, elapsed, self._elapsed)
            self._last_action = torch.where(_rows(running, full), full, self._last_action)
        else:
            self._last_action = a
        self._physical, self._elapsed = physical, elapsed
        values = (frame, reward, terminated, elapsed >= self.max_episode_steps)
        if partial:
            values = tuple(v.index_select(0, ids) for v in values)
        return self._episodic_result(ids, a, *values)

    # ---------------------------------------------------------------- state
    def get_state(self) -> DictTensor:
        """Everything needed to continue exactly, as a DictTensor of ``n_envs`` rows (copies): ``qpos`` ``float64
        [n_envs, nq]``, ``qvel`` and ``qacc_warmstart`` ``float64 [n_envs, nv]``, ``elapsed_steps``, ``episode`` and
        ``rng_key`` ``int64 [n_envs]`` (the step counter and the RNG state), ``last_action`` ``float32 [n_envs, nu]``,
        ``running`` ``bool [n_envs]`` (always all true for auto-reset envs).

        Raises:
            EnvStateError: ``reset`` was never called, or the env is closed.
        """
        self._check_steppable("get_state")
        running = self._running()
        qpos, qvel, warm = self._physical
        return DictTensor._trusted({
            "qpos": qpos.clone(), "qvel": qvel.clone(), "qacc_warmstart": warm.clone(),
            "elapsed_steps": self._elapsed.clone(), "episode": self._episode.clone(), "rng_key": self._key.clone(),
            "last_action": self._last_action.clone(), "running": running,
        })

    def set_state(self, state: DictTensor) -> None:
        """Continues from a state of :meth:`get_state` (of this env or another of the same task and size, on any
        device): the env then steps exactly as the one the state was taken from.

        Raises:
            TypeError: ``state`` is not a DictTensor.
            SpaceError: a key is missing or has another per-row shape, or ``running`` is not all true for an
                auto-reset env.
            BatchSizeError: ``state`` does not have ``n_envs`` rows.
            EnvStateError: the env is closed.
        """
        self._check_open()
        if not isinstance(state, DictTensor):
            raise TypeError(f"state must be a DictTensor from get_state(), got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state.variables]
        if missing:
            raise SpaceError(f"state lacks the keys {missing}; pass the DictTensor get_state() returns "
                             f"(keys {list(_STATE_KEYS)})")
        if state.n_elems() != self._n:
            raise BatchSizeError(
                f"state has {state.n_elems()} rows, this env has n_envs={self._n}; pass a state from an env with "
                f"{self._n} envs"
            )
        shapes = {"qpos": (self._nq,), "qvel": (self._nv,), "qacc_warmstart": (self._nv,), "last_action": (self._nu,)}
        for k in _STATE_KEYS:
            if tuple(state[k].shape[1:]) != shapes.get(k, ()):
                raise SpaceError(
                    f"state[{k!r}] must have rows of shape {list(shapes.get(k, ()))}, got {list(state[k].shape)}; "
                    "pass the DictTensor get_state() returns"
                )
        dev = self.device
        running = state["running"].to(dev, torch.bool)
        if self.autoreset and not bool(running.all()):
            raise SpaceError("state['running'] must be all true for an auto-reset env; pass an auto-reset env's state")
        self._physical = tuple(state[k].detach().to(dev, torch.float64, copy=True)
                               for k in ("qpos", "qvel", "qacc_warmstart"))
        self._elapsed = state["elapsed_steps"].to(dev, torch.int64, copy=True)
        self._episode = state["episode"].to(dev, torch.int64, copy=True)
        self._key = state["rng_key"].to(dev, torch.int64, copy=True)
        self._last_action = state["last_action"].detach().to(dev, torch.float32, copy=True)
        self._resume(running)

    def _release(self) -> None:
        self._physical = ()
