"""gymnasium's v5 MuJoCo locomotion tasks, written once for every physics engine that steps them.

A task is what gymnasium's ``HalfCheetah-v5``, ``Hopper-v5`` and ``Walker2d-v5`` define around the physics: the
model (the XML gymnasium ships), ``frame_skip``, the observation, the reward terms and their default weights, the
termination rule, the reset noise and the 1000-step limit. The physics itself (MuJoCo's ``mj_step``) is the
engine's: MJX (:mod:`rlstruct.envs.mjx_env`, JAX) or mujoco-torch (:mod:`rlstruct.envs.mujoco_torch_env`, torch).

The task's math is pure functions of arrays against an array namespace ``xp``, which is the module ``jax.numpy``
or ``torch`` itself (the operations used, ``xp.concatenate(..., axis=-1)``, ``xp.clip``, ``xp.where``, Python
operators and ``.all(-1)``/``.sum(-1)``, mean the same in both). Arrays carry any leading batch shape: a single
env's ``qpos [nq]`` under ``jax.vmap``, or ``qpos [B, nq]`` in torch. The engines' shared construction checks
(:func:`check_max_episode_steps`) is here too.

>>> import torch
>>> task = LOCOMOTION_TASKS["Hopper-v5"]
>>> qpos, qvel = torch.zeros(2, 6, dtype=torch.float64), torch.full((2, 6), 20.0, dtype=torch.float64)
>>> qpos[:, 1] = 1.25
>>> task.observation(torch, qpos, qvel).shape, task.observation(torch, qpos, qvel)[0, -1].item()
(torch.Size([2, 11]), 10.0)
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
from gymnasium.spaces import Box

__all__ = [
    "LocomotionTask", "LOCOMOTION_TASKS", "locomotion_task", "gymnasium_asset",
    "check_max_episode_steps",
]


def gymnasium_asset(xml: str) -> str:
    """The path of ``xml`` among the MuJoCo models gymnasium ships (``gymnasium/envs/mujoco/assets``)."""
    import gymnasium

    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", xml)


@dataclasses.dataclass(frozen=True)
class LocomotionTask:
    """One gymnasium v5 locomotion task, with gymnasium's default settings (see its env's docstring).

    Attributes:
        id: the gymnasium id, e.g. ``"Hopper-v5"``.
        xml: the model file among gymnasium's assets.
        frame_skip: physics steps per env step (``dt = timestep * frame_skip``).
        forward_reward_weight: weight of the x velocity of the root (``(x_after - x_before) / dt``).
        ctrl_cost_weight: weight of ``sum(action ** 2)`` (the action as given, before MuJoCo clamps the controls).
        reset_noise_scale: the reset adds ``U(-scale, scale)`` to ``qpos0``, and to the zero velocity either
            ``scale * N(0, 1)`` (``qvel_noise="normal"``) or ``U(-scale, scale)`` (``"uniform"``).
        qvel_noise: ``"normal"`` or ``"uniform"``.
        clip_qvel: the observation clips the velocities to ``[-clip_qvel, clip_qvel]``; ``None``: no clip.
        healthy_reward: reward per step while healthy.
        healthy_z_range: ``(low, high)`` of the root height ``qpos[1]`` (strict bounds), or ``None``.
        healthy_angle_range: ``(low, high)`` of the root angle ``qpos[2]``, or ``None``.
        healthy_state_range: ``(low, high)`` of every entry of ``concatenate(qpos, qvel)[2:]``, or ``None``.
        terminate_when_unhealthy: an unhealthy state terminates the episode.
        max_episode_steps: gymnasium's ``TimeLimit``.
    """

    id: str
    xml: str
    frame_skip: int
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    reset_noise_scale: float = 5e-3
    qvel_noise: str = "uniform"
    clip_qvel: float | None = 10.0
    healthy_reward: float = 1.0
    healthy_z_range: tuple[float, float] | None = None
    healthy_angle_range: tuple[float, float] | None = None
    healthy_state_range: tuple[float, float] | None = None
    terminate_when_unhealthy: bool = True
    max_episode_steps: int = 1000

    def xml_path(self) -> str:
        """The model's path in the installed gymnasium."""
        return gymnasium_asset(self.xml)

    def observation(self, xp: Any, qpos: Any, qvel: Any) -> Any:
        """``concatenate(qpos[..., 1:], clip(qvel))``: ``[..., nq - 1 + nv]`` in the dtype of ``qpos``."""
        if self.clip_qvel is not None:
            qvel = xp.clip(qvel, -self.clip_qvel, self.clip_qvel)
        return xp.concatenate([qpos[..., 1:], qvel], axis=-1)

    def spaces(self, mj_model: Any) -> tuple[Box, Box]:
        """The single-env ``(observation_space, action_space)`` of the task on ``mj_model`` (a ``mujoco.MjModel``):
        the :meth:`observation`'s ``float32 [nq - 1 + nv]``, unbounded, and the actuators' control ranges,
        ``float32 [nu]``."""
        observation_space = Box(-np.inf, np.inf, (mj_model.nq - 1 + mj_model.nv,), np.float32)
        low, high = mj_model.actuator_ctrlrange.T.astype(np.float32)
        return observation_space, Box(low, high, (mj_model.nu,), np.float32)

    def healthy(self, xp: Any, qpos: Any, qvel: Any) -> Any:
        """Whether each state is healthy: bool ``[...]`` (always true for a task without health rules)."""
        ok = qpos[..., 0] == qpos[..., 0]
        if self.healthy_z_range is not None:
            low, high = self.healthy_z_range
            ok = ok & (low < qpos[..., 1]) & (qpos[..., 1] < high)
        if self.healthy_angle_range is not None:
            low, high = self.healthy_angle_range
            ok = ok & (low < qpos[..., 2]) & (qpos[..., 2] < high)
        if self.healthy_state_range is not None:
            low, high = self.healthy_state_range
            state = xp.concatenate([qpos, qvel], axis=-1)[..., 2:]
            ok = ok & ((low < state) & (state < high)).all(-1)
        return ok

    def reward_and_terminated(self, xp: Any, x_before: Any, qpos: Any, qvel: Any, action: Any,
                              dt: float) -> tuple[Any, Any]:
        """gymnasium's reward and termination of a step.

        Args:
            xp: ``jax.numpy`` or ``torch``.
            x_before: the root's x position before the step ``[...]``.
            qpos: positions after the step ``[..., nq]``.
            qvel: velocities after the step ``[..., nv]``.
            action: the action ``[..., nu]`` (in ``qpos``'s dtype).
            dt: the env step's duration (``timestep * frame_skip``).

        Returns:
            ``(reward [...], terminated bool [...])``, the reward in ``qpos``'s dtype.
        """
        velocity = (qpos[..., 0] - x_before) / dt
        reward = self.forward_reward_weight * velocity - self.ctrl_cost_weight * (action * action).sum(-1)
        healthy = self.healthy(xp, qpos, qvel)
        if self.healthy_reward:
            reward = reward + xp.where(healthy, self.healthy_reward, 0.0)
        terminated = ~healthy if self.terminate_when_unhealthy else healthy & ~healthy
        return reward, terminated

    def initial_state(self, xp: Any, qpos0: Any, u_pos: Any, noise_vel: Any) -> tuple[Any, Any]:
        """A reset's ``(qpos, qvel)`` from unit noise drawn by the engine's RNG.

        Args:
            xp: ``jax.numpy`` or ``torch``.
            qpos0: the model's reference positions ``[nq]``.
            u_pos: uniform draws in ``(0, 1)``, ``[..., nq]``.
            noise_vel: ``[..., nv]``: standard normal draws (``qvel_noise="normal"``) or uniform ones in ``(0, 1)``.

        Returns:
            ``(qpos [..., nq], qvel [..., nv])``.
        """
        s = self.reset_noise_scale
        qpos = qpos0 + s * (2.0 * u_pos - 1.0)
        qvel = s * noise_vel if self.qvel_noise == "normal" else s * (2.0 * noise_vel - 1.0)
        return qpos, qvel


LOCOMOTION_TASKS: dict[str, LocomotionTask] = {
    task.id: task
    for task in (
        LocomotionTask(
            "HalfCheetah-v5", "half_cheetah.xml", 5, ctrl_cost_weight=0.1, reset_noise_scale=0.1, qvel_noise="normal",
            clip_qvel=None, healthy_reward=0.0, terminate_when_unhealthy=False,
        ),
        LocomotionTask(
            "Hopper-v5", "hopper.xml", 4, healthy_z_range=(0.7, math.inf), healthy_angle_range=(-0.2, 0.2),
            healthy_state_range=(-100.0, 100.0),
        ),
        LocomotionTask(
            "Walker2d-v5", "walker2d_v5.xml", 4, healthy_z_range=(0.8, 2.0), healthy_angle_range=(-1.0, 1.0),
        ),
    )
}


def locomotion_task(name: str, backend: str) -> LocomotionTask:
    """The task of the gymnasium id ``name``.

    Raises:
        ValueError: ``name`` is not one of :data:`LOCOMOTION_TASKS` (the message names them and ``backend``).

    >>> locomotion_task("HalfCheetah-v5", "mjx").frame_skip
    5
    """
    task = LOCOMOTION_TASKS.get(name)
    if task is None:
        raise ValueError(
            f"name must be a MuJoCo task of backend={backend!r}, got {name!r}; it knows {list(LOCOMOTION_TASKS)} "
            "(pass backend='gymnasium' for gymnasium's other MuJoCo envs)"
        )
    return task


def check_max_episode_steps(max_episode_steps: int | None, default: int) -> int:
    """``max_episode_steps`` checked, or ``default`` for ``None``.

    Raises:
        ValueError: not a positive int.
    """
    if max_episode_steps is None:
        return default
    if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, (int, np.integer)) \
            or max_episode_steps < 1:
        raise ValueError(
            f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}; pass None for the task's "
            f"limit ({default})"
        )
    return int(max_episode_steps)
