"""The pieces of :mod:`rlstruct.algos.datasets`: cutting an auto-reset batcher's acquisitions into whole episodes
(:class:`EpisodeCutter`), writing them into a Minari dataset as they end (:class:`DatasetWriter`), and the agents of
scripted data (:class:`RandomAgent`, :class:`EpsilonAgent`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import pathlib
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct.agents import RL_Agent
from rlstruct.algos._noise import CounterNoise, GeneratorNoise, NoiseSource
from rlstruct.algos._replay_storage import free_bytes
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import ConfigError, DiskSpaceError, MissingDependencyError, SpaceError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["DatasetWriter", "EpisodeCutter", "EpsilonAgent", "RandomAgent", "check_action_space", "check_dataset_id",
           "dataset_folder",
           "minari_module", "step_bytes"]

log = logging.getLogger(__name__)

#: Minari's ``(namespace/)name-vVERSION`` with the version required (Minari's parser fails on an id without one)
_DATASET_ID = re.compile(r"^(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?-v\d+$")
#: the noise streams of the scripted agents' draws, apart from the streams the algorithms' agents draw from
_PICK_STREAM, _ACTION_STREAM = 101, 102
#: the trajectory keys an episode is cut from: (the batcher's key, the name here)
_KEYS = (("observation/frame", "observation"), ("_observation/frame", "next_observation"),
         ("action/action", "action"), ("_observation/reward", "reward"), ("_observation/terminated", "terminated"),
         ("_observation/truncated", "truncated"), ("_observation/done", "done"))
_MB = 1 << 20
#: Minari 0.5's HDF5 storage, the version the ``datasets`` extra pins: its file, and each episode's datasets (the
#: name in the file, the key of :meth:`EpisodeCutter.add`)
_HDF5_FILE = "main_data.hdf5"
_FIELDS = ((b"observations", "observation"), (b"actions", "action"), (b"rewards", "reward"),
           (b"terminations", "terminated"), (b"truncations", "truncated"))
#: the bytes up to which a field is stored in its dataset's object header (HDF5's compact layout, whose limit is
#: 64 KiB): no data block to allocate and write apart, which a short episode's many small fields would pay each
_COMPACT_BYTES = 16 * 1024


def minari_module() -> Any:
    """``minari``, or :class:`~rlstruct.errors.MissingDependencyError` naming the extra that installs it."""
    try:
        import h5py  # noqa: F401  (Minari's default storage, which minari alone does not install)
        import minari
    except ImportError as e:
        raise MissingDependencyError(f"datasets need minari and h5py, which are not installed here ({e}); "
                                     "pip install 'rlstruct[datasets]'") from None
    return minari


def check_dataset_id(dataset_id: Any) -> str:
    """``dataset_id`` checked as Minari's ``NAMESPACE/NAME-vVERSION`` (the namespace optional).

    >>> check_dataset_id("rlstruct/cartpole-expert-v0")
    'rlstruct/cartpole-expert-v0'
    """
    if not isinstance(dataset_id, str) or not _DATASET_ID.fullmatch(dataset_id):
        raise ValueError(f"dataset_id must be Minari's NAMESPACE/NAME-vVERSION (letters, digits, '-', '_'), got "
                         f"{dataset_id!r}; pass e.g. 'rlstruct/cartpole-expert-v0'")
    return dataset_id


def dataset_folder(dataset_id: str) -> pathlib.Path:
    """Where Minari keeps ``dataset_id``: under ``MINARI_DATASETS_PATH``, by default ``~/.minari/datasets``."""
    root = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(os.path.expanduser("~"), ".minari", "datasets")
    return pathlib.Path(root) / dataset_id


def step_bytes(observation_space: gym.Space, action_space: gym.Space) -> int:
    """The bytes one step takes in a dataset: its observation, action, reward and two flags."""
    def size(space: gym.Space) -> int:
        return int(np.prod(space.shape or (1,))) * np.dtype(space.dtype).itemsize
    return size(observation_space) + size(action_space) + 4 + 2


class EpisodeCutter:
    """Cuts the acquisitions of an auto-reset batcher into whole episodes, the first ``episodes`` to start.

    An episode may span several acquisitions (windows): each env's open episode is where it started (a window and a
    step), and the windows are kept until no open episode that is kept starts in them, so that memory holds at most
    the longest episode's windows. Episodes are ranked by when they start, then by env (rows in the batcher's
    order): those of rank below ``episodes`` are kept, whatever their length, so that stopping does not favour short
    episodes; with at least ``episodes`` envs they are each env's first episode, in env order.

    An episodic batcher (``autoreset=False``, ``rlstruct eval``'s) gives each env one episode, and each acquisition
    one row per env still running when it started, in env order: with ``episodic``, the rows are placed back at
    their envs and an env leaves once its episode ends.

    Args:
        n_envs: the batcher's ``n_elems()``.
        episodes: the episodes to keep.
        episodic: the acquisitions come from an episodic batcher.

    >>> cutter = EpisodeCutter(2, 1)
    >>> cutter.finished
    False
    """

    def __init__(self, n_envs: int, episodes: int, *, episodic: bool = False):
        self.wanted = episodes
        self.episodic = episodic
        #: the envs an episodic batcher still steps
        self.running = np.ones(n_envs, dtype=bool)
        self.windows: dict[int, dict[str, np.ndarray]] = {}
        self.n_windows = 0
        self.start_window = np.zeros(n_envs, dtype=np.int64)
        self.start_step = np.zeros(n_envs, dtype=np.int64)
        #: the rank of each env's open episode
        self.rank = np.arange(n_envs, dtype=np.int64)
        self.started = n_envs
        self.kept = 0
        self.steps = 0

    @property
    def finished(self) -> bool:
        """Whether every kept episode has ended."""
        return self.kept >= self.wanted

    def add(self, trajectories: Trajectories) -> list[dict[str, Any]]:
        """The kept episodes that end in this acquisition (``[B, T]``, every env's row), in the order they end: per
        episode ``observation [L + 1, ...]`` (the last one is where it ended), ``action [L, ...]``, ``reward``,
        ``terminated``, ``truncated`` ``[L]``, and its ``env`` and ``rank``."""
        tt = trajectories.trajectories
        window = {name: tt[key].cpu().numpy() for key, name in _KEYS}
        if self.episodic:
            window = self._placed(window, tt.lengths.cpu().numpy())
        w = self.n_windows
        self.n_windows += 1
        self.windows[w] = window
        T = window["done"].shape[1]
        self.steps += T
        ended = []
        # (t, env) in time order, then env order: the order in which the next episodes start and are ranked.
        for t, b in zip(*(index.tolist() for index in np.nonzero(window["done"].T))):
            if self.rank[b] < self.wanted:
                ended.append(self._episode(b, int(self.start_window[b]), int(self.start_step[b]), w, t))
            self.rank[b] = self.started
            self.started += 1
            self.start_window[b], self.start_step[b] = w, t + 1
            self.running[b] = not self.episodic
        kept_open = self.rank < self.wanted
        oldest = int(self.start_window[kept_open].min()) if kept_open.any() else w + 1
        for old in [k for k in self.windows if k < oldest]:
            del self.windows[old]
        self.kept += len(ended)
        return ended

    def _placed(self, window: dict[str, np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
        """An episodic acquisition's rows (the running envs) at their envs' rows; steps past a row's length, and
        envs not running, never end."""
        rows = np.flatnonzero(self.running)
        assert len(rows) == len(lengths), (len(rows), len(lengths))
        placed = {}
        for name, value in window.items():
            full = np.zeros((len(self.running), *value.shape[1:]), dtype=value.dtype)
            full[rows] = value
            placed[name] = full
        T = placed["done"].shape[1]
        placed["done"][rows] &= np.arange(T) < lengths[:, None]
        return placed

    def _episode(self, b: int, w0: int, t0: int, w1: int, t1: int) -> dict[str, Any]:
        parts = [(self.windows[w], t0 if w == w0 else 0, t1 + 1 if w == w1 else None) for w in range(w0, w1 + 1)]
        episode: dict[str, Any] = {name: np.concatenate([window[name][b, lo:hi] for window, lo, hi in parts])
                                   for name in ("observation", "action", "reward", "terminated", "truncated")}
        final = self.windows[w1]["next_observation"][b, t1]
        episode["observation"] = np.concatenate([episode["observation"], final[None]])
        episode["env"], episode["rank"] = b, int(self.rank[b])
        return episode


class DatasetWriter:
    """A Minari dataset written episode by episode, in a hidden folder beside its place that :meth:`finish` moves
    there whole: a recording that fails or is interrupted leaves no dataset under its id.

    Minari's storage creates the dataset (``MinariStorage.new``: its spaces and spec) and writes its metadata at the
    end; the episodes go into its HDF5 file in Minari's layout (a group ``episode_{id}`` per episode, with attributes
    ``id`` and ``total_steps`` and one dataset per field), through one handle kept open for the whole recording and
    h5py's low-level calls. Minari's own ``update_episodes`` reopens the file and rewrites the metadata file at each
    call and creates chunked datasets through h5py's high-level API, the time of a recording of short episodes.
    Each episode leaves memory when written: memory holds HDF5's bounded caches, never the dataset.

    Args:
        dataset_id: checked by :func:`check_dataset_id`.
        observation_space, action_space: the single env's spaces.
        env_spec: gymnasium's spec of the env (``None``: the dataset cannot recover its env).
        overwrite: replace a dataset of that id at :meth:`finish`.

    Raises:
        ConfigError: a dataset of that id exists and ``overwrite`` is false.
    """

    def __init__(self, dataset_id: str, observation_space: gym.Space, action_space: gym.Space,
                 env_spec: gym.envs.registration.EnvSpec | None, *, overwrite: bool = False):
        import h5py
        from minari.dataset.minari_storage import MinariStorage

        self.dataset_id = dataset_id
        self.path = dataset_folder(dataset_id)
        self.overwrite = overwrite
        if self.path.exists() and not overwrite:
            raise ConfigError(f"dataset_id {dataset_id!r} exists already ({self.path}); pass overwrite=True "
                              "(--overwrite) to replace it, or another name or version")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.partial = self.path.parent / f".{self.path.name}.partial-{os.getpid()}"
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir()
        self.file: Any = None
        try:
            # jpeg_encoding=False: Minari's default stores image observations as JPEG, which changes their pixels.
            self.storage = MinariStorage.new(self.partial / "data", observation_space=observation_space,
                                             action_space=action_space, env_spec=env_spec, jpeg_encoding=False)
            # track_order: the root group Minari's storage creates, episodes listed in the order they were written.
            self.file = h5py.File(self.storage.data_path / _HDF5_FILE, "w", track_order=True)
        except BaseException:
            self.abort()
            raise
        self.episodes = 0
        self.steps = 0

    def write(self, episodes: list[dict[str, Any]]) -> None:
        """Appends ``episodes`` (as :meth:`EpisodeCutter.add` gives them) to the dataset.

        Raises:
            DiskSpaceError: the disk filled up (the partial dataset is then removed).
        """
        with self._disk_full_removes():
            for episode in episodes:
                _write_episode(self.file.id, self.episodes, episode)
                self.episodes += 1
                self.steps += len(episode["reward"])

    def finish(self, metadata: Mapping[str, Any]) -> None:
        """Writes the dataset's ``metadata`` and moves it to its place (replacing an older one with ``overwrite``).

        Raises:
            DiskSpaceError: the disk filled up (the partial dataset is then removed).
        """
        minari = minari_module()
        from minari.namespace import create_namespace, list_local_namespaces

        with self._disk_full_removes():  # closing flushes HDF5's cached metadata, and the metadata file is written
            self.file.close()
            self.storage.update_metadata({**metadata, "dataset_id": self.dataset_id,
                                          "minari_version": minari.__version__, "total_episodes": self.episodes,
                                          "total_steps": self.steps, "dataset_size": self.storage.get_size()})
        namespace = self.dataset_id.rpartition("/")[0]
        if namespace and namespace not in list_local_namespaces():
            create_namespace(namespace)
        if self.path.exists() and self.overwrite:
            shutil.rmtree(self.path)
        os.replace(self.partial, self.path)

    @contextlib.contextmanager
    def _disk_full_removes(self) -> Iterator[None]:
        """A full disk (an ``OSError`` of ``ENOSPC``, or one HDF5 gives without an errno while the disk has under
        16 MB free) inside the block removes the partial dataset and raises :class:`DiskSpaceError`."""
        try:
            yield
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) and free_bytes(self.partial) > 16 * _MB:
                raise
            self.abort()
            raise DiskSpaceError(f"the disk of {self.path.parent} filled up after {self.episodes} episodes of "
                                 f"dataset_id {self.dataset_id!r} (the partial dataset is removed); free disk space, "
                                 "or record fewer episodes") from None

    def abort(self) -> None:
        """Removes the partial dataset; idempotent."""
        if self.file is not None:
            # The file is removed next: a close that fails on a full disk leaves nothing to keep.
            with contextlib.suppress(OSError, ValueError):
                self.file.close()
        shutil.rmtree(self.partial, ignore_errors=True)


def _write_episode(location: Any, episode_id: int, episode: Mapping[str, Any]) -> None:
    """Writes ``episode`` (as :meth:`EpisodeCutter.add` gives it) as the group ``episode_{episode_id}`` of the HDF5
    ``location``, in Minari's layout, as h5py's ``create_group`` and ``create_dataset`` would (their types, UTF-8
    names, no timestamps); a field of at most :data:`_COMPACT_BYTES` is stored compact (in its dataset's header),
    a larger one contiguous."""
    from h5py import h5a, h5d, h5g, h5s

    links, group_plist, contiguous, compact = _property_lists()
    group = h5g.create(location, f"episode_{episode_id}".encode(), links, group_plist)
    for name, value in ((b"id", episode_id), (b"total_steps", len(episode["reward"]))):
        scalar = np.array(value, dtype=np.int64)
        h5a.create(group, name, _hdf5_type(scalar.dtype), _dataspace(())).write(scalar)
    for name, key in _FIELDS:
        data = np.ascontiguousarray(episode[key])
        kind = _hdf5_type(data.dtype)
        plist = compact if data.nbytes <= _COMPACT_BYTES else contiguous
        dataset = h5d.create(group, name, kind, _dataspace(data.shape), plist, links)
        dataset.write(h5s.ALL, h5s.ALL, data, mtype=kind)


@functools.cache
def _property_lists() -> tuple[Any, Any, Any, Any]:
    """The link, group, contiguous and compact dataset creation property lists of :func:`_write_episode`, built
    once."""
    from h5py import h5d, h5p, h5t

    links = h5p.create(h5p.LINK_CREATE)
    links.set_char_encoding(h5t.CSET_UTF8)
    group = h5p.create(h5p.GROUP_CREATE)
    group.set_obj_track_times(False)
    datasets = []
    for layout in (h5d.CONTIGUOUS, h5d.COMPACT):
        dataset = h5p.create(h5p.DATASET_CREATE)
        dataset.set_layout(layout)
        dataset.set_obj_track_times(False)
        dataset.set_fill_time(h5d.FILL_TIME_NEVER)  # every element is written at once
        datasets.append(dataset)
    return links, group, *datasets


@functools.lru_cache(maxsize=4096)
def _dataspace(shape: tuple[int, ...]) -> Any:
    """The HDF5 dataspace of ``shape`` (``()``: a scalar), shared: HDF5 copies it into each object it creates, and
    an episode's lengths repeat."""
    from h5py import h5s

    return h5s.create(h5s.SCALAR) if shape == () else h5s.create_simple(shape)


@functools.cache
def _hdf5_type(dtype: np.dtype) -> Any:
    """h5py's HDF5 type of ``dtype`` (``bool`` as its enum), as ``create_dataset`` makes it."""
    import h5py

    return h5py.h5t.py_create(dtype, logical=True)


def _noise(seed: int | None, env_index: int | None, device: torch.device) -> NoiseSource:
    if env_index is not None:
        return CounterNoise(seed, env_index, device)
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    return GeneratorNoise(generator)


def _random_actions(space: gym.Space, noise: NoiseSource, B: int) -> torch.Tensor:
    if isinstance(space, gym.spaces.Discrete):
        return noise.integers(int(space.n), (B,), stream=_ACTION_STREAM) + int(space.start)
    low = torch.as_tensor(space.low, dtype=torch.float32)
    high = torch.as_tensor(space.high, dtype=torch.float32)
    u = noise.uniform((B, *space.shape), stream=_ACTION_STREAM)
    return (low.to(u.device) + (high - low).to(u.device) * u).to(getattr(torch, np.dtype(space.dtype).name))


def check_action_space(space: gym.Space) -> None:
    """Refuses an action space a scripted agent cannot draw from: a Discrete or a bounded Box only."""
    if isinstance(space, gym.spaces.Discrete):
        return
    if isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all():
        return
    raise SpaceError(f"random actions need a Discrete or a bounded Box action space, got {space}; record with an "
                     "agent of your own (create_agent)")


class RandomAgent(RL_Agent):
    """Uniform random actions of ``action_space`` (a Discrete or a bounded Box), on ``device``.

    Seeded by the batcher like the algorithms' agents: :meth:`seed` draws from a generator of its own,
    :meth:`seed_envs` draws for env ``i`` at step ``t`` from ``(seed, i, t)``.
    """

    def __init__(self, action_space: gym.Space, device: DeviceLike = "cpu"):
        self.action_space = action_space
        self.device = as_device(device)
        self.noise = _noise(None, None, self.device)

    def seed(self, seed: int) -> None:
        self.noise = _noise(seed, None, self.device)

    def seed_envs(self, seed: int, env_index: int) -> None:
        self.noise = _noise(seed, env_index, self.device)

    def __call__(self, state, observation, agent_info, history=None):
        action = _random_actions(self.action_space, self.noise, observation.n_elems())
        self.noise.advance()
        return DictTensor({"action": action}), state


class EpsilonAgent(RL_Agent):
    """Another agent's actions, each replaced with probability ``epsilon`` by a uniform random one.

    Args:
        create_agent, agent_args: the agent whose actions are kept (built here, in the batcher's worker).
        epsilon: the probability of a random action, in ``[0, 1]``.
        action_space: the env's action space (a Discrete or a bounded Box).
        device: where observations come from.
    """

    def __init__(self, create_agent: Callable[..., RL_Agent], agent_args: dict[str, Any], epsilon: float,
                 action_space: gym.Space, device: DeviceLike = "cpu"):
        self.agent = create_agent(**agent_args)
        self.epsilon = epsilon
        self.action_space = action_space
        self.device = as_device(device)
        self.noise = _noise(None, None, self.device)

    def seed(self, seed: int) -> None:
        self.agent.seed(seed)
        # Not the agent's own stream: a generator seeded alike would repeat the agent's draws.
        self.noise = _noise((seed + 1) % 2**31, None, self.device)

    def seed_envs(self, seed: int, env_index: int) -> None:
        self.agent.seed_envs(seed, env_index)
        self.noise = _noise(seed, env_index, self.device)

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:
        return self.agent.initial_state(agent_info, B)

    def update(self, state_dict: Any) -> None:
        self.agent.update(state_dict)

    def close(self) -> None:
        self.agent.close()

    def __call__(self, state, observation, agent_info, history=None):
        out, state = self.agent(state, observation, agent_info, history)
        B = observation.n_elems()
        picked = self.noise.uniform((B,), stream=_PICK_STREAM) < self.epsilon
        random = _random_actions(self.action_space, self.noise, B)
        self.noise.advance()
        action = out["action"]
        picked = picked.to(action.device).view(B, *([1] * (action.dim() - 1)))
        values = {key: out[key] for key in out.keys()}
        values["action"] = torch.where(picked, random.to(action.device, action.dtype), action)
        return DictTensor(values), state
