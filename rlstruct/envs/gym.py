"""VecEnv adapters over gymnasium 1.x environments: :class:`GymEnv` (episodic) and :class:`GymEnvInf` (auto-reset).

Both wrap either a list of ``gymnasium.Env`` (stepped one by one in a Python loop, results stacked once
per step) or one ``gymnasium.vector.VectorEnv`` (stepped with one call per step, no per-env loop), and
expose the rlstruct :class:`~rlstruct.envs.VecEnv` contract on the CPU.

Observation keys, in this order: the observation itself (``frame`` for an array space, one key per
entry of a flat ``Dict`` space), then ``reward`` (float32 ``[B]``), ``done`` (bool ``[B]``,
``terminated | truncated``), ``terminated``, ``truncated``, ``initial_state`` (bool ``[B]``) and
``last_action``. Dtypes follow the spaces: a ``Box`` keeps its dtype (a uint8 image stays uint8),
``Discrete`` becomes int64 ``[B]``, ``MultiDiscrete`` int64 ``[B, k]``.

Seeding: env ``k`` of an adapter built with ``seed`` is reset with
``numpy.random.SeedSequence(seed).spawn(n_envs)[k]`` turned into an int in ``[0, 2**31)``
(:func:`~rlstruct.seeding.env_seeds`), so that
the seeds differ across ``k`` and also across adapters built with consecutive seeds (batcher workers),
which ``seed + k`` would not give. Only the first ``reset()`` after construction passes these seeds;
later resets continue each env's RNG, as gymnasium does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlstruct.envs._base import (
    CallOrder,
    HostDestinations,
    StepResult,
    VecEnv,
    check_env_info,
    check_some_running,
    host_copy,
)
from rlstruct.errors import BatchSizeError, DeviceMismatchError, SpaceError
from rlstruct.seeding import check_seed, env_seeds
from rlstruct.structures import DictTensor

__all__ = ["GymEnv", "GymEnvInf", "env_seeds", "resets_a_subset"]

_CPU = torch.device("cpu")
_RESERVED_KEYS = ("reward", "done", "terminated", "truncated", "initial_state", "last_action")
_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


# ------------------------------------------------------------------------------------------- spaces
class _Field:
    """One observation key: where it comes from (``entry`` of a Dict space, or the whole observation)."""

    __slots__ = ("key", "entry", "shape", "dtype")

    def __init__(self, key: str, entry: str | None, shape: tuple[int, ...], dtype: np.dtype):
        self.key, self.entry, self.shape, self.dtype = key, entry, shape, dtype


def _leaf_field(space: gym.Space, key: str, entry: str | None) -> _Field:
    if isinstance(space, spaces.Box):
        return _Field(key, entry, tuple(space.shape), np.dtype(space.dtype))
    if isinstance(space, spaces.Discrete):
        return _Field(key, entry, (), np.dtype(np.int64))
    if isinstance(space, spaces.MultiDiscrete):
        return _Field(key, entry, tuple(space.shape), np.dtype(np.int64))
    if isinstance(space, spaces.MultiBinary):
        return _Field(key, entry, tuple(space.shape), np.dtype(space.dtype))
    where = "observation_space" if entry is None else f"observation_space[{entry!r}]"
    raise SpaceError(
        f"{where} must be a Box, Discrete, MultiDiscrete or MultiBinary space, got {space}; "
        "flatten it with a gymnasium observation wrapper (e.g. gymnasium.wrappers.FlattenObservation)"
    )


def _observation_fields(space: gym.Space) -> list[_Field]:
    if not isinstance(space, spaces.Dict):
        return [_leaf_field(space, "frame", None)]
    fields = []
    for name, sub in space.spaces.items():
        if not isinstance(name, str):
            raise SpaceError(f"observation_space Dict keys must be str, got {name!r}; rename the entry")
        if name in _RESERVED_KEYS:
            raise SpaceError(
                f"observation_space Dict key {name!r} collides with the key rlstruct adds; the reserved keys "
                f"are {list(_RESERVED_KEYS)}; rename the entry (e.g. with gymnasium.wrappers.TransformObservation)"
            )
        if isinstance(sub, (spaces.Dict, spaces.Tuple)):
            raise SpaceError(
                f"observation_space[{name!r}] is a nested {type(sub).__name__}; only flat Dict spaces are "
                "supported; flatten it with gymnasium.wrappers.FlattenObservation or a custom wrapper"
            )
        fields.append(_leaf_field(sub, name, name))
    return fields


class _ActionSpec:
    """What ``action["action"]`` must look like for an action space, and a valid dummy action."""

    def __init__(self, space: gym.Space):
        if isinstance(space, spaces.Discrete):
            self.shape, self.np_dtype, self.integer = (), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.MultiDiscrete):
            self.shape, self.np_dtype, self.integer = tuple(space.shape), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.Box):
            self.shape, self.np_dtype = tuple(space.shape), np.dtype(space.dtype)
            self.integer = not np.issubdtype(self.np_dtype, np.floating)
            dummy = np.clip(np.zeros(self.shape), space.low, space.high).astype(self.np_dtype)
        else:
            raise SpaceError(
                f"action_space must be Discrete, Box or MultiDiscrete, got {space}; "
                "wrap the env with a gymnasium action wrapper that exposes one of these"
            )
        self.dtype = torch.from_numpy(np.zeros((), self.np_dtype)).dtype
        self.dummy = dummy
        kind = "an integer dtype" if self.integer else "a floating dtype"
        self.expected = f"shape [B{''.join(', ' + str(s) for s in self.shape)}] and {kind} (cast to {self.dtype})"

    def check(self, action: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, np.ndarray]:
        """Validates ``action`` (one row per running env); returns a copy in the canonical dtype, as a tensor
        and as the array it views."""
        if not isinstance(action, torch.Tensor):
            raise SpaceError(f"action['action'] must be a torch.Tensor, got {type(action).__name__}")
        if action.device.type != "cpu":
            raise DeviceMismatchError(
                f"action['action'] must be on cpu (the env's device), got {action.device}; "
                "wrap the env in DeviceEnv(env, 'cpu', agent_device) to move actions"
            )
        shape = tuple(action.shape)  # read once: each tensor attribute is a call into torch
        if len(shape) == 1 and self.shape == (1,):
            # Like the torch simulators, a 1-d Box takes ``[B]`` as well as ``[B, 1]``.
            shape = (shape[0], 1)
        if len(shape) == 0 or shape[1:] != self.shape:
            raise SpaceError(
                f"action['action'] must have {self.expected}, got shape {list(shape)}; "
                "give one action per running env with the action space's shape"
            )
        dtype = action.dtype
        if dtype not in (_INT_DTYPES if self.integer else _FLOAT_DTYPES):
            raise SpaceError(
                f"action['action'] must have {self.expected}, got dtype {dtype}; convert it with .to({self.dtype})"
            )
        if shape[0] != n_rows:
            raise BatchSizeError(
                f"action['action'] must have one row per running env ({n_rows}), got {shape[0]}; "
                "act on the observation_running returned by the last reset/step, in the order of its ids"
            )
        return host_copy(action, self.np_dtype, shape)


def _step_one(env: gym.Env, action: Any) -> tuple:
    return env.step(action)


def _stack(fields: list[_Field], observations: Sequence[Any]) -> dict[str, np.ndarray]:
    """Per-env observations (arrays, scalars or dicts of them) -> one ``[R, ...]`` array per field."""
    out = {}
    for f in fields:
        values = observations if f.entry is None else [o[f.entry] for o in observations]
        if len(values) == 0:
            out[f.key] = np.zeros((0,) + f.shape, f.dtype)
            continue
        # np.array of equal-shape arrays is np.stack's result, at a fraction of its per-call cost.
        arr = np.array(values, dtype=f.dtype)
        if arr.shape[1:] != f.shape:
            raise SpaceError(
                f"the envs returned observation {f.key!r} of shape {list(arr.shape[1:])} (stacked: {list(arr.shape)}), "
                f"but the observation space says {list(f.shape)}; fix the env or its observation_space"
            )
        out[f.key] = arr
    return out


def _fill(dst: np.ndarray, observations: Sequence[Any], f: _Field, rows: np.ndarray | None = None) -> None:
    """``dst[rows] = `` field ``f`` of the per-env ``observations`` (all rows when ``rows`` is None), converted to
    ``dst``'s dtype like :func:`_stack`."""
    values = observations if f.entry is None else [o[f.entry] for o in observations]
    try:
        if rows is None:
            dst[...] = values
        else:
            dst[rows] = values
    except ValueError as e:
        shapes = sorted({tuple(np.shape(v)) for v in values})
        raise SpaceError(
            f"the envs returned observation {f.key!r} of shapes {[list(s) for s in shapes]}, but the observation "
            f"space says {list(f.shape)}; fix the env or its observation_space"
        ) from e


def _write_flags(nxt: dict[str, np.ndarray], run: dict[str, np.ndarray], reward, term, trunc,
                 a_np: np.ndarray) -> np.ndarray:
    """Writes the reward, flags and last action of an auto-reset step into the destination arrays (every row as
    if no env finished: the caller then fixes the finished rows of ``run``); returns ``nxt["done"]``."""
    done = nxt["done"]
    nxt["reward"][...] = reward
    nxt["terminated"][...] = term
    nxt["truncated"][...] = trunc
    np.logical_or(nxt["terminated"], nxt["truncated"], out=done)
    nxt["initial_state"][...] = False
    nxt["last_action"][...] = a_np
    run["reward"][...] = nxt["reward"]
    run["done"][...] = False
    run["terminated"][...] = False
    run["truncated"][...] = False
    run["initial_state"][...] = done
    run["last_action"][...] = a_np
    return done


def _split(fields: list[_Field], batched: Any) -> dict[str, np.ndarray]:
    """A vector env's batched observation (array or dict of arrays) -> one ``[n, ...]`` array per field."""
    return {
        f.key: np.asarray(batched if f.entry is None else batched[f.entry]).astype(f.dtype, copy=False)
        for f in fields
    }


def _autoreset_mode(vector_env: Any) -> AutoresetMode:
    # gymnasium's default when a vector env does not declare its mode.
    mode = getattr(vector_env, "metadata", {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)


# ------------------------------------------------------------------------------------------- adapter
class GymEnv(CallOrder, VecEnv):
    """``n`` gymnasium envs as an rlstruct :class:`~rlstruct.envs.VecEnv` on the CPU.

    Episodic by default: an env that finishes (``terminated or truncated``) leaves the running set
    until the next ``reset``. With ``autoreset=True`` (or :class:`GymEnvInf`) every env keeps running and
    a finished env's row of ``observation_running`` is its fresh reset observation (``initial_state=True``,
    ``done=False``, ``reward=0``, ``last_action=0``) while ``observation_next`` holds the terminal one.

    Built from:

    * a list of ``gymnasium.Env`` (same spaces): ``step`` loops over the running envs calling
      ``env.step`` (and ``env.reset`` for finished ones when auto-resetting) and stacks the numpy results
      once per key;
    * a ``gymnasium.vector.VectorEnv``: ``step`` makes one vector ``step`` call and one
      ``torch.from_numpy`` per key, with no per-env Python loop. Its ``autoreset_mode`` metadata is read:

      - ``SAME_STEP``: the terminal observation comes from ``infos["final_obs"]``, e.g.
        ``gym.make_vec(id, n, vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})``.
      - ``NEXT_STEP`` (gymnasium's default, ale-py's ``AtariVectorEnv``, envpool). Episodic: a finished env
        keeps being stepped with a valid dummy action (its reset happens inside the vector env) and its rows
        are never shown. Auto-reset: such an env would only reset on its next step, so right after a step in
        which some envs finished, the adapter resets just those (``vec.reset(options={"reset_mask": done})``)
        and the same ``step`` returns the terminal and the fresh observations. That needs a vector env that
        resets a subset (gymnasium's Sync/AsyncVectorEnv, ale-py's AtariVectorEnv, envpool through
        ``make_env``); one that cannot (e.g. ``gym.make_vec("CartPole-v1", n,
        vectorization_mode="vector_entry_point")``) is refused with ``autoreset=True``.
      - ``DISABLED``: refused.

      Since a finished env keeps running inside a vector env, the episodes after the first ``reset()``
      may start from other states than over a list (the env's RNG has moved on); with the same seed the
      first episode of each env is identical over a list and over a ``SyncVectorEnv``.

    ``reset(env_info)``: row ``i`` of a non-empty ``env_info`` is passed to env ``i`` as
    ``env.reset(options={key: env_info[key][i].tolist(), ...})``. Over a list, auto-resets reuse env
    ``i``'s options. A vector env takes one options dict for all its envs, so every row must then be equal,
    and ``autoreset=True`` over a vector env refuses env_info (its own auto-resets ignore options).

    Args:
        envs: a non-empty list of ``gymnasium.Env`` with equal spaces, or one ``gymnasium.vector.VectorEnv``.
        seed: an int in ``[0, 2**31)``; see :func:`~rlstruct.seeding.env_seeds` (a ``SyncVectorEnv`` or
            ``AsyncVectorEnv`` gets the per-env list, ale-py's ``AtariVectorEnv`` the same as an array, any other
            vector env the first of them).
        autoreset: reset finished envs inside ``step``.

    Attributes:
        device: ``cpu``.
        autoreset: whether finished envs are reset inside ``step``.
        action_space: the single-env action space (Discrete, Box or MultiDiscrete).
        observation_space: the single-env observation space (Box, Discrete, MultiDiscrete, MultiBinary,
            or a flat Dict of them).

    Raises:
        TypeError: ``envs`` is neither a list of envs nor a vector env.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        ValueError: ``envs`` is empty, or the vector env's autoreset mode does not fit.
        SpaceError: unsupported or mismatching spaces, or a Dict key that collides with a reserved key.

    Shapes, for ``B`` rows: observation keys ``[B, *space.shape]``; ``reward: float32 [B]``;
    ``done, terminated, truncated, initial_state: bool [B]``; ``last_action: [B, *action_shape]``;
    ids ``int64 [B]``.

    >>> import gymnasium as gym
    >>> env = GymEnv([gym.make("CartPole-v1") for _ in range(3)], seed=0)
    >>> obs, ids = env.reset()
    >>> list(obs.keys())
    ['frame', 'reward', 'done', 'terminated', 'truncated', 'initial_state', 'last_action']
    >>> obs["frame"].shape, ids
    (torch.Size([3, 4]), tensor([0, 1, 2]))
    >>> action = DictTensor({"action": torch.zeros(3, dtype=torch.int64)})
    >>> (obs_next, ids), (obs_running, ids_running) = env.step(action)
    >>> obs_next["reward"]
    tensor([1., 1., 1.])
    """

    def __init__(self, envs: Sequence[gym.Env] | gym.vector.VectorEnv, seed: int, *, autoreset: bool = False):
        self._seeds_pending = True
        self._seed = check_seed(seed)
        self.autoreset = bool(autoreset)
        self.device = _CPU
        self._closed = False
        self._started = False
        if _is_vector_env(envs):
            self._init_vector(envs)
        elif isinstance(envs, (list, tuple)):
            self._init_list(list(envs))
        else:
            raise TypeError(
                f"envs must be a list of gymnasium.Env or a gymnasium.vector.VectorEnv, got {type(envs).__name__}; "
                "pass e.g. [gymnasium.make('CartPole-v1') for _ in range(n)]"
            )
        self._fields = _observation_fields(self.observation_space)
        self._action = _ActionSpec(self.action_space)
        self._all_ids = torch.arange(self._n)
        self._options: list[dict[str, Any] | None] = [None] * self._n
        self._running = np.arange(self._n)
        specs = {f.key: (f.shape, f.dtype) for f in self._fields}
        specs.update({k: ((), np.dtype(np.float32 if k == "reward" else bool)) for k in _RESERVED_KEYS[:-1]})
        specs["last_action"] = (self._action.shape, self._action.np_dtype)
        self._dest = HostDestinations(specs, self._n)

    # ---------------------------------------------------------------- construction
    def _init_list(self, envs: list[gym.Env]) -> None:
        if not envs:
            raise ValueError("envs must hold at least one gymnasium.Env, got an empty list")
        for i, e in enumerate(envs):
            if not isinstance(e, gym.Env):
                raise TypeError(f"envs[{i}] must be a gymnasium.Env, got {type(e).__name__}")
        self._envs, self._vec = envs, None
        self._n = len(envs)
        self.action_space = envs[0].action_space
        self.observation_space = envs[0].observation_space
        for i, e in enumerate(envs[1:], 1):
            for name in ("observation_space", "action_space"):
                if getattr(e, name) != getattr(envs[0], name):
                    raise SpaceError(
                        f"every env must have the same {name}: envs[0] has {getattr(envs[0], name)}, envs[{i}] "
                        f"has {getattr(e, name)}; build the list from one env id"
                    )

    def _init_vector(self, vec: Any) -> None:
        mode = _autoreset_mode(vec)
        if mode == AutoresetMode.DISABLED:
            raise ValueError(
                "the vector env has autoreset_mode=DISABLED, which GymEnv cannot step past an episode end; "
                "build it with vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}"
            )
        if self.autoreset and mode != AutoresetMode.SAME_STEP and not resets_a_subset(vec):
            raise ValueError(
                f"GymEnvInf (autoreset=True) needs a vector env with autoreset_mode=SAME_STEP, got {mode.name} "
                f"({type(vec).__name__}), which cannot reset a subset of its envs: with NEXT_STEP a finished env "
                "only resets on its next step, so the fresh observation cannot be returned with the terminal one "
                "unless the adapter resets it at once (reset(options={'reset_mask': mask}), as gymnasium's "
                "Sync/AsyncVectorEnv, ale-py's AtariVectorEnv and envpool do); build it with "
                "gymnasium.make_vec(id, n, vectorization_mode='sync', "
                "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}), "
                "or pass a list of envs, or use GymEnv (episodic)"
            )
        self._envs, self._vec = None, vec
        self._same_step = mode == AutoresetMode.SAME_STEP
        # NEXT_STEP with auto-reset: the adapter resets the finished envs itself, right after the step that
        # finished them, so that one step returns both observations (the vector env then has nothing to reset).
        self._reset_finished = self.autoreset and mode == AutoresetMode.NEXT_STEP
        self._n = int(vec.num_envs)
        self.action_space = vec.single_action_space
        self.observation_space = vec.single_observation_space
        # gymnasium's Sync/AsyncVectorEnv return a fresh array per step unless built with copy=False.
        self._vec_copy = not getattr(vec, "copy", True)
        inner = getattr(vec, "unwrapped", vec)
        self._seed_list = isinstance(inner, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))
        # ale-py's AtariVectorEnv takes one seed per env as an array (an int seeds them with consecutive values).
        self._seed_array = _is_ale_vector(inner)
        self._act_buf: np.ndarray | None = None

    # ---------------------------------------------------------------- VecEnv
    def n_envs(self) -> int:
        """The number of environments."""
        return self._n

    def __repr__(self) -> str:
        if self._vec is not None:
            source = type(self._vec).__name__
        else:
            source = f"list of {type(self._envs[0].unwrapped).__name__}"
        return f"{type(self).__name__}(n_envs={self._n}, autoreset={self.autoreset}, source={source})"

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env.

        Args:
            env_info: ``None``, an empty DictTensor, or ``n_envs`` rows on the CPU; row ``i`` becomes
                ``options`` of env ``i``'s ``reset`` (see the class docstring).

        Returns:
            ``(observation [n_envs], ids)`` with ``ids = arange(n_envs)``, ``initial_state=True``,
            ``done=terminated=truncated=False``, ``reward=0`` and ``last_action`` zeros.

        Raises:
            BatchSizeError: ``env_info`` does not have ``n_envs`` rows.
            DeviceMismatchError: ``env_info`` is not on the CPU.
            ValueError: a vector env gets differing rows, or env_info with ``autoreset=True``.
        """
        self._check_open()
        options = self._options_from(env_info)
        seeds = env_seeds(self._seed, self._n) if self._seeds_pending else None
        if self._vec is not None:
            # Sync/AsyncVectorEnv seed env k with seed[k], AtariVectorEnv with an array; others take one int.
            if seeds is None or self._seed_list:
                vseed: Any = seeds
            elif self._seed_array:
                vseed = np.asarray(seeds, dtype=np.int64)
            else:
                vseed = seeds[0]
            obs, _ = self._vec.reset(seed=vseed, options=options[0])
            fields = _split(self._fields, obs)
            if self._vec_copy:
                fields = {k: v.copy() for k, v in fields.items()}
        else:
            observations = []
            for i, env in enumerate(self._envs):
                o, _ = env.reset(seed=None if seeds is None else seeds[i], options=options[i])
                observations.append(o)
            fields = _stack(self._fields, observations)
        self._seeds_pending = False
        self._options = options
        self._running = np.arange(self._n)
        self._started = True
        obs = self._assemble(fields, *self._no_step(self._n))
        obs.variables["initial_state"] = torch.ones(self._n, dtype=torch.bool)
        return obs, self._all_ids

    def _options_from(self, env_info: DictTensor | None) -> list[dict[str, Any] | None]:
        if not check_env_info(env_info, self._n):
            return [None] * self._n
        if self._vec is not None:
            if self.autoreset:
                raise ValueError(
                    "env_info cannot parametrise a vector env's auto-resets (gymnasium resets them without options); "
                    "pass a list of envs to GymEnvInf, or use GymEnv"
                )
            for k, v in env_info.items():
                if not bool((v == v[:1]).all()):
                    raise ValueError(
                        f"a vector env takes one options dict for all its envs, but env_info[{k!r}] differs across "
                        "rows; pass a list of envs for per-env options"
                    )
        columns = {k: v.tolist() for k, v in env_info.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(self._n)]

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs with ``action["action"]`` (one row per running env, in ids order).

        Args:
            action: a DictTensor holding ``action``: int64 ``[B]`` for Discrete, ``[B, *shape]`` of the Box's
                floating dtype for Box (``[B]`` also for a Box of shape ``(1,)``), int64 ``[B, k]`` for
                MultiDiscrete (any integer / floating dtype of the right kind is cast); its other keys are
                ignored.

        Returns:
            ``((observation_next [B], ids [B]), (observation_running [B'], ids_running [B']))``, see
            :class:`~rlstruct.envs.VecEnv`. The two observations may share tensors.

        Raises:
            SpaceError: ``action["action"]`` has the wrong shape or dtype kind.
            BatchSizeError: it does not have one row per running env.
            DeviceMismatchError: it is not on the CPU.
            EnvStateError: ``reset`` was never called, the env is closed, or every episodic env has finished.
        """
        self._check_steppable("step")
        running = self._running
        check_some_running(len(running), self._n)
        a, a_np = self._action.check(action["action"], len(running))
        ids = self._all_ids if len(running) == self._n else torch.from_numpy(running)
        if self._vec is not None:
            nxt, reward, term, trunc, done_np, fresh = self._step_vector(a_np, running)
        else:
            nxt, reward, term, trunc, done_np, fresh = self._step_list(a_np, running)
        obs_next = self._assemble(nxt, reward, term, trunc, a, done_np)
        if not done_np.any():
            return (obs_next, ids), (obs_next, ids)
        if not self.autoreset:
            keep = ~done_np
            self._running = running[keep]
            ids_running = torch.from_numpy(self._running)
            return (obs_next, ids), (obs_next.index(torch.from_numpy(np.flatnonzero(keep))), ids_running)
        # The running observation, built on numpy (a few rows: numpy's calls are the cheaper ones).
        v = {f.key: torch.from_numpy(fresh[f.key]) for f in self._fields}
        reward_r = reward.copy()
        reward_r[done_np] = 0.0
        last_r = a_np.copy()
        last_r[done_np] = 0
        flags = np.zeros((3, len(done_np)), dtype=bool)
        v["reward"] = torch.from_numpy(reward_r)
        v["done"] = torch.from_numpy(flags[0])
        v["terminated"] = torch.from_numpy(flags[1])
        v["truncated"] = torch.from_numpy(flags[2])
        v["initial_state"] = torch.from_numpy(done_np)
        v["last_action"] = torch.from_numpy(last_r)
        return (obs_next, ids), (DictTensor._trusted(v), ids)

    def writes_in_place(self) -> bool:
        """True with ``autoreset=True``: :meth:`step_into` writes each env's results (over a list) or the vector
        env's arrays straight into the destination arrays."""
        return self.autoreset

    def step_into(self, action: DictTensor, observation_next: DictTensor, observation_running: DictTensor) -> None:
        """:meth:`step`, writing both observations into the given CPU tensors (see
        :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`).

        With ``autoreset=True``, the results of the ``env.step`` calls (over a list) or the arrays the vector env
        returns are converted straight into the destinations (no DictTensor per step, no copy of one); an episodic
        env refuses (see :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`).
        """
        if not self.writes_in_place():
            return super().step_into(action, observation_next, observation_running)
        self._check_steppable("step_into")
        _, a_np = self._action.check(action["action"], self._n)
        nxt, run = self._dest(observation_next, "observation_next"), self._dest(observation_running,
                                                                                "observation_running")
        if self._vec is not None:
            self._step_into_vector(a_np, nxt, run)
            return
        envs = self._envs
        observations, rewards, terms, truncs, _ = zip(*map(_step_one, envs, a_np))
        for f in self._fields:
            _fill(nxt[f.key], observations, f)
            run[f.key][...] = nxt[f.key]
        done = _write_flags(nxt, run, rewards, terms, truncs, a_np)
        rows = np.flatnonzero(done)
        if len(rows):
            options = self._options
            fresh = [envs[j].reset(options=options[j])[0] for j in rows.tolist()]
            for f in self._fields:
                _fill(run[f.key], fresh, f, rows)
            run["reward"][rows] = 0.0
            run["last_action"][rows] = 0

    def _step_into_vector(self, a_np: np.ndarray, nxt: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> None:
        obs, reward, term, trunc, infos = self._vec.step(a_np)
        for f in self._fields:
            arr = obs if f.entry is None else obs[f.entry]
            np.copyto(nxt[f.key], arr, casting="unsafe")
            np.copyto(run[f.key], arr, casting="unsafe")
        done = _write_flags(nxt, run, reward, term, trunc, a_np)
        if not done.any():
            return
        rows = np.flatnonzero(done)
        if self._same_step:
            final = _stack(self._fields, list(infos["final_obs"][rows]))
            for k, arr in final.items():
                nxt[k][rows] = arr
        else:
            for k, arr in self._reset_rows(done).items():
                run[k][rows] = arr
        run["reward"][rows] = 0.0
        run["last_action"][rows] = 0

    def _reset_rows(self, done: np.ndarray) -> dict[str, np.ndarray]:
        """Resets the finished envs of a NEXT_STEP vector env (``done``: bool ``[n_envs]``); returns their fresh
        observations (``[done.sum(), ...]`` per field)."""
        obs, _ = self._vec.reset(options={"reset_mask": done.copy()})
        fields = _split(self._fields, obs)
        rows = int(done.sum())
        # A vector env returns every env's observation (gymnasium, ale-py) or the reset ones only (envpool).
        return {k: v[done] if len(v) != rows else v for k, v in fields.items()}

    def _step_list(self, a_np: np.ndarray, running: np.ndarray):
        # The only per-env Python is the env.step call itself: the results are unzipped and stacked by C loops.
        envs = self._envs if len(running) == self._n else [self._envs[i] for i in running.tolist()]
        observations, rewards, terms, truncs, _ = zip(*map(_step_one, envs, a_np))
        nxt = _stack(self._fields, observations)
        reward = np.array(rewards, dtype=np.float32)
        term = np.array(terms, dtype=bool)
        trunc = np.array(truncs, dtype=bool)
        done = term | trunc
        fresh = None
        if self.autoreset:
            reset_rows = np.flatnonzero(done)
            if len(reset_rows):
                options = self._options
                reset_obs = [envs[j].reset(options=options[running[j]])[0] for j in reset_rows.tolist()]
                new = _stack(self._fields, reset_obs)
                fresh = {}
                for k, arr in nxt.items():
                    arr = arr.copy()
                    arr[reset_rows] = new[k]
                    fresh[k] = arr
        return nxt, reward, term, trunc, done, fresh

    def _step_vector(self, a_np: np.ndarray, running: np.ndarray):
        n = self._n
        full = len(running) == n
        if full:
            vec_action = a_np
        else:
            if self._act_buf is None:
                self._act_buf = np.broadcast_to(self._action.dummy, (n,) + self._action.shape).copy()
            self._act_buf[running] = a_np
            vec_action = self._act_buf
        obs, reward, term, trunc, infos = self._vec.step(vec_action)
        fields = _split(self._fields, obs)
        reward = np.asarray(reward, dtype=np.float32)
        term = np.asarray(term, dtype=bool)
        trunc = np.asarray(trunc, dtype=bool)
        if full:
            if self._vec_copy:
                fields = {k: v.copy() for k, v in fields.items()}
        else:
            fields = {k: v[running] for k, v in fields.items()}
            reward, term, trunc = reward[running], term[running], trunc[running]
        done = term | trunc
        if self._reset_finished and done.any():
            fresh = {}
            for k, arr in self._reset_rows(done).items():
                f = fields[k].copy()
                f[done] = arr
                fresh[k] = f
            return fields, reward, term, trunc, done, fresh
        if not (self._same_step and done.any()):
            return fields, reward, term, trunc, done, None
        # SAME_STEP: the vector env already holds the reset observation; the terminal one is in the infos.
        rows = np.flatnonzero(done)
        final = _stack(self._fields, list(infos["final_obs"][running[rows]]))
        nxt = {}
        for k, arr in fields.items():
            arr = arr.copy()
            arr[rows] = final[k]
            nxt[k] = arr
        return nxt, reward, term, trunc, done, fields

    def _no_step(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
        """Reward, terminated, truncated and last_action of ``n`` rows that took no step."""
        last_action = torch.zeros((n,) + self._action.shape, dtype=self._action.dtype)
        return np.zeros(n, np.float32), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), last_action

    def _assemble(
        self, fields: Mapping[str, np.ndarray], reward, term, trunc, last_action: torch.Tensor, done=None
    ) -> DictTensor:
        v = {k: torch.from_numpy(arr) for k, arr in fields.items()}
        v["reward"] = torch.from_numpy(reward)
        # A copy of ``done``: the caller may hand ``done`` itself out as another observation's initial_state.
        v["done"] = torch.from_numpy(term | trunc if done is None else done.copy())
        v["terminated"] = torch.from_numpy(term)
        v["truncated"] = torch.from_numpy(trunc)
        v["initial_state"] = torch.zeros(len(reward), dtype=torch.bool)
        v["last_action"] = last_action
        return DictTensor._trusted(v)

    def close(self) -> None:
        """Closes every gymnasium env; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._vec is not None:
            self._vec.close()
        else:
            for e in self._envs:
                e.close()


class GymEnvInf(GymEnv):
    """:class:`GymEnv` with ``autoreset=True``: every env keeps running; finished envs restart inside ``step``.

    ``observation_next`` holds the terminal observation of a finished env (``done=True``) and
    ``observation_running`` its fresh reset observation (``initial_state=True``, ``done=False``,
    ``reward=0``, ``last_action=0``); ids are always ``arange(n_envs)``.

    Args:
        envs: a list of ``gymnasium.Env``, or a ``gymnasium.vector.VectorEnv`` with
            ``autoreset_mode=SAME_STEP``, or ``NEXT_STEP`` if it resets a subset of its envs (see :class:`GymEnv`).
        seed: an int in ``[0, 2**31)`` (see :func:`~rlstruct.seeding.env_seeds`).

    >>> import gymnasium as gym
    >>> env = GymEnvInf([gym.make("CartPole-v1") for _ in range(2)], seed=0)
    >>> obs, ids = env.reset()
    >>> for _ in range(30):
    ...     (obs_next, _), (obs, ids) = env.step(DictTensor({"action": torch.zeros(2, dtype=torch.int64)}))
    >>> ids, env.autoreset
    (tensor([0, 1]), True)
    """

    def __init__(self, envs: Sequence[gym.Env] | gym.vector.VectorEnv, seed: int):
        super().__init__(envs, seed, autoreset=True)


def _is_ale_vector(vec: Any) -> bool:
    # Checked by module name, so that ale-py is never imported for it.
    return type(vec).__name__ == "AtariVectorEnv" and type(vec).__module__.startswith("ale_py")


def resets_a_subset(vec: Any) -> bool:
    """Whether the vector env ``vec`` resets a subset of its envs with ``vec.reset(options={"reset_mask": mask})``
    (``mask``: bool ``[num_envs]``), returning the observations of every env or of the reset ones, and then steps
    them normally (no pending auto-reset): gymnasium's ``SyncVectorEnv``/``AsyncVectorEnv``, ale-py's
    ``AtariVectorEnv``, and any vector env whose ``metadata`` says ``"reset_mask": True`` (rlstruct's envpool
    wrapper)."""
    if getattr(vec, "metadata", {}).get("reset_mask") is True:
        return True
    inner = getattr(vec, "unwrapped", vec)
    return isinstance(inner, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)) or _is_ale_vector(inner)


def _is_vector_env(envs: Any) -> bool:
    if isinstance(envs, gym.vector.VectorEnv):
        return True
    # Duck-typed vector envs (e.g. envpool's gymnasium API) expose the same attributes.
    return all(hasattr(envs, a) for a in ("num_envs", "single_action_space", "single_observation_space", "step"))
