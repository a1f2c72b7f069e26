"""The oracle of the torch MinAtar games: minatar's own game, driven by the uniforms the torch game gets.

:class:`FakeRandom` stands in for the reference game's ``random`` (a numpy ``RandomState``): each of its calls
serves the next uniforms of the block the current step (or reset) was given, mapped as the games' modules document
(``rand() -> u``, ``randint(a, b) -> a + floor(u * (b - a))``, ``choice(k) -> floor(u * k)``).
:func:`check_against_reference` steps both side by side and compares frames, rewards and terminations at every step.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from rlstruct.envs.minatar._env import game


class FakeRandom:
    """A ``RandomState`` look-alike serving the uniforms of one block at a time, in call order."""

    def __init__(self):
        self.block = np.zeros(0)
        self.used = 0

    def serve(self, block: np.ndarray) -> None:
        self.block, self.used = block, 0

    def _take(self, size) -> np.ndarray:
        k = 1 if size is None else int(np.prod(size))
        assert self.used + k <= len(self.block), f"the reference drew more than the block's {len(self.block)} values"
        u = self.block[self.used:self.used + k]
        self.used += k
        return u

    def rand(self, *size):
        u = self._take(size or None)
        return float(u[0]) if not size else u.reshape(size)

    def randint(self, low, high=None, size=None):
        if high is None:
            low, high = 0, low
        u = self._take(size)
        v = low + np.floor(u * (high - low)).astype(np.int64)
        return int(v[0]) if size is None else v

    def choice(self, a, size=None):
        k = a if isinstance(a, int) else len(a)
        u = self._take(size)
        i = np.floor(u * k).astype(np.int64)
        if size is None:
            return int(i[0]) if isinstance(a, int) else a[int(i[0])]
        return i if isinstance(a, int) else np.asarray(a)[i]


def check_against_reference(name: str, *, n_envs: int, n_steps: int, seed: int = 0, ramping: bool = True) -> dict:
    """Steps ``n_envs`` reference games and the torch game with the same actions (uniform over the six) and draws
    for ``n_steps`` steps, restarting finished games in both, and asserts the same frame, reward and termination at
    every step. Returns counts (``episodes``, ``reward``) and ``peak`` (the largest value each state tensor took) for
    the caller to check the run covered something."""
    rules, _ = game(name)
    module = importlib.import_module(f"minatar.environments.{rules.name}")
    gen = torch.Generator().manual_seed(seed)
    fakes = [FakeRandom() for _ in range(n_envs)]
    refs = []
    for fake in fakes:
        env = module.Env(ramping=ramping)
        env.random = fake
        refs.append(env)

    def reset_rows(rows: np.ndarray) -> dict[str, torch.Tensor]:
        u = torch.rand(n_envs, rules.n_reset_draws, generator=gen, dtype=torch.float64)
        for i in rows:
            fakes[i].serve(u[i].numpy())
            refs[i].reset()
        return rules.reset(u, ramping)

    def compare(state: dict[str, torch.Tensor], step: int) -> None:
        got = rules.observe(state).numpy()
        want = np.stack([env.state() for env in refs])
        bad = np.flatnonzero((got != want).reshape(n_envs, -1).any(1))
        assert bad.size == 0, f"{name}: frames differ at step {step} in envs {bad.tolist()}"

    state = reset_rows(np.arange(n_envs))
    compare(state, 0)
    episodes, total = 0, 0.0
    peak = {k: v.max() for k, v in state.items()}
    for t in range(1, n_steps + 1):
        action = torch.randint(0, 6, (n_envs,), generator=gen)
        u = torch.rand(n_envs, rules.n_step_draws, generator=gen, dtype=torch.float64)
        want_r, want_t = np.zeros(n_envs, np.float32), np.zeros(n_envs, bool)
        for i, env in enumerate(refs):
            fakes[i].serve(u[i].numpy())
            want_r[i], want_t[i] = env.act(int(action[i]))
        state, reward, terminated = rules.step(state, action, u, ramping)
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        np.testing.assert_array_equal(reward.numpy(), want_r, err_msg=f"{name}: rewards differ at step {t}")
        np.testing.assert_array_equal(terminated.numpy(), want_t, err_msg=f"{name}: terminations differ at step {t}")
        compare(state, t)
        peak = {k: torch.maximum(v, state[k].max()) for k, v in peak.items()}
        total += float(want_r.sum())
        done = np.flatnonzero(want_t)
        if done.size:
            episodes += done.size
            fresh = reset_rows(done)
            mask = torch.from_numpy(want_t)
            state = {k: torch.where(mask.view((-1,) + (1,) * (v.dim() - 1)), fresh[k], v) for k, v in state.items()}
            compare(state, t)
    return {"episodes": episodes, "reward": total, "peak": {k: v.item() for k, v in peak.items()}}


def reference_returns(gym_id: str, n_episodes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random-policy episode returns and lengths of the reference through gymnasium (``gym_id``)."""
    import gymnasium as gym

    import rlstruct.envs  # noqa: F401  (registers the MinAtar ids)

    env = gym.make(gym_id)
    rng = np.random.default_rng(seed)
    returns, lengths = [], []
    env.reset(seed=seed)
    for _ in range(n_episodes):
        env.reset()
        ret, steps, done = 0.0, 0, False
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
            ret, steps, done = ret + r, steps + 1, term or trunc
        returns.append(ret)
        lengths.append(steps)
    env.close()
    return np.array(returns), np.array(lengths)


def torch_returns(name: str, n_envs: int, n_steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random-policy returns and lengths of the episodes that finish within ``n_steps`` steps of ``n_envs`` torch
    envs (auto-reset, the ids' settings)."""
    from rlstruct import DictTensor
    from rlstruct.envs.minatar import MinAtarEnv

    env = MinAtarEnv(name, n_envs, seed=seed, autoreset=True)
    env.reset()
    gen = torch.Generator().manual_seed(seed)
    ret = torch.zeros(n_envs)
    length = torch.zeros(n_envs, dtype=torch.int64)
    returns, lengths = [], []
    for _ in range(n_steps):
        a = torch.randint(0, env.n_actions, (n_envs,), generator=gen)
        (nxt, _), _ = env.step(DictTensor({"action": a}))
        ret += nxt["reward"]
        length += 1
        done = nxt["done"]
        returns.append(ret[done].clone())
        lengths.append(length[done].clone())
        ret[done] = 0.0
        length[done] = 0
    return torch.cat(returns).numpy(), torch.cat(lengths).numpy()


def assert_close_means(a: np.ndarray, b: np.ndarray, what: str, *, n_se: float = 5.0, slack: float = 0.0) -> None:
    """The means of the samples ``a`` and ``b`` agree within ``n_se`` standard errors of their difference plus
    ``slack``."""
    se = float(np.sqrt(a.var() / len(a) + b.var() / len(b)))
    diff = abs(float(a.mean()) - float(b.mean()))
    assert diff <= n_se * se + slack, (
        f"{what}: means {a.mean():.3f} and {b.mean():.3f} differ by {diff:.3f} (se {se:.3f})"
    )
