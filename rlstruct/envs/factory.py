"""make_env: one call from an env id to a ready VecEnv, for any backend (usable as a batcher's ``create_env``)."""

from __future__ import annotations

import operator
from typing import Any

import gymnasium as gym
import torch

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._base import VecEnv
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.gym import GymEnv, GymEnvInf, _autoreset_mode
from rlstruct.errors import MissingDependencyError
from rlstruct.seeding import check_seed, env_seeds

__all__ = ["make_env", "TORCH_ENVS", "BACKENDS"]

#: gymnasium id -> class name in :mod:`rlstruct.envs.classic_control` (the torch simulators).
TORCH_ENVS = {
    "CartPole-v1": "CartPole",
    "CartPoleNoVel-v1": "CartPoleNoVel",
    "Acrobot-v1": "Acrobot",
    "MountainCar-v0": "MountainCar",
    "Pendulum-v1": "Pendulum",
}
BACKENDS = ("torch", "gymnasium", "envpool")


def make_env(
    name: str,
    n_envs: int,
    *,
    device: DeviceLike = "cpu",
    seed: int = 0,
    autoreset: bool = False,
    backend: str = "torch",
    max_episode_steps: int | None = None,
) -> VecEnv:
    """Builds ``n_envs`` envs of the gymnasium id ``name`` as one :class:`~rlstruct.envs.VecEnv`.

    Backends:

    * ``"torch"``: the torch simulators of :mod:`rlstruct.envs.classic_control` (``CartPole-v1``,
      ``Acrobot-v1``, ``MountainCar-v0``, ``Pendulum-v1``), stepped as tensors on ``device``.
    * ``"gymnasium"``: :class:`~rlstruct.envs.GymEnv` / :class:`~rlstruct.envs.GymEnvInf` over
      ``gymnasium.make_vec(name, n_envs, vectorization_mode="vector_entry_point")`` when the id has a
      vector entry point that fits (any for episodic envs, ``SAME_STEP`` auto-reset for ``autoreset=True``),
      else over ``[gymnasium.make(name) for _ in range(n_envs)]``; wrapped in
      :class:`~rlstruct.envs.DeviceEnv` when ``device`` is not the CPU.
    * ``"envpool"``: :class:`~rlstruct.envs.GymEnv` over ``envpool.make_gymnasium`` (episodic only:
      envpool resets a finished env on its next step), wrapped in DeviceEnv when ``device`` is not the CPU.

    A module-level function of plain arguments, so it pickles: pass it (or a ``functools.partial`` of it)
    as a batcher's ``create_env``; each worker then calls it with its own ``seed``.

    Args:
        name: a gymnasium id, e.g. ``"CartPole-v1"``.
        n_envs: number of envs (>= 1).
        device: where observations are returned.
        seed: an int in ``[0, 2**31)``; per-env seeds are derived from it (see :func:`~rlstruct.seeding.env_seeds`).
        autoreset: reset finished envs inside ``step`` (``GymEnvInf`` semantics).
        backend: ``"torch"``, ``"gymnasium"`` or ``"envpool"``.
        max_episode_steps: episode length limit (truncation); ``None`` keeps the id's default.

    Returns:
        A VecEnv whose ``device`` is ``device``.

    Raises:
        SeedError: ``seed`` is not an int in ``[0, 2**31)`` (checked before any env is built, for every backend).
        ValueError: an unknown backend, an id the torch backend does not simulate, ``n_envs < 1``, or
            ``autoreset=True`` with envpool.
        MissingDependencyError: ``backend="envpool"`` without envpool installed.

    >>> env = make_env("CartPole-v1", 2, backend="gymnasium", seed=0)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, env.autoreset
    (torch.Size([2, 4]), False)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    n_envs = operator.index(n_envs)
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    seed = check_seed(seed)
    dev = check_device_exists(device)
    if backend == "torch":
        return _torch_env(name, n_envs, dev, seed, autoreset, max_episode_steps)
    if backend == "gymnasium":
        env: VecEnv = _gymnasium_env(name, n_envs, seed, autoreset, max_episode_steps)
    else:
        env = _envpool_env(name, n_envs, seed, autoreset, max_episode_steps)
    if dev.type != "cpu":
        env = DeviceEnv(env, "cpu", dev)
    return env


def _torch_env(name: str, n_envs: int, device: torch.device, seed: int, autoreset: bool, max_episode_steps):
    if name not in TORCH_ENVS:
        raise ValueError(
            f"the torch backend simulates {list(TORCH_ENVS)}, got {name!r}; "
            "pass backend='gymnasium' to run any gymnasium id"
        )
    # Imported here so that the gymnasium backend works without (and before) the torch simulators.
    from rlstruct.envs import classic_control

    cls = getattr(classic_control, TORCH_ENVS[name])
    kwargs: dict[str, Any] = {"device": device, "seed": seed, "autoreset": autoreset}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return cls(n_envs, **kwargs)


def _gymnasium_env(name: str, n_envs: int, seed: int, autoreset: bool, max_episode_steps) -> GymEnv:
    cls = GymEnvInf if autoreset else GymEnv
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    if gym.spec(name).vector_entry_point is not None:
        try:
            vec = gym.make_vec(name, n_envs, vectorization_mode="vector_entry_point", **kwargs)
        except gym.error.Error:
            vec = None
        if vec is not None:
            if not autoreset or _autoreset_mode(vec) == gym.vector.AutoresetMode.SAME_STEP:
                return cls(vec, seed)
            vec.close()
    return cls([gym.make(name, **kwargs) for _ in range(n_envs)], seed)


def _envpool_env(name: str, n_envs: int, seed: int, autoreset: bool, max_episode_steps) -> GymEnv:
    try:
        import envpool
    except ImportError as e:
        raise MissingDependencyError(
            "backend='envpool' needs envpool; install it with `pip install envpool`, "
            "or use backend='gymnasium' or backend='torch'"
        ) from e
    if autoreset:
        raise ValueError(
            "backend='envpool' supports autoreset=False only: envpool resets a finished env on its next step, "
            "so the fresh observation cannot come with the terminal one; use backend='gymnasium' or 'torch' "
            "for auto-reset envs"
        )
    # envpool seeds its envs from one int (a C int), derived by the rule of every other backend.
    kwargs: dict[str, Any] = {"num_envs": n_envs, "seed": env_seeds(seed, 1)[0]}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return GymEnv(_EnvPoolVector(envpool.make_gymnasium(name, **kwargs)), seed)


class _EnvPoolVector:
    """envpool's gymnasium API seen as a NEXT_STEP gymnasium vector env (seeded at construction)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
    # envpool's arrays may be reused buffers: GymEnv copies them.
    copy = False

    def __init__(self, pool: Any):
        self.pool = pool
        self.num_envs = len(pool)
        self.single_action_space = getattr(pool, "single_action_space", pool.action_space)
        self.single_observation_space = getattr(pool, "single_observation_space", pool.observation_space)

    def reset(self, *, seed: Any = None, options: dict | None = None):
        if options:
            raise ValueError("envpool envs take no reset options; pass an empty env_info")
        return self.pool.reset()

    def step(self, action):
        return self.pool.step(action)

    def close(self) -> None:
        self.pool.close()
