"""What the learner knows about an env (:class:`EnvSpec`), read once from the env itself (:func:`describe_env`),
and the batchers' env factory (:func:`create_env`).

The three are public as ``rlstruct.algos.EnvSpec``, ``rlstruct.algos.describe_env`` and
``rlstruct.algos.create_env``. This module imports nothing else of :mod:`rlstruct.algos`, so that the networks, the
replay buffer and the harness's checkpoints can all import :class:`EnvSpec`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct.envs import make_env
from rlstruct.envs.factory import resolve_backend
from rlstruct.errors import SpaceError

__all__ = ["EnvSpec", "describe_env", "create_env", "evaluation_env_kwargs", "saved_evaluation_env_kwargs",
           "TRAINING_ONLY_ENV_KWARGS", "TRAINING_ONLY_IF_GIVEN"]


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an env to build its networks.

    An env has discrete actions (``n_actions`` set, ``action_shape == ()``) or continuous ones (a 1-d Box:
    ``n_actions`` is ``None`` and ``action_low``/``action_high`` hold its bounds); its observation ``frame``
    is flat (``obs_shape == (obs_dim,)``) or an image (3 dimensions, e.g. ``(4, 84, 84)`` uint8).

    Attributes:
        obs_shape: shape of one observation ``frame``.
        obs_dtype: its dtype's name, e.g. ``"float32"`` or ``"uint8"``.
        n_actions: number of discrete actions, or ``None`` for continuous actions.
        max_episode_steps: the episode time limit.
        reward_threshold: gymnasium's "solved" return for the id (475 for CartPole-v1), or None.
        action_shape: shape of one action (``()`` for discrete actions).
        action_low: lower bounds of a continuous action, flat (``None`` for discrete actions).
        action_high: upper bounds of a continuous action, flat (``None`` for discrete actions).
        obs_high: the largest value of a ``uint8`` observation (its space's ``high``: 255 for Atari pixels, 1 for
            0/1 planes), by which the encoders divide; ``None`` for other dtypes.

    >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
    >>> spec.obs_dim, spec.discrete, spec.action_dim, spec.pixels
    (3, False, 1, False)
    """

    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int | None
    max_episode_steps: int
    reward_threshold: float | None = None
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    obs_high: float | None = None

    @property
    def obs_dim(self) -> int:
        """The number of values in one observation ``frame``."""
        return math.prod(self.obs_shape)

    @property
    def discrete(self) -> bool:
        """Whether the actions are discrete."""
        return self.n_actions is not None

    @property
    def action_dim(self) -> int:
        """The number of values in one continuous action (1 for a discrete action)."""
        return math.prod(self.action_shape)

    @property
    def pixels(self) -> bool:
        """Whether the observation is an image (3 dimensions)."""
        return len(self.obs_shape) == 3

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvSpec:
        """The spec of ``dataclasses.asdict(spec)`` (as a checkpoint stores it; lists become tuples)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in fields})

    def require(self, algo: str, env: str, *, discrete: bool | None = None, pixels: bool | None = None,
                fix: str = "another algorithm") -> None:
        """Raises :class:`~rlstruct.errors.SpaceError` when ``algo`` does not support this env's spaces.

        Args:
            algo: the algorithm's name, for the message.
            env: the env's id, for the message.
            discrete: ``True``/``False`` when ``algo`` takes only discrete/continuous actions (``None``: both).
            pixels: ``False`` when ``algo`` takes only flat observations (``None``: both).
            fix: what else the user may pick, for the message.
        """
        if discrete is not None and discrete != self.discrete:
            want, got = ("discrete", "continuous") if discrete else ("continuous", "discrete")
            raise SpaceError(
                f"{algo} takes {want} actions, got env={env!r} with {got} actions (action_shape={self.action_shape}, "
                f"n_actions={self.n_actions}); pick an env with {want} actions or {fix}"
            )
        if pixels is False and self.pixels:
            raise SpaceError(
                f"{algo} takes flat observations, got env={env!r} with image observations of shape {self.obs_shape}; "
                f"pick an env with flat observations or {fix}"
            )


def describe_env(name: str, backend: str, max_episode_steps: int | None,
                 env_kwargs: Mapping[str, Any] | None = None, *, argument: str = "env_kwargs") -> EnvSpec:
    """Builds one CPU env of ``name`` (with the backend's constructor arguments ``env_kwargs``, the setting named
    ``argument`` in errors) to read its spaces and time limit.

    The time limit is ``max_episode_steps`` when given, else the env's own: the torch simulators' and gymnax's
    ``max_episode_steps``, the id's registered ``max_episode_steps``, or, for Atari (the ``ale`` backend and
    ``ALE/`` ids), the emulator's cap on frames per episode in agent steps (ale-py's
    ``max_num_frames_per_episode // frameskip``: 108,000 frames, 27,000 steps for the v5 ids).

    Raises:
        SpaceError: the action space is neither Discrete nor a 1-d Box, or the observation is not a Box
            of 1 (flat) or 3 (image) dimensions.
        ValueError: the env has no time limit and ``max_episode_steps`` is ``None``, or the constructor refuses an
            argument of ``env_kwargs``.
    """
    backend = resolve_backend(name, backend)
    try:
        env = make_env(name, 1, backend=backend, max_episode_steps=max_episode_steps, backend_kwargs=env_kwargs)
    except TypeError as e:
        if not env_kwargs:
            raise
        raise ValueError(f"{argument} must be keyword arguments that the {backend} backend's constructor of {name!r} "
                         f"takes, got {dict(env_kwargs)!r}, which it refuses ({e}); drop or rename the argument "
                         "(see the constructor's documentation)") from e
    try:
        act, obs = env.action_space, env.observation_space
        limit = max_episode_steps
        if limit is None:
            limit = getattr(env, "max_episode_steps", None)
        if limit is None and backend != "torch":
            limit = _registered_time_limit(name)
        if limit is None and (backend == "ale" or name.startswith("ALE/")):
            limit = _ale_time_limit(name, backend, env_kwargs or {})
    finally:
        env.close()
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) not in (1, 3):
        raise SpaceError(
            f"env={name!r} has observation space {obs}; the algorithms here take a Box of 1 (flat) or 3 (image) "
            "dimensions: flatten the observation or pick another env"
        )
    if limit is None:
        raise ValueError(f"max_episode_steps must be set for env={name!r}, which has no time limit of its own, got "
                         "None; pass max_episode_steps (--max-episode-steps)")
    try:
        threshold = gym.spec(_registered_id(name)).reward_threshold
    except gym.error.Error:
        threshold = None
    threshold = None if threshold is None else float(threshold)
    obs_high = float(np.max(obs.high)) if np.dtype(obs.dtype) == np.uint8 else None
    common = {"obs_shape": tuple(int(d) for d in obs.shape), "obs_dtype": np.dtype(obs.dtype).name,
              "obs_high": obs_high, "max_episode_steps": int(limit), "reward_threshold": threshold}
    if isinstance(act, gym.spaces.Discrete):
        if int(act.start) != 0:  # the policies pick actions in [0, n): start + k would never be sent
            raise SpaceError(f"env={name!r} has action space {act}, whose actions start at {int(act.start)}; the "
                             "algorithms here pick actions in [0, n): shift them with a gymnasium ActionWrapper")
        return EnvSpec(n_actions=int(act.n), **common)
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        if not (np.isfinite(act.low).all() and np.isfinite(act.high).all()):
            raise SpaceError(f"env={name!r} has action space {act} with infinite bounds; the algorithms here need "
                             "finite bounds (wrap the env with gymnasium's ClipAction and a bounded space)")
        return EnvSpec(n_actions=None, action_shape=tuple(int(d) for d in act.shape),
                       action_low=tuple(float(x) for x in act.low), action_high=tuple(float(x) for x in act.high),
                       **common)
    raise SpaceError(
        f"env={name!r} has action space {act}; the algorithms here take Discrete or 1-d Box actions: "
        "pick another env"
    )


def _registered_id(name: str) -> str:
    """The id gymnasium's registry holds for ``name``: ``Env-v0`` of ``module:Env-v0`` (whose module ``make_env``
    imported, registering it).

    >>> _registered_id("mylab.envs:Maze-v0"), _registered_id("CartPole-v1")
    ('Maze-v0', 'CartPole-v1')
    """
    return name.partition(":")[2] or name


def _registered_time_limit(name: str) -> int | None:
    try:
        return gym.spec(_registered_id(name)).max_episode_steps
    except gym.error.Error:
        return None


def _ale_time_limit(name: str, backend: str, env_kwargs: Mapping[str, Any]) -> int | None:
    """The agent steps of ALE's cap on emulator frames per episode, as the env of ``name`` was built: ``env_kwargs``
    over the registered id's arguments (gymnasium backend) or the defaults of ale-py's ``AtariVectorEnv`` (ale
    backend)."""
    if backend == "ale":
        from ale_py.vector_env import AtariVectorEnv

        params = inspect.signature(AtariVectorEnv).parameters
        kwargs = {k: params[k].default for k in ("max_num_frames_per_episode", "frameskip")}
    else:
        kwargs = {"frameskip": 1, **gym.spec(name).kwargs}
    kwargs.update(env_kwargs)
    frames, skip = kwargs.get("max_num_frames_per_episode"), kwargs.get("frameskip")
    if not isinstance(frames, int) or frames <= 0 or not isinstance(skip, int) or skip < 1:
        return None  # no cap (0), or a stochastic frameskip (a range): no step count to derive
    return frames // skip


def create_env(
    name: str,
    n_envs: int,
    *,
    seed: int,
    env_index: int = 0,
    device: str = "cpu",
    autoreset: bool = False,
    backend: str = "torch",
    max_episode_steps: int | None = None,
    physics_dtype: str = "float64",
    env_kwargs: Mapping[str, Any] | None = None,
):
    """The batchers' ``create_env``: :func:`rlstruct.envs.make_env` with keyword arguments (pickles);
    ``env_kwargs`` go to the backend's constructor, and ``physics_dtype`` other than float64 to the torch
    simulators."""
    kwargs = dict(env_kwargs or {})
    if physics_dtype != "float64":
        kwargs["physics_dtype"] = getattr(torch, physics_dtype)
    return make_env(
        name, n_envs, device=device, seed=seed, env_index=env_index, autoreset=autoreset, backend=backend,
        max_episode_steps=max_episode_steps, backend_kwargs=kwargs or None,
    )


#: per backend, the env arguments that shape training only, and their values in evaluation envs: an evaluation
#: reports the game's score (ale-py clips rewards to [-1, 1] by default, and episodic_life and life_loss_info end an
#: episode at each lost life)
TRAINING_ONLY_ENV_KWARGS: dict[str, dict[str, Any]] = {
    "ale": {"reward_clipping": False, "episodic_life": False, "life_loss_info": False}}
#: on any backend, the training-only env arguments that an evaluation env takes back to these values where the run
#: gives them: a random start (MinAtarEnv's ``random_start_steps``) would cut the evaluated episodes short
TRAINING_ONLY_IF_GIVEN: dict[str, Any] = {"random_start_steps": 0}


def evaluation_env_kwargs(name: str, backend: str, env_kwargs: Mapping[str, Any] | None,
                          evaluation_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The constructor arguments of a run's evaluation envs: ``env_kwargs`` with the backend's training-only ones
    (:data:`TRAINING_ONLY_ENV_KWARGS`, and those of :data:`TRAINING_ONLY_IF_GIVEN` that ``env_kwargs`` gives) at
    their evaluation values, then ``evaluation_kwargs`` over them.

    >>> evaluation_env_kwargs("ALE/Breakout-v5", "auto", {"episodic_life": True, "noop_max": 10}, None)
    {'episodic_life': False, 'noop_max': 10, 'reward_clipping': False, 'life_loss_info': False}
    >>> evaluation_env_kwargs("ALE/Breakout-v5", "ale", None, {"reward_clipping": True})
    {'reward_clipping': True, 'episodic_life': False, 'life_loss_info': False}
    >>> evaluation_env_kwargs("CartPole-v1", "gymnasium", {"sutton_barto_reward": True}, None)
    {'sutton_barto_reward': True}
    >>> evaluation_env_kwargs("MinAtar/Freeway-v1", "auto", {"random_start_steps": 2500}, None)
    {'random_start_steps': 0}
    """
    env_kwargs = env_kwargs or {}
    only = TRAINING_ONLY_ENV_KWARGS.get(resolve_backend(name, backend), {})
    given = {k: v for k, v in TRAINING_ONLY_IF_GIVEN.items() if k in env_kwargs}
    return {**env_kwargs, **only, **given, **(evaluation_kwargs or {})}


def saved_evaluation_env_kwargs(config: Mapping[str, Any], backend: str | None = None) -> dict[str, Any] | None:
    """The evaluation envs' constructor arguments of a saved run (a checkpoint's ``config``), for its envs rebuilt
    with ``backend`` (``None``: the run's own); ``None`` when ``backend`` is another simulator than the run's, whose
    constructor the run's arguments were not written for (it builds its envs with its own defaults).

    >>> saved_evaluation_env_kwargs({"env": "ALE/Pong-v5", "backend": "auto", "env_kwargs": {"noop_max": 0}})
    {'noop_max': 0, 'reward_clipping': False, 'episodic_life': False, 'life_loss_info': False}
    >>> saved_evaluation_env_kwargs({"env": "ALE/Pong-v5", "backend": "auto"}, "gymnasium") is None
    True
    """
    name, run_backend = config["env"], config.get("backend", "auto")
    if backend is not None and resolve_backend(name, backend) != resolve_backend(name, run_backend):
        return None
    return evaluation_env_kwargs(name, run_backend, config.get("env_kwargs"), config.get("evaluation_env_kwargs"))
