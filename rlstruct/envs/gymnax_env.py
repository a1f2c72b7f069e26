"""gymnax's envs as rlstruct VecEnvs: :class:`GymnaxEnv`, a :class:`~rlstruct.envs.JaxVecEnv` over a gymnax
``Environment``, whichever of gymnax's two step APIs it has."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlstruct.devices import DeviceLike
from rlstruct.envs._imports import import_jax
from rlstruct.envs.jax_env import JaxVecEnv
from rlstruct.errors import MissingDependencyError, SpaceError
from rlstruct.seeding import check_seed

__all__ = ["GymnaxEnv"]

_NO_LIMIT = 2**31 - 1  # a step limit no episode reaches (gymnax's counters are int32)


def _gymnasium_space(space: Any, what: str) -> gym.Space:
    """A gymnax (or any duck-typed) Box/Discrete space as a gymnasium space; bool Boxes become uint8 ``{0, 1}``."""
    kind = type(space).__name__
    if kind == "Discrete" and what == "action_space":
        return spaces.Discrete(int(space.n))
    if kind == "Box":
        shape = tuple(int(s) for s in space.shape)
        dtype = np.dtype(space.dtype)
        if dtype == np.bool_:
            return spaces.Box(0, 1, shape, np.uint8)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), shape)
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = np.clip(low, info.min, info.max), np.clip(high, info.min, info.max)
        return spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
    allowed = "Discrete or Box" if what == "action_space" else "Box"
    raise SpaceError(
        f"{what} must be a {allowed} space, got {kind} ({space}); wrap the JAX env so that it exposes a {allowed} "
        "space (flatten Dict/Tuple observations into one array)"
    )


class GymnaxEnv(JaxVecEnv):
    """``n_envs`` gymnax envs (``gymnax.make(name)``: ``CartPole-v1``, ``Acrobot-v1``, ``Breakout-MinAtar``, ...)
    as a :class:`JaxVecEnv`.

    ``terminated`` is the natural end of an episode and ``truncated`` gymnax's time limit
    (``state.time >= params.max_steps_in_episode``); both may be set when an episode ends naturally at the limit,
    as with gymnasium's ``TimeLimit``. gymnax >= 1.0 reports them apart (``step_env`` and ``is_truncated``);
    gymnax 0.0.x folds the limit into ``done``, which is split here with the step counter in the env state and
    ``is_terminal`` evaluated without the limit.

    Args:
        env: a gymnax id, or a gymnax ``Environment``.
        n_envs: the number of envs.
        params: the env's params (default: ``env.default_params``, or those ``gymnax.make`` returns).
        seed: an int in ``[0, 2**31)``.
        device: the torch device (JAX steps on the matching device).
        autoreset: reset finished envs inside ``step``.
        max_episode_steps: overrides ``params.max_steps_in_episode``.
        **make_kwargs: passed to ``gymnax.make`` when ``env`` is an id.

    Raises:
        MissingDependencyError: gymnax (or jax) is not installed.
        ValueError: an id gymnax does not know.
        SpaceError: an unsupported observation or action space.

    >>> import torch
    >>> from rlstruct import DictTensor
    >>> env = GymnaxEnv("CartPole-v1", 3, seed=0, autoreset=True)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, obs["frame"].dtype, ids.tolist()
    (torch.Size([3, 4]), torch.float32, [0, 1, 2])
    >>> (obs_next, _), (obs, ids) = env.step(DictTensor({"action": torch.ones(3, dtype=torch.int64)}))
    >>> obs_next["reward"].tolist(), obs_next["last_action"].dtype
    ([1.0, 1.0, 1.0], torch.int64)
    """

    def __init__(
        self,
        env: Any,
        n_envs: int,
        *,
        params: Any = None,
        seed: int = 0,
        device: DeviceLike = "cpu",
        autoreset: bool = False,
        max_episode_steps: int | None = None,
        **make_kwargs: Any,
    ):
        check_seed(seed)
        jax = import_jax()
        try:
            import gymnax
        except ImportError as e:
            raise MissingDependencyError(
                "backend='gymnax' needs gymnax; install it with `pip install 'rlstruct[jax]'`"
            ) from e
        cache_key = None
        if isinstance(env, str) and params is None:
            cache_key = ("gymnax", env, max_episode_steps, tuple(sorted(make_kwargs.items())))
            try:
                hash(cache_key)
            except TypeError:
                cache_key = None
        if isinstance(env, str):
            if env not in gymnax.registered_envs:
                raise ValueError(
                    f"env must be a gymnax id, got {env!r}; gymnax knows {list(gymnax.registered_envs)}"
                )
            env, made_params = gymnax.make(env, **make_kwargs)
            params = made_params if params is None else params
        elif params is None:
            params = env.default_params
        if max_episode_steps is not None:
            if max_episode_steps < 1:
                raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
            params = params.replace(max_steps_in_episode=int(max_episode_steps))
        self.gymnax_env, self.params = env, params
        observation_space = _gymnasium_space(env.observation_space(params), "observation_space")
        action_space = _gymnasium_space(env.action_space(params), "action_space")

        def reset_fn(key):
            return env.reset_env(key, params)

        if hasattr(env, "is_truncated"):
            # gymnax >= 1.0: step_env's flag is the natural termination, the time limit is is_truncated.
            def step_fn(key, state, action):
                obs, state, reward, terminated, _ = env.step_env(key, state, action, params)
                return obs, state, reward, terminated, env.is_truncated(state, params)
        else:
            # gymnax 0.0.x folds the time limit into done: the natural termination is is_terminal without the
            # limit, the truncation the step counter against it (both may hold, as with gymnasium's TimeLimit).
            unlimited = params.replace(max_steps_in_episode=_NO_LIMIT)

            def step_fn(key, state, action):
                obs, state, reward, done, _ = env.step_env(key, state, action, params)
                if not hasattr(state, "time"):
                    return obs, state, reward, done, jax.numpy.zeros_like(done)
                natural = env.is_terminal(state, unlimited)
                return obs, state, reward, done & natural, done & (state.time >= params.max_steps_in_episode)

        super().__init__(
            reset_fn, step_fn, observation_space, action_space, n_envs, seed=seed, device=device, autoreset=autoreset,
            cache_key=cache_key,
        )

    def _label(self) -> str:
        return self.gymnax_env.name
