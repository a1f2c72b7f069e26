"""Recorded experience as Minari datasets, the format offline RL reads (d3rlpy, TorchRL, Tianshou): :func:`record`
plays whole episodes of any agent through a batcher and writes each one as it ends, :func:`record_run` does it with
trained runs' policies, and :func:`load` reads a dataset back as :class:`~rlstruct.Trajectories`.

Needs the ``datasets`` extra (``pip install 'rlstruct[datasets]'``). Datasets live where Minari keeps them:
``MINARI_DATASETS_PATH``, by default ``~/.minari/datasets``. The docs' Datasets page shows the command,
``rlstruct record``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct import __version__
from rlstruct.algos._env_spec import create_env as _create_env
from rlstruct.algos._env_spec import saved_evaluation_env_kwargs
from rlstruct.algos._recording import (
    DatasetWriter,
    EpisodeCutter,
    EpsilonAgent,
    RandomAgent,
    check_action_space,
    check_dataset_id,
    dataset_folder,
    minari_module,
    step_bytes,
)
from rlstruct.algos._replay_storage import free_bytes
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import DeviceLike
from rlstruct.errors import ConfigError, DiskSpaceError, SpaceError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

__all__ = ["Recording", "load", "record", "record_run"]

_GB = 1 << 30
#: the envs per worker that :func:`record_run` steps at most by default
MAX_DEFAULT_ENVS = 256


@dataclasses.dataclass(frozen=True)
class Recording:
    """What a recording wrote, one entry per episode in the dataset's order (the order the episodes ended).

    Attributes:
        dataset_id: the dataset's id, for ``minari.load_dataset``.
        path: its folder.
        episodes: the episodes written.
        steps: their steps.
        returns: each episode's undiscounted return.
        lengths: each episode's steps.
        envs: the batcher row (env) that played each episode.
        sources: which agent played it: the index of the checkpoint in :func:`record_run`'s ``run`` (0 for
            :func:`record`).
    """

    dataset_id: str
    path: str
    episodes: int
    steps: int
    returns: list[float]
    lengths: list[int]
    envs: list[int]
    sources: list[int]

    @property
    def mean_return(self) -> float:
        """The mean of :attr:`returns`."""
        return float(np.mean(self.returns))


@dataclasses.dataclass(frozen=True)
class _Source:
    """One agent's share of a recording."""

    create_agent: Callable[..., Any] | None
    agent_args: dict[str, Any]
    agent_info: DictTensor | None
    seeds: Sequence[int] | int
    agent_seeds: Sequence[int] | int | None
    episodes: int
    #: the envs per worker, when not ``env_args``'s
    n_envs: int | None = None
    #: one episode per env from an episodic batcher (``rlstruct eval``'s), not an auto-reset one
    episodic: bool = False


def record(dataset_id: str, create_agent: Callable[..., Any] | None, agent_args: dict[str, Any] | None,
           create_env: Callable[..., Any], env_args: dict[str, Any], *, episodes: int, n_processes: int = 0,
           seeds: Sequence[int] | int = 0, agent_seeds: Sequence[int] | int | None = None,
           agent_info: DictTensor | None = None, n_timesteps: int = 256, device: DeviceLike = "cpu",
           epsilon: float = 0.0, env_id: str | None = None, metadata: Mapping[str, Any] | None = None,
           ref_scores: tuple[float, float] | None = None, overwrite: bool = False,
           check_disk: bool = True) -> Recording:
    """Plays ``episodes`` whole episodes of an agent through an auto-reset :class:`~rlstruct.RL_Batcher` and writes
    them as the Minari dataset ``dataset_id``, each one as it ends.

    The batcher's arguments are :class:`~rlstruct.RL_Batcher`'s (``create_env`` must take ``autoreset``, which is
    set). The episodes kept are the first ``episodes`` to start (then by env), whatever their length; with as many
    envs as episodes, each env's first. Each is stored as Minari has it: ``observations [L + 1, ...]`` (the last one
    where it ended), ``actions``, ``rewards``, ``terminations``, ``truncations`` ``[L]``, observations in the env's
    dtype (``uint8`` or ``bool`` frames stay so). The env's gymnasium spec (from ``env_id``) goes with it, so that
    ``dataset.recover_environment()`` works; ``ref_scores`` (default: the package's score table, where it has the
    env) become ``ref_min_score``/``ref_max_score`` for ``minari.get_normalized_score``.

    Args:
        dataset_id: ``NAMESPACE/NAME-vVERSION``, e.g. ``"rlstruct/cartpole-expert-v0"``.
        create_agent: the agent's factory; ``None``: uniform random actions.
        agent_args: its keyword arguments.
        create_env: the envs' factory, e.g. :func:`rlstruct.algos.create_env`.
        env_args: its keyword arguments (``name`` is the default ``env_id``).
        episodes: the episodes to write.
        n_processes: as for :class:`~rlstruct.RL_Batcher`.
        seeds: as for :class:`~rlstruct.RL_Batcher` (one int seed: the same episodes over any number of processes).
        agent_seeds: as for :class:`~rlstruct.RL_Batcher`.
        agent_info: as for :class:`~rlstruct.RL_Batcher`.
        n_timesteps: as for :class:`~rlstruct.RL_Batcher`.
        device: as for :class:`~rlstruct.RL_Batcher`.
        epsilon: the probability that a uniform random action replaces the agent's, at each step.
        env_id: the gymnasium id the dataset names (default ``env_args["name"]``); one gymnasium does not know, or
            whose env has other spaces than the recorded one (the ``ale`` backend's preprocessed frames), is warned
            about once and the dataset recorded without a spec.
        metadata: more keys of the dataset's metadata (e.g. ``algorithm_name``, ``author``, ``description``).
        ref_scores: ``(random, expert)`` returns for normalised scores.
        overwrite: replace a dataset of that id.
        check_disk: refuse to start when the episodes, at the env's time limit, would not fit on the disk.

    Returns:
        The :class:`Recording`.

    Raises:
        MissingDependencyError: without the ``datasets`` extra.
        ValueError: a malformed ``dataset_id``, ``episodes < 1`` or ``epsilon`` outside ``[0, 1]``.
        ConfigError: ``dataset_id`` exists and ``overwrite`` is false.
        DiskSpaceError: the disk has not the room (checked first), or filled up (the partial dataset removed).
        SpaceError: an observation space other than a Box, or random actions of an unbounded space.
    """
    source = _Source(create_agent, dict(agent_args or {}), agent_info, seeds, agent_seeds, episodes)
    return _record(dataset_id, [source], create_env, dict(env_args), n_processes=n_processes,
                   n_timesteps=n_timesteps, device=device, epsilon=epsilon, env_id=env_id,
                   metadata=dict(metadata or {}), ref_scores=ref_scores, overwrite=overwrite, check_disk=check_disk)


def record_run(dataset_id: str, run: str | os.PathLike | Sequence[str | os.PathLike], *, episodes: int,
               policy: str | None = None, epsilon: float = 0.0, seed: int = 12345, n_processes: int = 0,
               n_envs: int | None = None, device: DeviceLike = "cpu", backend: str | None = None,
               overwrite: bool = False, check_disk: bool = True, command: str | None = None,
               trust_code: bool = False) -> Recording:
    """Records ``episodes`` episodes of trained runs' policies (:func:`rlstruct.algos.load`) as the Minari dataset
    ``dataset_id``: one run, or several checkpoints of one env (a D4RL-style mixed set), which share the episodes
    (the first ones get the remainder), checkpoint ``i`` playing with seed ``seed + i``.

    Each policy plays the run's evaluation envs (its ``evaluation_env_kwargs``, its time limit, its backend) with its
    evaluation agent, ``n_envs`` envs per worker, acquisitions of the run's ``evaluation_chunk_steps``, its batcher
    seeded as ``rlstruct eval``'s (:meth:`~rlstruct.algos.Policy.evaluation_seeds`). With at most one episode per
    env (by default, up to :data:`MAX_DEFAULT_ENVS` per worker) it runs eval's episodic batcher, whose agent draws
    for the envs still running only; more episodes than envs run an auto-reset batcher. So, greedy or sampled, with
    ``epsilon`` 0 and one episode per env, the episodes of one run are those ``rlstruct eval RUN --episodes N``
    plays with the same ``--seed``, ``--n-processes``, ``--policy`` and ``--backend``: the same returns and
    lengths. The metadata
    names the algorithm, each checkpoint's path and SHA-256, the seed, the policy, rlstruct's version and
    ``command``.

    Args:
        dataset_id: ``NAMESPACE/NAME-vVERSION``.
        run: a run's log folder or checkpoint, or several.
        episodes: the episodes to write, in all.
        policy: ``"greedy"`` (the policy's mode) or ``"sample"`` (its draws, as in training at its end); ``None``:
            each run's ``evaluation_policy``, as ``rlstruct eval``.
        epsilon: the probability that a uniform random action replaces the policy's, at each step.
        seed: the evaluation seed (``rlstruct eval``'s ``--seed``); each worker seeds its envs and agent from it, so
            the episodes depend on ``n_processes``, as ``rlstruct eval``'s do.
        n_processes: batcher worker processes (0: this process).
        n_envs: envs per worker (``None``: enough for one episode each, at most :data:`MAX_DEFAULT_ENVS`).
        device: where the envs and the policy run.
        backend: the env backend (``None``: the run's).
        overwrite: as for :func:`record`.
        check_disk: as for :func:`record`.
        command: the command line to keep in the metadata.
        trust_code: import the code a run names also when it is neither rlstruct's nor an installed package's
            (:func:`rlstruct.algos.load`'s ``trust_code``).

    Raises:
        CheckpointError: a path that is not a run or a checkpoint.
        UntrustedCodeError: a run names code that is not trusted, and not ``trust_code``.
        ConfigError: checkpoints of different envs, or ``dataset_id`` exists (without ``overwrite``).
        ValueError: ``policy`` neither greedy, sample nor ``None``, fewer ``episodes`` than checkpoints, or as
            :func:`record`.
    """
    from rlstruct.algos import load as load_run

    runs = [run] if isinstance(run, (str, os.PathLike)) else list(run)
    if not runs:
        raise ValueError("run must name a run or a checkpoint, got an empty list; pass e.g. runs/ppo-cartpole")
    if policy not in (None, "greedy", "sample"):
        raise ValueError(f"policy must be 'greedy', 'sample' or None (the run's), got {policy!r}; pass "
                         "policy='greedy'")
    if not isinstance(episodes, int) or episodes < len(runs):
        raise ValueError(f"episodes must be an int >= the checkpoints ({len(runs)}), got {episodes!r}; pass e.g. "
                         f"episodes={max(len(runs), 10)}")
    policies = [load_run(r, device=device, trust_code=trust_code) for r in runs]
    first = policies[0]
    env = first.config["env"]
    for p in policies[1:]:
        if p.config["env"] != env or p.spec != first.spec:
            raise ConfigError(f"run must hold checkpoints of one env, got {first.path} on {env!r} and {p.path} on "
                              f"{p.config['env']!r} (or other spaces); record each env into its own dataset")
    n_workers = max(n_processes, 1)
    share, extra = divmod(episodes, len(runs))
    counts = [share + (i < extra) for i in range(len(runs))]
    limit = first.spec.max_episode_steps
    # rlstruct eval's envs: the run's backend, and its evaluation arguments unless another simulator steps them.
    env_args = {"name": env, "n_envs": n_envs or min(math.ceil(counts[0] / n_workers), MAX_DEFAULT_ENVS),
                "backend": backend or first.backend, "max_episode_steps": limit, "device": str(device),
                "env_kwargs": saved_evaluation_env_kwargs(first.config, backend)}
    sources = []
    policies_played = []
    for i, (p, count) in enumerate(zip(policies, counts)):
        create_agent, agent_args = p.agent_factory()
        played = policy or p.config.get("evaluation_policy", "greedy")
        policies_played.append(played)
        env_seeds, agent_seeds = p.evaluation_seeds((seed + i) % 2**31, n_workers)
        source_envs = n_envs or min(math.ceil(count / n_workers), MAX_DEFAULT_ENVS)
        # One episode per env: eval's episodic batcher, whose agent draws for the running envs only (an auto-reset
        # one draws for every env, so a sampling policy's draws would part from eval's once an episode ends).
        sources.append(_Source(create_agent, agent_args, p.agent_info(1, deterministic=played == "greedy"),
                               env_seeds, agent_seeds, count, source_envs,
                               episodic=count <= source_envs * n_workers))
    checkpoints = [{"path": os.path.abspath(p.path), "sha256": _sha256(p.path), "algo": p.algo, "episodes": count,
                    "policy": played} for p, count, played in zip(policies, counts, policies_played)]
    metadata = {"algorithm_name": "+".join(dict.fromkeys(p.algo for p in policies)),
                "rlstruct": {"checkpoints": checkpoints, "policy": "+".join(dict.fromkeys(policies_played)),
                             "seed": seed, "command": command}}
    n_timesteps = min(limit, int(first.config.get("evaluation_chunk_steps", 256)))
    return _record(dataset_id, sources, _create_env, env_args, n_processes=n_processes, n_timesteps=n_timesteps,
                   device=device, epsilon=epsilon, env_id=env, metadata=metadata, ref_scores=None,
                   overwrite=overwrite, check_disk=check_disk)


def load(dataset_id: str, *, episodes: Sequence[int] | None = None, device: DeviceLike = "cpu") -> Trajectories:
    """A Minari dataset's episodes as :class:`~rlstruct.Trajectories`, one row per episode, with the keys a batcher
    gives: ``observation/frame [B, T, ...]`` (step t), ``observation/initial_state``, ``action/action``,
    ``_observation/frame`` (step t + 1), ``_observation/reward``, ``_observation/done``,
    ``_observation/terminated``, ``_observation/truncated``; ``lengths`` are the episodes' steps (rows past them are
    zeros) and ``info["episode_id"]`` their ids in the dataset.

    Args:
        dataset_id: a dataset Minari finds locally.
        episodes: the ids of the episodes to read (``None``: all of them).
        device: where the tensors go.

    Raises:
        MissingDependencyError: without the ``datasets`` extra.
        FileNotFoundError: no local dataset of that id.
        SpaceError: observations that are not one array per step (a Dict or Tuple space).
    """
    minari = minari_module()
    check_dataset_id(dataset_id)
    if not dataset_folder(dataset_id).exists():
        raise FileNotFoundError(f"dataset_id {dataset_id!r} is not at {dataset_folder(dataset_id)}; record it first "
                                "(rlstruct record), or set MINARI_DATASETS_PATH to the folder that holds it")
    dataset = minari.load_dataset(dataset_id)
    ids = list(range(dataset.total_episodes)) if episodes is None else [int(i) for i in episodes]
    read = list(dataset.iterate_episodes(ids))
    if read and not isinstance(read[0].observations, np.ndarray):
        raise SpaceError(f"load reads datasets whose observations are one array per step, got "
                         f"{type(read[0].observations).__name__} observations in {dataset_id!r}; read it with "
                         "minari.load_dataset")
    B, T = len(read), max((len(e) for e in read), default=0)
    lengths = torch.tensor([len(e) for e in read], dtype=torch.int64)

    def padded(values: list[np.ndarray]) -> torch.Tensor:
        out = np.zeros((B, T, *values[0].shape[1:]), dtype=values[0].dtype)
        for row, v in enumerate(values):
            out[row, :len(v)] = v
        return torch.from_numpy(out)

    if B == 0:
        raise ValueError(f"episodes must select at least one episode of {dataset_id!r}, got {episodes!r}")
    obs = [np.asarray(e.observations) for e in read]
    terminated = padded([np.asarray(e.terminations, dtype=bool) for e in read])
    truncated = padded([np.asarray(e.truncations, dtype=bool) for e in read])
    steps = {
        "observation/frame": padded([o[:-1] for o in obs]),
        "observation/initial_state": torch.arange(T).expand(B, T) == 0,
        "action/action": padded([np.asarray(e.actions) for e in read]),
        "_observation/frame": padded([o[1:] for o in obs]),
        "_observation/reward": padded([np.asarray(e.rewards, dtype=np.float32) for e in read]),
        "_observation/done": terminated | truncated,
        "_observation/terminated": terminated,
        "_observation/truncated": truncated,
    }
    info = DictTensor({"episode_id": torch.tensor([e.id for e in read], dtype=torch.int64)})
    return Trajectories(info, TemporalDictTensor(steps, lengths)).to(device)


def _record(dataset_id: str, sources: list[_Source], create_env: Callable[..., Any], env_args: dict[str, Any], *,
            n_processes: int, n_timesteps: int, device: DeviceLike, epsilon: float, env_id: str | None,
            metadata: dict[str, Any], ref_scores: tuple[float, float] | None, overwrite: bool,
            check_disk: bool) -> Recording:
    minari_module()
    check_dataset_id(dataset_id)
    total = sum(s.episodes for s in sources)
    if any(not isinstance(s.episodes, int) or isinstance(s.episodes, bool) or s.episodes < 1 for s in sources):
        raise ValueError(f"episodes must be an int >= 1, got {[s.episodes for s in sources]}; pass e.g. episodes=10")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon!r}; pass e.g. epsilon=0.1")
    observation_space, action_space, limit = _probe(create_env, env_args)
    if not isinstance(observation_space, gym.spaces.Box):
        raise SpaceError(f"record writes Box observations, got {observation_space}; flatten the observation with a "
                         "gymnasium wrapper")
    if epsilon > 0 or any(s.create_agent is None for s in sources):
        check_action_space(action_space)
    name = env_id if env_id is not None else env_args.get("name")
    if check_disk and limit is not None:
        need = total * (limit + 1) * step_bytes(observation_space, action_space)
        free = free_bytes(dataset_folder(dataset_id))
        if need > free:
            raise DiskSpaceError(f"{total} episodes of up to {limit} steps of {name} may take {need / _GB:.2f} GB, "
                                 f"the disk of {dataset_folder(dataset_id).parent} has {free / _GB:.2f} GB free; free "
                                 "disk space, record fewer episodes, or pass check_disk=False (--no-disk-check) "
                                 "when the episodes end sooner")
    spec = _gym_spec(name, limit, env_args, observation_space, action_space)
    if ref_scores is None and isinstance(name, str):
        from rlstruct.algos.statistics import load_score_table

        ref_scores = load_score_table().get(name)
    writer = DatasetWriter(dataset_id, observation_space, action_space, spec, overwrite=overwrite)
    returns: list[float] = []
    lengths: list[int] = []
    envs: list[int] = []
    origin: list[int] = []
    try:
        for i, source in enumerate(sources):
            create_agent, agent_args = source.create_agent, source.agent_args
            if create_agent is None:
                create_agent, agent_args = RandomAgent, {"action_space": action_space, "device": device}
            if epsilon > 0:
                create_agent, agent_args = EpsilonAgent, {"create_agent": create_agent, "agent_args": agent_args,
                                                          "epsilon": epsilon, "action_space": action_space,
                                                          "device": device}
            source_env_args = {**env_args, "autoreset": not source.episodic}
            if source.n_envs is not None:
                source_env_args["n_envs"] = source.n_envs
            with RL_Batcher(n_timesteps, create_agent, agent_args, create_env, source_env_args, n_processes,
                            source.seeds, agent_info=source.agent_info, agent_seeds=source.agent_seeds,
                            device=device) as batcher:
                cutter = EpisodeCutter(batcher.n_elems(), source.episodes, episodic=source.episodic)
                batcher.reset()
                batcher.execute()
                while True:
                    trajectories, _ = batcher.get()
                    ended = cutter.add(trajectories)
                    if not cutter.finished:  # the workers step the next acquisition while this one is written
                        batcher.execute()
                    writer.write(ended)
                    returns += [float(e["reward"].sum(dtype=np.float64)) for e in ended]
                    lengths += [len(e["reward"]) for e in ended]
                    envs += [e["env"] for e in ended]
                    origin += [i] * len(ended)
                    if cutter.finished:
                        break
        rlstruct_meta = {"version": __version__, "episodes": total, "epsilon": epsilon,
                         **metadata.pop("rlstruct", {})}
        agent = sources[0].create_agent
        meta = {"algorithm_name": "random" if agent is None else getattr(agent, "__qualname__", type(agent).__name__),
                **metadata,
                "rlstruct": rlstruct_meta}
        if ref_scores is not None:
            meta["ref_min_score"], meta["ref_max_score"] = float(ref_scores[0]), float(ref_scores[1])
        writer.finish(meta)
    except BaseException:
        writer.abort()
        raise
    return Recording(dataset_id, str(writer.path), writer.episodes, writer.steps, returns, lengths, envs, origin)


def _probe(create_env: Callable[..., Any], env_args: Mapping[str, Any]) -> tuple[gym.Space, gym.Space, int | None]:
    """One env of ``env_args`` on the CPU: its spaces and time limit."""
    args = dict(env_args)
    if "n_envs" in args:
        args["n_envs"] = 1
    if "device" in args:  # no accelerator work in this process before the workers start
        args["device"] = "cpu"
    env = create_env(**args, seed=0)
    try:
        limit = getattr(env, "max_episode_steps", None) or args.get("max_episode_steps")
        return env.observation_space, env.action_space, None if limit is None else int(limit)
    finally:
        env.close()


def _gym_spec(name: Any, limit: int | None, env_args: Mapping[str, Any], observation_space: gym.Space,
              action_space: gym.Space) -> gym.envs.registration.EnvSpec | None:
    """Gymnasium's spec of ``name`` at the recording's time limit (and, for the gymnasium backend, its env
    arguments), if gymnasium knows the id, JSON can hold it and the env it makes has the recorded spaces; else
    ``None``, warned about."""
    spec = None
    if isinstance(name, str):
        try:
            spec = gym.spec(name.partition(":")[2] or name)
        except gym.error.Error:
            spec = None
    if spec is not None:
        kwargs = dict(spec.kwargs)
        if env_args.get("backend") == "gymnasium":
            kwargs.update(env_args.get("env_kwargs") or {})
        spec = dataclasses.replace(spec, kwargs=kwargs, max_episode_steps=limit or spec.max_episode_steps)
        try:
            spec.to_json()
        except (TypeError, ValueError):
            spec = None
    if spec is None:
        warnings.warn(f"env {name!r} has no gymnasium spec to keep (not a registered id, or one JSON cannot hold): "
                      "the dataset is recorded without it, and dataset.recover_environment() will not work; pass "
                      "env_id, a registered gymnasium id of the same env, to keep one", UserWarning, stacklevel=4)
        return None
    other = _other_spaces(spec, observation_space, action_space)
    if other is not None:
        warnings.warn(f"env {name!r} is not the env gymnasium makes of that id ({other}): the dataset is recorded "
                      "without its spec, and dataset.recover_environment() will not work; record with "
                      "backend='gymnasium' (--backend gymnasium) to keep one", UserWarning, stacklevel=4)
        return None
    return spec


def _other_spaces(spec: gym.envs.registration.EnvSpec, observation_space: gym.Space,
                  action_space: gym.Space) -> str | None:
    """How the spaces of the env gymnasium makes of ``spec`` differ from the recorded ones (``None``: they do not,
    or it cannot be made here, where nothing can be compared)."""
    try:
        env = gym.make(spec)
    except (gym.error.Error, ImportError):
        return None
    try:
        for what, theirs, ours in (("observations", env.observation_space, observation_space),
                                   ("actions", env.action_space, action_space)):
            if _space_kind(theirs) != _space_kind(ours):
                return f"its {what} are {theirs}, the recorded env's {ours}"
        return None
    finally:
        env.close()


def _space_kind(space: gym.Space) -> tuple[Any, ...]:
    """What a dataset's arrays depend on in ``space``: its type, shape, dtype and, for a Discrete, its values."""
    values = (int(space.n), int(space.start)) if isinstance(space, gym.spaces.Discrete) else ()
    return type(space), space.shape, space.dtype, values


def _sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
