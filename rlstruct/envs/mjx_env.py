"""gymnasium's MuJoCo locomotion tasks stepped by MJX (MuJoCo in JAX), as a :class:`~rlstruct.envs.JaxVecEnv`.

The task (observation, reward, termination, reset noise, ``frame_skip``, time limit) is gymnasium's v5 task,
written once in :mod:`rlstruct.envs._locomotion` and shared with the mujoco-torch backend; here it is wrapped
around ``mjx.step`` as the pure single-env ``reset_fn``/``step_fn`` pair that :class:`JaxVecEnv` vmaps and jits.

MJX computes in float32 (JAX's default), MuJoCo's C engine in float64: trajectories agree closely over tens of
steps and then drift apart, as any two float precisions of a chaotic system do.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._imports import import_jax, import_mujoco
from rlstruct.envs._locomotion import check_max_episode_steps, locomotion_task
from rlstruct.envs.jax_env import JaxVecEnv, jax_device
from rlstruct.errors import MissingDependencyError
from rlstruct.seeding import check_seed

__all__ = ["MjxEnv"]


def _import_mjx() -> Any:
    """``mujoco.mjx`` (call :func:`~rlstruct.envs._imports.import_mujoco` first: its error names mujoco)."""
    import_jax()
    try:
        # mujoco's mjx package prints "Failed to import warp: ..." on stdout when its optional MuJoCo Warp
        # back end is not installed; rlstruct does not use it, so the notice is kept off the user's output.
        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco import mjx
    except ImportError as e:
        raise MissingDependencyError(
            "backend='mjx' needs mujoco-mjx; install it with `pip install 'rlstruct[mujoco]'`"
        ) from e
    return mjx


class MjxEnv(JaxVecEnv):
    """``n_envs`` of gymnasium's MuJoCo locomotion tasks (``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``)
    stepped by MJX on the JAX device matching ``device``.

    Each env's state is what ``mj_step`` reads of it, ``(qpos [nq], qvel [nv], qacc_warmstart [nv])`` (the solver's
    warm start; the controls are the action, and the models have no activations, mocap bodies or applied forces),
    and its step counter (int32): a step fills a fresh ``mjx.Data`` with them and the action, runs ``frame_skip``
    ``mjx.step`` (a ``fori_loop``, so the physics compiles once), which computes every other field anew, then
    applies the task's observation, reward and termination; ``truncated`` is the step counter reaching
    ``max_episode_steps``. A reset draws the task's noisy ``qpos``/``qvel`` with a zero warm start, as gymnasium's
    ``reset`` leaves MuJoCo's data. The small state keeps the auto-reset select and :meth:`get_state` cheap. Envs of
    the same task and limit share their compiled functions (``cache_key``); JAX compiles once per env count, for
    auto-reset and episodic envs alike.

    Args:
        name: a gymnasium id of :data:`~rlstruct.envs._locomotion.LOCOMOTION_TASKS`.
        n_envs: the number of envs (>= 1).
        seed: an int in ``[0, 2**31)``.
        device: the torch device (JAX steps on the matching device).
        autoreset: reset finished envs inside ``step``.
        max_episode_steps: the time limit (``None``: the task's, 1000).

    Attributes:
        task: the task.
        max_episode_steps: the time limit.
        mj_model: the ``mujoco.MjModel`` the envs simulate.

    Raises:
        MissingDependencyError: mujoco, mujoco-mjx or jax is not installed.
        ValueError: an unknown id, or a bad ``n_envs``/``max_episode_steps``.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        DeviceUnavailableError: JAX has no device matching ``device``.

    Shapes, for ``B`` rows: ``frame: float32 [B, obs_dim]`` (``17`` for HalfCheetah and Walker2d, ``11`` for
    Hopper); ``last_action: float32 [B, nu]``; the rest as for :class:`JaxVecEnv`.
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
        task = locomotion_task(name, "mjx")
        limit = check_max_episode_steps(max_episode_steps, task.max_episode_steps)
        mujoco = import_mujoco("mjx")
        mjx = _import_mjx()
        jax = import_jax()
        jnp = jax.numpy
        mj_model = mujoco.MjModel.from_xml_path(task.xml_path())
        model = mjx.put_model(mj_model, device=jax_device(check_device_exists(device)))
        data0 = mjx.make_data(model)
        qpos0 = jnp.asarray(mj_model.qpos0, jnp.float32)
        nq, nv, frame_skip = mj_model.nq, mj_model.nv, task.frame_skip
        dt = float(mj_model.opt.timestep) * frame_skip
        normal = task.qvel_noise == "normal"

        def reset_fn(key):
            k_pos, k_vel = jax.random.split(key)
            u_pos = jax.random.uniform(k_pos, (nq,))
            noise_vel = jax.random.normal(k_vel, (nv,)) if normal else jax.random.uniform(k_vel, (nv,))
            qpos, qvel = task.initial_state(jnp, qpos0, u_pos, noise_vel)
            return task.observation(jnp, qpos, qvel), (qpos, qvel, jnp.zeros_like(qvel), jnp.zeros((), jnp.int32))

        def step_fn(key, state, action):
            qpos, qvel, warm, elapsed = state
            data = data0.replace(qpos=qpos, qvel=qvel, qacc_warmstart=warm, ctrl=action)
            data = jax.lax.fori_loop(0, frame_skip, lambda _, d: mjx.step(model, d), data)
            reward, terminated = task.reward_and_terminated(jnp, qpos[0], data.qpos, data.qvel, action, dt)
            elapsed = elapsed + 1
            obs = task.observation(jnp, data.qpos, data.qvel)
            return obs, (data.qpos, data.qvel, data.qacc_warmstart, elapsed), reward, terminated, elapsed >= limit

        self.task, self.max_episode_steps, self.mj_model = task, limit, mj_model
        observation_space, action_space = task.spaces(mj_model)
        super().__init__(
            reset_fn, step_fn, observation_space, action_space, n_envs, seed=seed, device=device, autoreset=autoreset,
            cache_key=("mjx", task.id, limit),
        )

    def _label(self) -> str:
        return self.task.id
