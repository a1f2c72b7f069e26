"""Small gymnasium envs and helpers for the env tests (importable, so that spawned workers can build them)."""

from __future__ import annotations

import types
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct import DictTensor


class DictImageEnv(gym.Env):
    """Dict observation: a uint8 ``image`` filled with the step count, a random ``position`` (float32, drawn
    from the env's RNG at reset) and a Discrete ``count``; MultiDiscrete ``[3, 4]`` actions; terminates
    after ``length`` steps; reward is the action's sum."""

    def __init__(self, length: int = 4):
        self.length = length
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (3, 6, 6), np.uint8),
                "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "count": spaces.Discrete(10),
            }
        )
        self.action_space = spaces.MultiDiscrete([3, 4])

    def _obs(self):
        return {
            "image": np.full((3, 6, 6), self.t, dtype=np.uint8),
            "position": self.position.copy(),
            "count": self.t,
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        self.t += 1
        return self._obs(), float(np.sum(action)), self.t >= self.length, False, {}


class ImageEnv(gym.Env):
    """A uint8 image observation (``[4, 5]``) and a float32 Box ``(2,)`` action; truncates after ``length``."""

    def __init__(self, length: int = 3):
        self.length = length
        self.observation_space = spaces.Box(0, 255, (4, 5), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.base = int(self.np_random.integers(0, 100))
        return np.full((4, 5), self.base, dtype=np.uint8), {}

    def step(self, action):
        assert np.asarray(action).shape == (2,)
        self.t += 1
        obs = np.full((4, 5), self.base + self.t, dtype=np.uint8)
        return obs, float(np.asarray(action).sum()), False, self.t >= self.length, {}


class DiscreteObsEnv(gym.Env):
    """A Discrete(7) observation and a Discrete(3, start=1) action: ``state = (state + action) % 7``;
    terminates when the state is 0, truncates after ``length`` steps."""

    def __init__(self, length: int = 6):
        self.length = length
        self.observation_space = spaces.Discrete(7)
        self.action_space = spaces.Discrete(3, start=1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.state = int(self.np_random.integers(1, 7))
        return self.state, {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        self.state = (self.state + int(action)) % 7
        return self.state, 1.0, self.state == 0, self.t >= self.length, {}


class OptionsEnv(gym.Env):
    """Records the ``options`` of each reset; observes ``[level + t]`` where ``level`` comes from the
    options (0 without); terminates after ``length`` steps."""

    def __init__(self, length: int = 2):
        self.length = length
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.reset_options: list[Any] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.reset_options.append(options)
        self.level = float(options["level"]) if options else 0.0
        self.t = 0
        return np.array([self.level], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.level + self.t], dtype=np.float32), 0.0, self.t >= self.length, False, {}


class SpaceEnv(gym.Env):
    """Any spaces; observations are samples. For testing which spaces the adapters accept."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class NextStepVectorEnv(gym.vector.VectorEnv):
    """A NEXT_STEP vector env over a list of gymnasium envs, written plainly: a finished env is reset by the next
    ``step`` (which then ignores its action and returns reward 0 and no flags), and ``reset(options={"reset_mask":
    mask})`` resets a subset at once (clearing their pending reset), as gymnasium's SyncVectorEnv, ale-py's
    AtariVectorEnv and envpool do. ``seed``: an int seeds env ``k`` with ``seed + k``, a list one seed per env.
    ``partial_rows="reset"`` returns only the reset envs' observations from a partial reset (envpool's way),
    ``"all"`` every env's (gymnasium's and ale-py's). Counts the resets in ``n_resets``."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP, "reset_mask": True}

    def __init__(self, envs: list[gym.Env], partial_rows: str = "all"):
        self.envs = envs
        self.num_envs = len(envs)
        self.partial_rows = partial_rows
        self.single_observation_space = envs[0].observation_space
        self.single_action_space = envs[0].action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._pending = np.zeros(self.num_envs, dtype=bool)
        self._obs: list[Any] = [None] * self.num_envs
        self.n_resets = 0
        self.closed = False

    def reset(self, *, seed=None, options=None):
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        rows = list(range(self.num_envs)) if mask is None else np.flatnonzero(mask).tolist()
        for j, i in enumerate(rows):
            if seed is None:
                s = None
            elif isinstance(seed, (list, tuple, np.ndarray)):
                s = int(seed[j])
            else:
                s = int(seed) + i
            self._obs[i], _ = self.envs[i].reset(seed=s, options=options or None)
            self._pending[i] = False
            self.n_resets += 1
        shown = rows if mask is not None and self.partial_rows == "reset" else range(self.num_envs)
        return np.stack([self._obs[i] for i in shown]), {}

    def step(self, actions):
        rewards = np.zeros(self.num_envs, np.float64)
        term = np.zeros(self.num_envs, bool)
        trunc = np.zeros(self.num_envs, bool)
        for i, env in enumerate(self.envs):
            if self._pending[i]:
                self._obs[i], _ = env.reset()
                self.n_resets += 1
            else:
                self._obs[i], rewards[i], term[i], trunc[i], _ = env.step(actions[i])
        self._pending = term | trunc
        return np.stack(self._obs), rewards, term, trunc, {}

    def close(self, **kwargs):
        self.closed = True
        for e in self.envs:
            e.close()


def fake_envpool_module() -> types.ModuleType:
    """A stand-in ``envpool`` module whose ``make_gymnasium`` returns an envpool-like object over a
    :class:`NextStepVectorEnv` of gymnasium envs (NEXT_STEP autoreset, seeded at construction, single-env spaces,
    ``reset(env_ids)`` resets those envs and returns their observations only)."""

    class Pool:
        def __init__(self, task_id: str, num_envs: int, seed: int, **kwargs):
            self.vec = NextStepVectorEnv([gym.make(task_id, **kwargs) for _ in range(num_envs)], partial_rows="reset")
            self.seed = seed
            self.kwargs = kwargs
            self.observation_space = self.vec.single_observation_space
            self.action_space = self.vec.single_action_space
            self.first = True
            self.closed = False
            self.partial_resets: list[list[int]] = []

        def __len__(self) -> int:
            return self.vec.num_envs

        def reset(self, env_id=None):
            if env_id is not None:
                assert isinstance(env_id, np.ndarray) and env_id.dtype == np.int32, env_id
                self.partial_resets.append(env_id.tolist())
                mask = np.zeros(self.vec.num_envs, dtype=bool)
                mask[env_id] = True
                return self.vec.reset(options={"reset_mask": mask})
            seed, self.first = (self.seed if self.first else None), False
            return self.vec.reset(seed=seed)

        def step(self, action, env_id=None):
            return self.vec.step(action)

        def close(self) -> None:
            self.closed = True
            self.vec.close()

    module = types.ModuleType("envpool")
    module.make_gymnasium = lambda task_id, **kwargs: Pool(task_id, **kwargs)  # type: ignore[attr-defined]
    return module


def random_action(space: gym.Space, n: int, gen: torch.Generator, device) -> DictTensor:
    """``n`` valid actions of ``space`` drawn from ``gen``, as ``DictTensor({"action": ...})`` on ``device``."""
    if isinstance(space, spaces.Discrete):
        a = torch.randint(int(space.start), int(space.start + space.n), (n,), generator=gen)
    elif isinstance(space, spaces.MultiDiscrete):
        nvec = torch.as_tensor(space.nvec).flatten()
        a = (torch.rand((n, len(nvec)), generator=gen) * nvec).long().reshape((n,) + tuple(space.shape))
    else:
        low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
        a = (low + (high - low) * torch.rand((n,) + tuple(space.shape), generator=gen)).to(torch.float32)
    return DictTensor({"action": a.to(device)})


def assert_same(a: DictTensor, b: DictTensor) -> None:
    """The same keys in the same order, and equal tensors (compared on the CPU)."""
    assert list(a.keys()) == list(b.keys())
    for k in a.keys():
        assert torch.equal(a[k].cpu(), b[k].cpu()), k
