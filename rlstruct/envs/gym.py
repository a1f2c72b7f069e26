"""gymnasium 1.x envs as rlstruct VecEnvs on the CPU: :class:`GymEnv` (episodic) and :class:`GymEnvInf`
(auto-reset), over a list of ``gymnasium.Env`` or one ``gymnasium.vector.VectorEnv`` (the two adapters of
:mod:`rlstruct.envs._gym_adapters`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct.envs._base import CallOrder, HostDestinations, StepResult, VecEnv, check_env_info, check_some_running
from rlstruct.envs._gym_adapters import GymAdapter, ListAdapter, VectorAdapter, is_vector_env
from rlstruct.envs._gym_arrays import RESERVED_KEYS
from rlstruct.seeding import check_env_index, check_seed, env_seeds
from rlstruct.structures import DictTensor

__all__ = ["GymEnv", "GymEnvInf"]

_CPU = torch.device("cpu")


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

    Observation keys, in this order: the observation itself (``frame`` for an array space, one key per entry of a
    flat ``Dict`` space), then the keys of :class:`~rlstruct.envs.VecEnv`. Dtypes follow the spaces: a ``Box``
    keeps its dtype (a uint8 image stays uint8), ``Discrete`` becomes int64 ``[B]``, ``MultiDiscrete`` int64
    ``[B, k]``.

    Seeding: the first ``reset()`` after construction resets env ``k`` with ``env_seeds(seed, n_envs, env_index)[k]``
    (:func:`~rlstruct.seeding.env_seeds`: seeds that differ across ``k`` and across adapters built with
    consecutive seeds, which ``seed + k`` would not give); later resets continue each env's RNG, as gymnasium
    does.

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
        env_index: the global index of the first env: env ``k`` is seeded as env ``env_index + k`` of ``seed``, so
            that envs split over processes are seeded as the same envs in one process.

    Attributes:
        device: ``cpu``.
        autoreset: whether finished envs are reset inside ``step``.
        action_space: the single-env action space (Discrete, Box or MultiDiscrete).
        observation_space: the single-env observation space (Box, Discrete, MultiDiscrete, MultiBinary,
            or a flat Dict of them).

    Raises:
        TypeError: ``envs`` is neither a list of envs nor a vector env.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        ValueError: ``envs`` is empty, the vector env's autoreset mode does not fit, or ``env_index < 0``.
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

    def __init__(self, envs: Sequence[gym.Env] | gym.vector.VectorEnv, seed: int, *, autoreset: bool = False,
                 env_index: int = 0):
        self._seeds_pending = True
        self._seed = check_seed(seed)
        self._env_index = check_env_index(env_index)
        self.autoreset = bool(autoreset)
        self.device = _CPU
        self._closed = False
        self._started = False
        self._adapter: GymAdapter
        if is_vector_env(envs):
            self._adapter = VectorAdapter(envs, self.autoreset)
        elif isinstance(envs, (list, tuple)):
            self._adapter = ListAdapter(list(envs), self.autoreset)
        else:
            raise TypeError(
                f"envs must be a list of gymnasium.Env or a gymnasium.vector.VectorEnv, got {type(envs).__name__}; "
                "pass e.g. [gymnasium.make('CartPole-v1') for _ in range(n)]"
            )
        adapter = self._adapter
        self.action_space, self.observation_space = adapter.action_space, adapter.observation_space
        self._n, self._fields, self._action_spec = adapter.n, adapter.fields, adapter.action
        self._all_ids = torch.arange(self._n)
        self._running = np.arange(self._n)
        specs = {f.key: (f.shape, f.dtype) for f in self._fields}
        specs.update({k: ((), np.dtype(np.float32 if k == "reward" else bool)) for k in RESERVED_KEYS[:-1]})
        specs["last_action"] = (self._action_spec.shape, self._action_spec.np_dtype)
        self._dest = HostDestinations(specs, self._n)

    def n_envs(self) -> int:
        """The number of environments."""
        return self._n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_envs={self._n}, autoreset={self.autoreset}, source={self._adapter.describe()})"

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env; row ``i`` of a non-empty ``env_info`` becomes ``options`` of env ``i``'s ``reset``
        (see the class docstring). The contract: :meth:`VecEnv.reset <rlstruct.envs.VecEnv.reset>`.

        Raises:
            ValueError: a vector env gets differing rows, or env_info with ``autoreset=True``.
        """
        self._check_open()
        options = self._options_from(env_info)
        seeds = env_seeds(self._seed, self._n, self._env_index) if self._seeds_pending else None
        fields = self._adapter.reset(seeds, options)
        self._seeds_pending = False
        self._running = np.arange(self._n)
        self._started = True
        obs = self._assemble(fields, *self._no_step(self._n))
        obs.variables["initial_state"] = torch.ones(self._n, dtype=torch.bool)
        return obs, self._all_ids

    def _options_from(self, env_info: DictTensor | None) -> list[dict[str, Any] | None]:
        if not check_env_info(env_info, self._n):
            return [None] * self._n
        self._adapter.check_options(env_info)
        columns = {k: v.tolist() for k, v in env_info.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(self._n)]

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs with ``action["action"]`` (one row per running env, in ids order): int64 ``[B]``
        for Discrete, ``[B, *shape]`` of the Box's floating dtype for Box (``[B]`` also for a Box of shape
        ``(1,)``), int64 ``[B, k]`` for MultiDiscrete (any integer / floating dtype of the right kind is cast).
        The two returned observations may share tensors. The contract: :meth:`VecEnv.step
        <rlstruct.envs.VecEnv.step>`.
        """
        self._check_steppable("step")
        running = self._running
        check_some_running(len(running), self._n)
        a, a_np = self._action_spec.host_copy(action["action"], len(running), running)
        ids = self._all_ids if len(running) == self._n else torch.from_numpy(running)
        nxt, reward, term, trunc, done_np, fresh = self._adapter.step(a_np, running)
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
        """:meth:`step`, writing both observations into the given CPU tensors: with ``autoreset=True``, the
        results of the ``env.step`` calls (over a list) or the arrays the vector env returns are converted
        straight into the destinations. The contract: :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`.
        """
        if not self.writes_in_place():
            return super().step_into(action, observation_next, observation_running)
        self._check_steppable("step_into")
        _, a_np = self._action_spec.host_copy(action["action"], self._n)
        nxt, run = self._dest(observation_next, "observation_next"), self._dest(observation_running,
                                                                                "observation_running")
        self._adapter.step_into(a_np, nxt, run)

    def _no_step(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
        """Reward, terminated, truncated and last_action of ``n`` rows that took no step."""
        last_action = torch.zeros((n,) + self._action_spec.shape, dtype=self._action_spec.dtype)
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
        self._adapter.close()


class GymEnvInf(GymEnv):
    """:class:`GymEnv` with ``autoreset=True``: every env keeps running; finished envs restart inside ``step``.

    ``observation_next`` holds the terminal observation of a finished env (``done=True``) and
    ``observation_running`` its fresh reset observation (``initial_state=True``, ``done=False``,
    ``reward=0``, ``last_action=0``); ids are always ``arange(n_envs)``.

    Args:
        envs: a list of ``gymnasium.Env``, or a ``gymnasium.vector.VectorEnv`` with
            ``autoreset_mode=SAME_STEP``, or ``NEXT_STEP`` if it resets a subset of its envs (see :class:`GymEnv`).
        seed: an int in ``[0, 2**31)`` (see :func:`~rlstruct.seeding.env_seeds`).
        env_index: the global index of the first env (see :class:`GymEnv`).

    >>> import gymnasium as gym
    >>> env = GymEnvInf([gym.make("CartPole-v1") for _ in range(2)], seed=0)
    >>> obs, ids = env.reset()
    >>> for _ in range(30):
    ...     (obs_next, _), (obs, ids) = env.step(DictTensor({"action": torch.zeros(2, dtype=torch.int64)}))
    >>> ids, env.autoreset
    (tensor([0, 1]), True)
    """

    def __init__(self, envs: Sequence[gym.Env] | gym.vector.VectorEnv, seed: int, *, env_index: int = 0):
        super().__init__(envs, seed, autoreset=True, env_index=env_index)

