"""The reference MinAtar games driven by given uniforms, for the oracle tests of the torch games.

A torch game (``GAME`` of a module of ``rlstruct.envs.minatar``) reads a fixed block of uniforms per step and per
reset; the reference game (``minatar.environments.<game>.Env``) calls ``self.random`` a number of times that
depends on its state. :class:`FakeRandom` replaces ``self.random`` and serves the calls from the same block, in call
order (the game modules document which uniform each call gets): ``rand() -> u``,
``randint(a, b) -> a + floor(u * (b - a))``, ``choice(k) -> floor(u * k)`` (``size=k`` takes ``k`` uniforms).

:func:`check_against_reference` (through the env's game table) and :func:`compare_rollouts` (a game module's
``GAME``, from chosen starts) run both side by side on random actions and fail on the first difference of frame,
reward or termination; :func:`reference_returns` and :func:`torch_returns` (through the gymnasium ids and the
env), :func:`random_policy_episodes` and :func:`reference_episodes` give the returns and lengths of random-policy
episodes for the distribution checks, and :func:`assert_graph_capturable` checks a step in a CUDA
graph.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlstruct.envs.minatar._env import game


class FakeRandom:
    """A ``RandomState`` look-alike serving the uniforms of one block at a time, in call order."""

    def __init__(self):
        self.block = np.zeros(0)
        self.used = 0

    def serve(self, block: np.ndarray) -> None:
        """The uniforms ``float64 [k]`` of the next ``act`` or ``reset``."""
        self.block, self.used = np.asarray(block, dtype=np.float64), 0

    def _take(self, size: Any) -> np.ndarray:
        k = 1 if size is None else int(np.prod(size))
        assert self.used + k <= len(self.block), f"the reference drew more than the block's {len(self.block)} values"
        u = self.block[self.used:self.used + k]
        self.used += k
        return u

    def rand(self, *size: int) -> Any:
        """``rand()`` -> ``u``; ``rand(k)`` -> ``k`` uniforms."""
        u = self._take(size or None)
        return float(u[0]) if not size else u.reshape(size)

    def randint(self, low: int, high: int | None = None, size: Any = None) -> Any:
        """``randint(a, b)`` -> ``a + floor(u * (b - a))``; ``randint(b)`` -> ``floor(u * b)``."""
        if high is None:
            low, high = 0, low
        v = low + np.floor(self._take(size) * (high - low)).astype(np.int64)
        return int(v[0]) if size is None else v

    def choice(self, a: Any, size: Any = None) -> Any:
        """``choice(items)`` -> ``items[floor(u * len(items))]`` (``a`` an int stands for ``range(a)``)."""
        k = a if isinstance(a, int) else len(a)
        i = np.floor(self._take(size) * k).astype(np.int64)
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


def _apply(overrides: Mapping[str, Any], ref: Any, state: dict[str, torch.Tensor], where: torch.Tensor) -> None:
    """Sets each override on the reference env and on the torch state's rows ``where``."""
    for name, value in overrides.items():
        ref_value, torch_value = value if isinstance(value, tuple) else (value, value)
        if np.ndim(ref_value):
            ref_value = np.array(ref_value, dtype=np.asarray(getattr(ref, name)).dtype)
        setattr(ref, name, ref_value)
        state[name][where] = torch.as_tensor(torch_value).to(state[name].dtype).to(state[name].device)


def compare_rollouts(game: Any, env_class: type, *, n_envs: int, n_steps: int, actions: Sequence[int],
                     ramping: bool = True, seed: int = 0,
                     overrides: Mapping[str, Any] | None = None, max_episode_steps: int | None = None,
                     action_weights: Sequence[float] | None = None,
                     check: Callable[[Any, dict[str, torch.Tensor], int], None] | None = None,
                     device: str = "cpu") -> dict[str, int]:
    """Steps ``n_envs`` reference envs and the torch game on the same actions and uniforms; asserts every frame,
    reward and termination equal, resetting both on termination (and after ``max_episode_steps``).

    Args:
        game: the torch game (``GAME``).
        env_class: the reference game's ``Env``.
        n_envs: envs stepped side by side.
        n_steps: steps of each.
        actions: the actions drawn from, in the full action set.
        ramping: the reference's ``ramping`` and the game's.
        seed: seeds the actions and the uniforms.
        overrides: attribute values set on both after every reset (a harder start, a nearly full bar, ...): the
            reference's attribute name, which is also the torch state's key, and one value for both, or a tuple
            ``(reference value, torch value)`` where the representations differ.
        max_episode_steps: the time limit, if any.
        action_weights: the probability of each of ``actions`` (uniform if ``None``).
        check: called with ``(reference env, torch state, env index)`` after every step (e.g. capacity checks).
        device: where the torch game runs.

    Returns:
        ``{"episodes": finished episodes, "reward": total reward, "steps": n_envs * n_steps}``.
    """
    rng = np.random.default_rng(seed)
    overrides = dict(overrides or {})
    fakes = [FakeRandom() for _ in range(n_envs)]
    refs = []
    for fake in fakes:
        ref = env_class(ramping=ramping)
        ref.random = fake
        refs.append(ref)

    def reset(state: dict[str, torch.Tensor] | None, done: np.ndarray) -> dict[str, torch.Tensor]:
        u = rng.random((n_envs, game.n_reset_draws))
        fresh = game.reset(torch.from_numpy(u).to(device), ramping)
        mask = torch.from_numpy(done).to(device)
        for i in np.flatnonzero(done):
            fakes[i].serve(u[i])
            refs[i].reset()
            _apply(overrides, refs[i], fresh, mask & (torch.arange(n_envs, device=device) == i))
        if state is None:
            return fresh
        return {k: torch.where(mask.view(-1, *[1] * (v.dim() - 1)), fresh[k], v) for k, v in state.items()}

    state = reset(None, np.ones(n_envs, dtype=bool))
    elapsed = np.zeros(n_envs, dtype=np.int64)
    episodes, total = 0, 0.0
    probs = None if action_weights is None else np.asarray(action_weights, dtype=np.float64) / sum(action_weights)
    for t in range(n_steps):
        action = rng.choice(np.asarray(actions), n_envs, p=probs)
        u = rng.random((n_envs, game.n_step_draws))
        ref_reward, ref_done = np.zeros(n_envs), np.zeros(n_envs, dtype=bool)
        for i, (ref, fake) in enumerate(zip(refs, fakes)):
            fake.serve(u[i])
            ref_reward[i], ref_done[i] = ref.act(int(action[i]))
        state, reward, terminated = game.step(state, torch.from_numpy(action).to(device),
                                              torch.from_numpy(u).to(device), ramping)
        frame, reward, terminated = game.observe(state).cpu().numpy(), reward.cpu(), terminated.cpu()
        for i, ref in enumerate(refs):
            expected = ref.state()
            if not np.array_equal(frame[i], expected):
                diff = np.argwhere(frame[i] != expected)
                raise AssertionError(f"step {t}, env {i} (episode step {elapsed[i] + 1}): frames differ at (y, x, "
                                     f"channel) {diff.tolist()[:8]} (torch {frame[i][tuple(diff[0])]})")
            if check is not None:
                check(ref, state, i)
        np.testing.assert_array_equal(reward.numpy(), ref_reward, err_msg=f"rewards at step {t}")
        np.testing.assert_array_equal(terminated.numpy(), ref_done, err_msg=f"terminations at step {t}")
        total += float(ref_reward.sum())
        episodes += int(ref_done.sum())
        elapsed += 1
        done = ref_done | (elapsed >= (max_episode_steps or n_steps + 1))
        elapsed[done] = 0
        if done.any():
            state = reset(state, done)
    return {"episodes": episodes, "reward": int(total), "steps": n_envs * n_steps}


def random_policy_episodes(game: Any, *, n_envs: int, actions: Sequence[int], ramping: bool = True,
                           max_episode_steps: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths ``[n_envs]`` of the first episode of each of ``n_envs`` envs of the torch game under
    uniformly random ``actions`` (torch's own uniforms), cut at ``max_episode_steps``. (Only first episodes: the
    episodes that end within a fixed number of steps are biased towards short ones.)"""
    gen = torch.Generator().manual_seed(seed)
    actions_t = torch.as_tensor(list(actions))
    state = game.reset(torch.rand(n_envs, game.n_reset_draws, dtype=torch.float64, generator=gen), ramping)
    returns = torch.zeros(n_envs)
    lengths = torch.zeros(n_envs, dtype=torch.int64)
    running = torch.ones(n_envs, dtype=torch.bool)
    for _ in range(max_episode_steps):
        action = actions_t[torch.randint(len(actions_t), (n_envs,), generator=gen)]
        u = torch.rand(n_envs, game.n_step_draws, dtype=torch.float64, generator=gen)
        state, reward, terminated = game.step(state, action, u, ramping)
        returns += reward * running
        lengths += running.long()
        running &= ~terminated
        if not running.any():
            break
    return returns.numpy(), lengths.numpy()


def reference_episodes(env_class: type, *, n_episodes: int, actions: Sequence[int], ramping: bool = True,
                       max_episode_steps: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of ``n_episodes`` episodes of the reference game (its own random numbers) under uniformly
    random ``actions``, cut at ``max_episode_steps``."""
    env = env_class(ramping=ramping)
    env.random = np.random.RandomState(seed)
    rng = np.random.default_rng(seed)
    returns, lengths = np.zeros(n_episodes), np.zeros(n_episodes, dtype=np.int64)
    for e in range(n_episodes):
        env.reset()
        done = False
        while not done and lengths[e] < max_episode_steps:
            reward, done = env.act(int(actions[rng.integers(len(actions))]))
            returns[e] += reward
            lengths[e] += 1
    return returns, lengths


def assert_close_means(a: np.ndarray, b: np.ndarray, what: str, *, n_se: float = 5.0, slack: float = 0.0) -> None:
    """The means of the samples ``a`` and ``b`` agree within ``n_se`` standard errors of their difference plus
    ``slack`` (a loose statistical bound)."""
    se = float(np.sqrt(a.var() / len(a) + b.var() / len(b)))
    diff = abs(float(a.mean()) - float(b.mean()))
    assert diff <= n_se * se + slack, (
        f"{what}: means {a.mean():.3f} and {b.mean():.3f} differ by {diff:.3f} (se {se:.3f})"
    )


def assert_graph_capturable(game: Any, *, actions: Sequence[int], n_envs: int = 64, n_steps: int = 30,
                            ramping: bool = True, seed: int = 0) -> None:
    """Captures one step of the game in a CUDA graph, replays it ``n_steps`` times on fresh actions and uniforms,
    and asserts the same states, rewards and terminations as eager steps (which run with host syncs made errors)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    actions_t = torch.as_tensor(actions, device=dev)
    eager = game.reset(torch.rand(n_envs, game.n_reset_draws, dtype=torch.float64, device=dev, generator=gen), ramping)
    static = {k: v.clone() for k, v in eager.items()}
    action = torch.zeros(n_envs, dtype=torch.int64, device=dev)
    u = torch.zeros(n_envs, game.n_step_draws, dtype=torch.float64, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            game.step(static, action, u, ramping)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, reward, terminated = game.step(static, action, u, ramping)
    for t in range(n_steps):
        action.copy_(actions_t[torch.randint(len(actions), (n_envs,), device=dev, generator=gen)])
        u.copy_(torch.rand(n_envs, game.n_step_draws, dtype=torch.float64, device=dev, generator=gen))
        graph.replay()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager, eager_reward, eager_terminated = game.step(eager, action.clone(), u.clone(), ramping)
            game.observe(eager)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(reward, eager_reward) and torch.equal(terminated, eager_terminated), f"step {t}"
        for k, v in eager.items():
            assert torch.equal(out[k], v), f"step {t}: {k}"
        for k, v in out.items():
            if v is not static[k]:
                static[k].copy_(v)
