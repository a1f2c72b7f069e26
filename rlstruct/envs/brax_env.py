"""Brax environments (and any env with Brax's ``Env`` interface, e.g. MuJoCo Playground's) as a
:class:`~rlstruct.envs.JaxVecEnv`.

A Brax env is a pair of pure single-env methods over an explicit ``State`` pytree: ``reset(rng) -> State`` and
``step(state, action) -> State``, the state carrying ``obs``, ``reward`` and ``done`` (a float termination flag).
Here they become the ``reset_fn``/``step_fn`` pair that :class:`JaxVecEnv` vmaps and jits, with a step counter
(int32) beside the Brax state for the time limit: Brax leaves time limits to its training wrapper
(``EpisodeWrapper``), so an env built here reports ``truncated`` itself, apart from Brax's ``done``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from rlstruct.devices import DeviceLike
from rlstruct.envs._imports import import_jax
from rlstruct.envs._locomotion import check_max_episode_steps
from rlstruct.envs.jax_env import JaxVecEnv
from rlstruct.errors import MissingDependencyError, SpaceError
from rlstruct.seeding import check_seed

__all__ = ["BraxEnv", "BRAX_EPISODE_LENGTH"]

#: the default time limit: Brax's training default (``brax.envs.training.wrap``'s ``episode_length``).
BRAX_EPISODE_LENGTH = 1000


def _import_brax_envs() -> Any:
    """``brax.envs``, or a :class:`MissingDependencyError` naming the extra that installs brax (and jax)."""
    message = "backend='brax' needs brax and jax; install them with `pip install 'rlstruct[brax]'`"
    try:
        import_jax()
    except MissingDependencyError as e:
        raise MissingDependencyError(message) from e
    try:
        # brax.envs imports mujoco's mjx package, which prints "Failed to import warp: ..." on stdout when its
        # optional MuJoCo Warp back end is not installed; rlstruct does not use it, so the notice is kept off the
        # user's output.
        with contextlib.redirect_stdout(io.StringIO()):
            import brax.envs
    except ImportError as e:
        raise MissingDependencyError(message) from e
    return brax.envs


def _registered_names(envs: Any) -> list[str]:
    """The names ``brax.envs.get_environment`` knows. Brax keeps its registry in a private dict (the one
    ``register_environment`` writes to) and has no public accessor; an empty list if a release renames it."""
    return sorted(getattr(envs, "_envs", {}))


def _observation_picker(obs: Any, observation_key: str | None, what: str):
    """The function that takes the observation array out of a Brax ``State.obs`` (``obs`` is its abstract value),
    checking ``observation_key`` against it."""
    if isinstance(obs, Mapping):
        keys = sorted(obs)
        if observation_key is None:
            raise SpaceError(
                f"observation_key must name one entry of {what}'s dict observation, got None; pass one of {keys} "
                f"(e.g. observation_key={keys[0]!r}; make_env takes it in backend_kwargs)"
            )
        if observation_key not in obs:
            raise SpaceError(
                f"observation_key must name one entry of {what}'s dict observation, got {observation_key!r}; pass "
                f"one of {keys}"
            )
        return lambda o: o[observation_key]
    if observation_key is not None:
        raise SpaceError(
            f"observation_key is for envs with dict observations, got observation_key={observation_key!r} for "
            f"{what}, whose observation is one array; leave observation_key=None"
        )
    return lambda o: o


class BraxEnv(JaxVecEnv):
    """``n_envs`` Brax envs (``brax.envs.get_environment(name, **env_kwargs)``), or copies of any env object with
    Brax's ``Env`` interface (MuJoCo Playground's envs have it), as a :class:`JaxVecEnv` stepped on the JAX device
    matching ``device``.

    The env object needs ``reset(rng) -> State``, ``step(state, action) -> State`` and ``action_size``; its
    ``State`` has ``obs`` (an array, or a dict of arrays of which ``observation_key`` names the one to return),
    ``reward`` and ``done`` (a float: ``terminated = done > 0``). The observation's shape is read from an abstract
    evaluation of ``reset`` (``jax.eval_shape``), not from ``observation_size``, which Brax computes by running a
    reset op by op. Brax's ``step`` draws no randomness, so the per-step key of :class:`JaxVecEnv` goes unused
    (resets use theirs).

    Each env's state is ``(Brax State, elapsed steps: int32)``; ``truncated`` is ``elapsed >= max_episode_steps``
    (``terminated`` and ``truncated`` may both hold, as with gymnasium's ``TimeLimit``). Actions are Brax's
    convention, ``Box(-1, 1, (action_size,), float32)``, passed to ``step`` unclipped, as Brax's training loops do;
    each env rescales them to its actuators. Envs built from the same name, ``env_kwargs``, ``observation_key`` and
    limit share their jitted functions (``cache_key``; JAX compiles once per env count, for auto-reset and episodic
    envs alike); an env object of the user's never shares (its attributes may differ from those of another object of
    its class).

    Args:
        env: a Brax env name (``"inverted_pendulum"``, ``"ant"``, ...; ``brax.envs``'s registry), or an env object
            with Brax's ``Env`` interface.
        n_envs: the number of envs (>= 1).
        seed: an int in ``[0, 2**31)``.
        device: the torch device (JAX steps on the matching device).
        autoreset: reset finished envs inside ``step``.
        max_episode_steps: the time limit (``None``: :data:`BRAX_EPISODE_LENGTH`, 1000, Brax's training default).
        observation_key: for an env whose ``State.obs`` is a dict (MuJoCo Playground's), the entry to return, e.g.
            ``"state"``; ``None`` for an array observation.
        **env_kwargs: passed to ``brax.envs.get_environment`` when ``env`` is a name, e.g. ``backend="positional"``
            (the physics pipeline: ``generalized``, ``positional``, ``spring`` or ``mjx``).

    Attributes:
        brax_env: the Brax env object that is vmapped.
        name: the env's name (the class name for an env object).
        max_episode_steps: the time limit.

    Raises:
        MissingDependencyError: brax (for a name) or jax is not installed.
        ValueError: an unknown name (the message lists Brax's), a bad ``n_envs`` or ``max_episode_steps``.
        SpaceError: a dict observation without ``observation_key``, a key it lacks, or ``observation_key`` for an
            array observation.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        DeviceUnavailableError: JAX has no device matching ``device``.

    Shapes, for ``B`` rows: ``frame: float32 [B, *obs_shape]`` (``[B, obs_dim]`` for Brax's envs: ``4`` for
    ``inverted_pendulum``, ``27`` for ``ant``); ``last_action: float32 [B, action_size]``; the rest as for
    :class:`JaxVecEnv`.

    >>> import torch
    >>> from rlstruct import DictTensor
    >>> env = BraxEnv("fast", 3, seed=0, autoreset=True, max_episode_steps=2)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, env.action_space.shape, ids.tolist()
    (torch.Size([3, 2]), (1,), [0, 1, 2])
    >>> for _ in range(2):
    ...     (obs_next, _), (obs, _) = env.step(DictTensor({"action": torch.ones(3, 1)}))
    >>> obs_next["truncated"].tolist(), obs["initial_state"].tolist()
    ([True, True, True], [True, True, True])
    """

    def __init__(
        self,
        env: Any,
        n_envs: int,
        *,
        seed: int = 0,
        device: DeviceLike = "cpu",
        autoreset: bool = False,
        max_episode_steps: int | None = None,
        observation_key: str | None = None,
        **env_kwargs: Any,
    ):
        check_seed(seed)
        limit = check_max_episode_steps(max_episode_steps, BRAX_EPISODE_LENGTH)
        cache_key = None
        if isinstance(env, str):
            envs = _import_brax_envs()
            known = _registered_names(envs)
            if known and env not in known:
                raise ValueError(f"env must be a Brax env name, got {env!r}; Brax knows {known}")
            cache_key = ("brax", env, limit, observation_key, tuple(sorted(env_kwargs.items())))
            try:
                hash(cache_key)
            except TypeError:
                cache_key = None
            self.name = env
            env = envs.get_environment(env, **env_kwargs)
        else:
            if env_kwargs:
                raise TypeError(
                    f"env_kwargs are passed to brax.envs.get_environment, for an env given by name; got "
                    f"{sorted(env_kwargs)} with an env object ({type(env).__name__}): build the object with them"
                )
            for attribute in ("reset", "step", "action_size"):
                if not hasattr(env, attribute):
                    raise TypeError(
                        f"env must be a Brax env name or an object with Brax's Env interface (reset, step, "
                        f"action_size), got {type(env).__name__} without {attribute!r}"
                    )
            self.name = type(env).__name__
        jax = import_jax()
        jnp = jax.numpy
        what = f"env {self.name!r}"
        abstract = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        pick = _observation_picker(abstract.obs, observation_key, what)
        obs_shape = tuple(int(d) for d in pick(abstract.obs).shape)
        action_size = int(env.action_size)

        def reset_fn(key):
            state = env.reset(key)
            return pick(state.obs), (state, jnp.zeros((), jnp.int32))

        def step_fn(key, carry, action):
            state, elapsed = carry
            state = env.step(state, action)
            elapsed = elapsed + 1
            return pick(state.obs), (state, elapsed), state.reward, state.done > 0, elapsed >= limit

        self.brax_env, self.max_episode_steps = env, limit
        observation_space = spaces.Box(-np.inf, np.inf, obs_shape, np.float32)
        action_space = spaces.Box(-1.0, 1.0, (action_size,), np.float32)
        super().__init__(
            reset_fn, step_fn, observation_space, action_space, n_envs, seed=seed, device=device, autoreset=autoreset,
            cache_key=cache_key,
        )

    def _label(self) -> str:
        return self.name
