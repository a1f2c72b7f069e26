"""make_env: one call from an env id to a ready VecEnv, for any backend (usable as a batcher's ``create_env``)."""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct._sources import import_source_module, is_source, resolve_source
from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._base import VecEnv
from rlstruct.envs._gym_adapters import autoreset_mode, resets_a_subset
from rlstruct.envs._imports import import_ale
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.errors import ConfigError, MissingDependencyError
from rlstruct.seeding import check_env_index, check_seed, env_seeds

__all__ = ["make_env", "resolve_backend", "TORCH_ENVS", "BACKENDS", "ale_game"]

#: gymnasium id -> class name in :mod:`rlstruct.envs.classic_control` (the torch simulators).
TORCH_ENVS = {
    "CartPole-v1": "CartPole",
    "CartPoleNoVel-v1": "CartPoleNoVel",
    "Acrobot-v1": "Acrobot",
    "MountainCar-v0": "MountainCar",
    "Pendulum-v1": "Pendulum",
}
BACKENDS = ("auto", "torch", "gymnasium", "envpool", "ale", "gymnax", "mjx", "mujoco_torch", "brax")


def resolve_backend(name: str, backend: str) -> str:
    """``backend``, with ``"auto"`` resolved for the id ``name``: the torch simulator where rlstruct has one
    (:data:`TORCH_ENVS` and the five ``MinAtar/<Game>-v1`` games), ale-py's native vector env for ``ALE/`` ids, else
    gymnasium.

    >>> [resolve_backend(n, "auto") for n in ("CartPole-v1", "ALE/Pong-v5", "MinAtar/Breakout-v1", "Taxi-v3")]
    ['torch', 'ale', 'torch', 'gymnasium']
    >>> resolve_backend("MinAtar/Breakout-v1", "gymnasium")
    'gymnasium'
    """
    if backend != "auto":
        return backend
    if name in TORCH_ENVS or _minatar_game(name) is not None:
        return "torch"
    return "ale" if name.startswith("ALE/") else "gymnasium"


def _minatar_game(name: str) -> str | None:
    """The game of a ``MinAtar/<Game>-v1`` id that the torch backend simulates, else None."""
    from rlstruct.envs.minatar import GAMES

    found = re.fullmatch(r"MinAtar/(\w+)-v1", name)
    return found.group(1) if found is not None and found.group(1) in GAMES else None


def make_env(
    name: str,
    n_envs: int,
    *,
    device: DeviceLike = "cpu",
    seed: int = 0,
    env_index: int = 0,
    autoreset: bool = False,
    backend: str = "torch",
    max_episode_steps: int | None = None,
    backend_kwargs: Mapping[str, Any] | None = None,
) -> VecEnv:
    """Builds ``n_envs`` envs of the gymnasium id ``name`` as one :class:`~rlstruct.envs.VecEnv`.

    Backends:

    * ``"torch"``: the torch simulators of :mod:`rlstruct.envs.classic_control` (``CartPole-v1``,
      ``Acrobot-v1``, ``MountainCar-v0``, ``Pendulum-v1``) and the MinAtar games of :mod:`rlstruct.envs.minatar`
      (``MinAtar/Breakout-v1``, ...; ``backend_kwargs`` ``sticky_action_prob``, ``ramping``), stepped as tensors
      on ``device``.
    * ``"gymnasium"``: :class:`~rlstruct.envs.GymEnv` / :class:`~rlstruct.envs.GymEnvInf` over
      ``gymnasium.make_vec(name, n_envs, vectorization_mode="vector_entry_point")`` when the id has a
      vector entry point that fits (any for episodic envs, ``SAME_STEP`` auto-reset for ``autoreset=True``),
      else over ``[gymnasium.make(name) for _ in range(n_envs)]``; wrapped in
      :class:`~rlstruct.envs.DeviceEnv` when ``device`` is not the CPU. ``ALE/...`` ids (``ALE/Pong-v5``) are
      registered from ale-py first and built as a list of gymnasium's single-env ``AtariEnv`` (RGB frames, as
      ``gymnasium.make`` gives them; ``backend="ale"`` is the fast, preprocessed way).
    * ``"envpool"``: :class:`~rlstruct.envs.GymEnv` / :class:`~rlstruct.envs.GymEnvInf` over
      ``envpool.make_gymnasium``. envpool resets a finished env on its next step (NEXT_STEP); with
      ``autoreset=True`` the adapter resets the finished envs right after the step (``pool.reset(env_ids)``), so
      that one step returns the terminal and the fresh observations. Wrapped in DeviceEnv off the CPU.
    * ``"ale"``: :class:`~rlstruct.envs.GymEnv` / :class:`~rlstruct.envs.GymEnvInf` over ale-py's
      ``AtariVectorEnv`` (its C++ thread pool steps the envs; Atari preprocessing: 84x84 grayscale, frameskip 4,
      4 stacked frames: ``frame`` is uint8 ``[B, 4, 84, 84]``; rewards clipped to [-1, 1]). ``name`` is a ROM
      (``"pong"``, ``"Pong"``, ``"ALE/Pong-v5"``, ``"ms_pacman"``); ``max_episode_steps`` counts agent steps
      (each ``frameskip`` frames). Auto-reset as for envpool (``reset(options={"reset_mask": done})``); with
      ``autoreset=True`` ``step_into`` copies ale-py's arrays straight into a batcher's buffer. The env seeds
      of :func:`~rlstruct.seeding.env_seeds` go to ale-py one per env. Wrapped in DeviceEnv off the CPU.
      ``backend_kwargs={"life_loss_info": True}`` with ``autoreset=True`` ends an episode at each lost life while
      the game goes on (Baselines' ``EpisodicLifeEnv``: the envs then auto-reset in ale-py's SAME_STEP mode);
      ale-py's ``episodic_life`` ends it too but starts a new game.
    * ``"gymnax"``: :class:`~rlstruct.envs.GymnaxEnv`, any gymnax id (``CartPole-v1``, ``Acrobot-v1``,
      ``Breakout-MinAtar``, ...) stepped by JAX on the device matching ``device`` (``cpu``, ``cuda:k``), handed
      to torch through DLPack (no DeviceEnv: the envs run where the observations are wanted).
    * ``"mjx"``: :class:`~rlstruct.envs.MjxEnv`, gymnasium's MuJoCo locomotion tasks (``HalfCheetah-v5``,
      ``Hopper-v5``, ``Walker2d-v5``) stepped by MJX on the JAX device matching ``device``.
    * ``"mujoco_torch"``: :class:`~rlstruct.envs.MujocoTorchEnv`, the same tasks stepped by mujoco-torch (MJX
      ported to PyTorch, float64) on ``device``.
    * ``"brax"``: :class:`~rlstruct.envs.BraxEnv`, a Brax env name (``inverted_pendulum``, ``ant``,
      ``halfcheetah``, ...: ``brax.envs.get_environment(name, **backend_kwargs)``, e.g.
      ``backend_kwargs={"backend": "positional"}`` for the physics pipeline) stepped by JAX on the device matching
      ``device``; the time limit defaults to Brax's training default, 1000 steps.

    ``name`` may also be a ``"MODULE:CALLABLE"`` factory of your own ``VecEnv`` (a torch simulator, say), whatever
    ``backend``: it is called as ``factory(n_envs, device=, seed=, env_index=, autoreset=, **backend_kwargs)``, with
    ``max_episode_steps=`` too when given, in every process that builds the envs, and must return a
    :class:`~rlstruct.envs.VecEnv` (on another device than ``device``, it is wrapped in
    :class:`~rlstruct.envs.DeviceEnv`). A gymnasium id of the form ``"module:Env-v0"`` (gymnasium's own convention)
    imports ``module``, which registers the id, first.

    A module-level function of plain arguments, so it pickles: pass it (or a ``functools.partial`` of it)
    as a batcher's ``create_env``; each worker then calls it with its own ``seed``, or, given a batcher's one seed,
    with that seed and its first env's global ``env_index``.

    Args:
        name: a gymnasium id, e.g. ``"CartPole-v1"`` or ``"module:Env-v0"``, or a ``"MODULE:CALLABLE"`` factory.
        n_envs: number of envs (>= 1).
        device: where observations are returned.
        seed: an int in ``[0, 2**31)``; per-env seeds are derived from it (see :func:`~rlstruct.seeding.env_seeds`).
        env_index: the global index of the first env: env ``k`` is env ``env_index + k`` of ``seed`` (the torch
            simulators' keys, the gymnasium, ale and envpool envs' seeds), so that envs split over processes
            replay the episodes of the same envs in one process. The JAX and MuJoCo backends seed their envs from
            one key: they take a seed drawn from ``(seed, env_index)`` instead.
        autoreset: reset finished envs inside ``step`` (``GymEnvInf`` semantics).
        backend: one of :data:`BACKENDS`: ``"torch"``, ``"gymnasium"``, ``"envpool"``, ``"ale"``, ``"gymnax"``,
            ``"mjx"``, ``"mujoco_torch"``, ``"brax"``, or ``"auto"`` (see :func:`resolve_backend`).
        max_episode_steps: episode length limit (truncation); ``None`` keeps the id's default.
        backend_kwargs: extra keyword arguments for the backend's constructor: the torch simulator's class,
            ``gymnasium.make``/``make_vec``, ``envpool.make_gymnasium``, ale-py's ``AtariVectorEnv`` (e.g.
            ``num_threads``, ``stack_num``, ``repeat_action_probability``), ``gymnax.make``, the MuJoCo envs'
            constructors, or ``brax.envs.get_environment`` (except ``observation_key``, which
            :class:`~rlstruct.envs.BraxEnv` takes for dict observations).

    Returns:
        A VecEnv whose ``device`` is ``device``.

    Raises:
        SeedError: ``seed`` is not an int in ``[0, 2**31)`` (checked before any env is built, for every backend).
        ValueError: an unknown backend, an id the backend does not know (torch, ale, gymnax, mjx, mujoco_torch,
            brax), ``n_envs < 1``, ``env_index < 0``.
        MissingDependencyError: the backend's package is not installed (envpool; ale-py for ``"ale"`` and
            ``ALE/`` ids: ``pip install 'rlstruct[atari]'``; jax and gymnax for ``"gymnax"``:
            ``pip install 'rlstruct[jax]'``; mujoco, mujoco-mjx, mujoco-torch for ``"mjx"`` and ``"mujoco_torch"``:
            ``pip install 'rlstruct[mujoco]'``; brax and jax for ``"brax"``: ``pip install 'rlstruct[brax]'``), or
            a gymnasium id needs one (gymnasium's ``DependencyNotInstalled``, e.g. Box2D for ``LunarLander-v3``).

    >>> env = make_env("CartPole-v1", 2, backend="gymnasium", seed=0)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, env.autoreset
    (torch.Size([2, 4]), False)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    backend = resolve_backend(name, backend)
    n_envs = operator.index(n_envs)
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    seed = check_seed(seed)
    env_index = check_env_index(env_index)
    dev = check_device_exists(device)
    kwargs = dict(backend_kwargs or {})
    if is_source(name):
        return _factory_env(name, n_envs, dev, seed, env_index, autoreset, max_episode_steps, kwargs)
    if backend == "torch":
        return _torch_env(name, n_envs, dev, seed, autoreset, max_episode_steps, {**kwargs, "env_index": env_index})
    if backend in ("gymnasium", "ale", "envpool"):
        build = {"gymnasium": _gymnasium_env, "ale": _ale_env, "envpool": _envpool_env}[backend]
        env: VecEnv = build(name, n_envs, seed, env_index, autoreset, max_episode_steps, kwargs)
        return env if dev.type == "cpu" else DeviceEnv(env, "cpu", dev)
    if env_index:
        # One key seeds all of these envs: envs split over processes are other envs than in one process.
        seed = env_seeds(seed, 1, env_index)[0]
    if backend == "gymnax":
        from rlstruct.envs.gymnax_env import GymnaxEnv

        return GymnaxEnv(name, n_envs, seed=seed, device=dev, autoreset=autoreset,
                         max_episode_steps=max_episode_steps, **kwargs)
    if backend == "mjx":
        from rlstruct.envs.mjx_env import MjxEnv

        return MjxEnv(name, n_envs, seed=seed, device=dev, autoreset=autoreset, max_episode_steps=max_episode_steps,
                      **kwargs)
    if backend == "mujoco_torch":
        from rlstruct.envs.mujoco_torch_env import MujocoTorchEnv

        return MujocoTorchEnv(name, n_envs, seed=seed, device=dev, autoreset=autoreset,
                              max_episode_steps=max_episode_steps, **kwargs)
    from rlstruct.envs.brax_env import BraxEnv

    return BraxEnv(name, n_envs, seed=seed, device=dev, autoreset=autoreset, max_episode_steps=max_episode_steps,
                   **kwargs)


def _torch_env(name: str, n_envs: int, device: torch.device, seed: int, autoreset: bool, max_episode_steps,
               extra: dict[str, Any]):
    from rlstruct.envs.minatar import GAMES, MinAtarEnv

    game = _minatar_game(name)
    if game is not None:
        if max_episode_steps is not None:
            extra = {**extra, "max_episode_steps": max_episode_steps}
        return MinAtarEnv(game, n_envs, device=device, seed=seed, autoreset=autoreset, **extra)
    if name not in TORCH_ENVS:
        raise ValueError(
            f"the torch backend simulates {list(TORCH_ENVS) + [f'MinAtar/{g}-v1' for g in GAMES]}, got {name!r}; "
            "pass backend='gymnasium' to run any gymnasium id"
        )
    # Imported here so that the gymnasium backend works without (and before) the torch simulators.
    from rlstruct.envs import classic_control

    cls = getattr(classic_control, TORCH_ENVS[name])
    kwargs: dict[str, Any] = {"device": device, "seed": seed, "autoreset": autoreset, **extra}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return cls(n_envs, **kwargs)


def _factory_env(name: str, n_envs: int, device: torch.device, seed: int, env_index: int, autoreset: bool,
                 max_episode_steps: int | None, extra: dict[str, Any]) -> VecEnv:
    factory = resolve_source(name, argument="env")
    kwargs: dict[str, Any] = {"device": device, "seed": seed, "env_index": env_index, "autoreset": autoreset, **extra}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    env = factory(n_envs, **kwargs)
    if not isinstance(env, VecEnv):
        raise ConfigError(f"env={name!r} must return a rlstruct.envs.VecEnv, got {type(env).__module__}."
                          f"{type(env).__qualname__}; subclass VecEnv (or TorchVecEnv for a torch simulator), or wrap "
                          "gymnasium envs in rlstruct.envs.GymEnv")
    return env if torch.device(env.device) == device else DeviceEnv(env, env.device, device)


def _gymnasium_env(name: str, n_envs: int, seed: int, env_index: int, autoreset: bool, max_episode_steps,
                   extra: dict[str, Any]) -> GymEnv:
    cls = GymEnvInf if autoreset else GymEnv
    if ":" in name:  # gymnasium's "module:Env-v0": the module registers the id as it imports
        module, _, name = name.partition(":")
        import_source_module(module, argument="env", value=f"{module}:{name}")
    kwargs = dict(extra) if max_episode_steps is None else {**extra, "max_episode_steps": max_episode_steps}
    ale = name.startswith("ALE/")
    if ale:
        gym.register_envs(import_ale())
    if name not in gym.registry:
        base = name.rsplit("-v", 1)[0]
        others = sorted(k for k in gym.registry if k.rsplit("-v", 1)[0] == base)
        if others:  # another version of the id (Taxi-v3 is Taxi-v4 in gymnasium 1.x)
            raise ValueError(f"env {name!r} is not registered in gymnasium {gym.__version__}, which has "
                             f"{', '.join(others)}; pass one of those")
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
        close += [k for k in gym.registry if k.lower() == name.lower() and k not in close]
        # An id that the user's own package registers is registered only once that package imports: in a fresh
        # process (a command, a worker) nothing imports it unless the id names it, gymnasium's "module:Env-v0".
        own = (f"for an id your package registers, name the module that registers it: "
               f"--env yourpackage.envs:{name}")
        fix = (f"did you mean {', '.join(repr(k) for k in close)}? Or, {own}" if close else
               f"check the spelling, {own}, or pick one of rlstruct's torch simulators {list(TORCH_ENVS)}")
        raise ValueError(f"env must be a registered gymnasium id, got {name!r}; {fix}")
    # ALE ids' vector entry point is ale-py's preprocessed AtariVectorEnv (other frames than gymnasium.make's):
    # backend="ale" builds that one.
    if not ale and gym.spec(name).vector_entry_point is not None:
        try:
            vec = gym.make_vec(name, n_envs, vectorization_mode="vector_entry_point", **kwargs)
        except gym.error.Error:
            vec = None
        if vec is not None:
            if not autoreset or autoreset_mode(vec) == gym.vector.AutoresetMode.SAME_STEP or resets_a_subset(vec):
                return cls(vec, seed, env_index=env_index)
            vec.close()
    try:
        envs = [gym.make(name, **kwargs) for _ in range(n_envs)]
    except gym.error.DependencyNotInstalled as e:
        raise MissingDependencyError(
            f"env {name!r} needs a package that is not installed: {str(e).splitlines()[0]}"
        ) from e
    return cls(envs, seed, env_index=env_index)


def ale_game(name: str) -> str:
    """The ale-py ROM id of an Atari name: ``"ALE/Pong-v5"``, ``"Pong"``, ``"pong"`` -> ``"pong"``;
    ``"ALE/MsPacman-v5"``, ``"MsPacman"`` -> ``"ms_pacman"``.

    >>> ale_game("ALE/SpaceInvaders-v5"), ale_game("pong")
    ('space_invaders', 'pong')
    """
    base = name[len("ALE/"):] if name.startswith("ALE/") else name
    base = re.sub(r"-v\d+$", "", base)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()


def _ale_env(name: str, n_envs: int, seed: int, env_index: int, autoreset: bool, max_episode_steps,
             extra: dict[str, Any]) -> GymEnv:
    ale_py = import_ale()
    from ale_py import roms
    from ale_py.vector_env import AtariVectorEnv

    game = ale_game(name)
    if game not in roms.get_all_rom_ids():
        raise ValueError(
            f"name must be an Atari ROM that ale-py ships, got {name!r} (ROM {game!r}); pass e.g. 'ALE/Pong-v5', "
            f"'Pong' or 'pong' (ale-py {ale_py.__version__} ships {len(roms.get_all_rom_ids())} ROMs: "
            "ale_py.roms.get_all_rom_ids())"
        )
    kwargs = dict(extra)
    frameskip = kwargs.get("frameskip", 4)
    if isinstance(frameskip, bool) or not isinstance(frameskip, int) or frameskip < 1:
        raise ValueError(f"env_kwargs['frameskip'] must be an int >= 1 (emulator frames per agent step), got "
                         f"{frameskip!r}; pass e.g. {{\"frameskip\": 4}}, or leave it out for ale-py's 4")
    if max_episode_steps is not None:
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        # ale-py counts emulator frames; rlstruct counts agent steps of `frameskip` frames each.
        kwargs["max_num_frames_per_episode"] = max_episode_steps * frameskip
    if autoreset and kwargs.get("life_loss_info"):
        # A lost life ends the episode and the game goes on (Baselines' EpisodicLifeEnv): ale-py does that in its
        # own auto-reset (SAME_STEP here), whereas the adapter's reset of a finished env would start a new game.
        kwargs.setdefault("autoreset_mode", "SameStep")
    vec = AtariVectorEnv(game, n_envs, **kwargs)
    try:
        return GymEnvInf(vec, seed, env_index=env_index) if autoreset else GymEnv(vec, seed, env_index=env_index)
    except BaseException:
        vec.close()
        raise


def _envpool_env(name: str, n_envs: int, seed: int, env_index: int, autoreset: bool, max_episode_steps,
                 extra: dict[str, Any]) -> GymEnv:
    try:
        import envpool
    except ImportError as e:
        raise MissingDependencyError(
            "backend='envpool' needs envpool; install it with `pip install envpool`, "
            "or use backend='gymnasium' or backend='torch'"
        ) from e
    # envpool seeds env k with its one int seed + k (a C int): the base drawn by the rule of every other backend, then
    # shifted by the first env's global index.
    kwargs: dict[str, Any] = {**extra, "num_envs": n_envs, "seed": (env_seeds(seed, 1)[0] + env_index) % 2**31}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    vec = _EnvPoolVector(envpool.make_gymnasium(name, **kwargs))
    return GymEnvInf(vec, seed, env_index=env_index) if autoreset else GymEnv(vec, seed, env_index=env_index)


class _EnvPoolVector:
    """envpool's gymnasium API seen as a NEXT_STEP gymnasium vector env (seeded at construction) that resets a
    subset of its envs with ``reset(options={"reset_mask": mask})`` (envpool's ``reset(env_ids)``)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP, "reset_mask": True}
    # envpool's arrays may be reused buffers: GymEnv copies them.
    copy = False

    def __init__(self, pool: Any):
        self.pool = pool
        self.num_envs = len(pool)
        self.single_action_space = getattr(pool, "single_action_space", pool.action_space)
        self.single_observation_space = getattr(pool, "single_observation_space", pool.observation_space)

    def reset(self, *, seed: Any = None, options: dict | None = None):
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError("envpool envs take no reset options; pass an empty env_info")
        if mask is None:
            return self.pool.reset()
        # envpool returns the observations of the envs it reset, in the order of env_ids.
        return self.pool.reset(np.flatnonzero(mask).astype(np.int32))

    def step(self, action):
        return self.pool.step(action)

    def close(self) -> None:
        self.pool.close()
