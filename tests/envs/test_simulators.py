"""The torch simulators: oracle tests against gymnasium's own envs, RNG, state I/O, both step variants, errors.

The oracle tests put 10,000 states drawn near and across the termination boundaries into one batched
simulator (through ``set_state``) and into gymnasium's env (through ``env.unwrapped.state``), take one step
from each with the same actions, and compare. The VecEnv contract itself (keys, dtypes, aliasing, ...) is
checked for these envs by ``tests/envs/test_env_contract.py``.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import Acrobot, CartPole, MountainCar, Pendulum, TorchVecEnv, VecEnv, _jit, _rng
from rlstruct.envs._array_ops import NumpyOps, TorchOps
from rlstruct.envs._rng import uniform_draws
from rlstruct.errors import BatchSizeError, DeviceMismatchError, EnvStateError, SeedError, SpaceError
from tests.conftest import device_params

pytestmark = pytest.mark.timeout(120)

GYM_IDS = {CartPole: "CartPole-v1", Acrobot: "Acrobot-v1", MountainCar: "MountainCar-v0", Pendulum: "Pendulum-v1"}
SIMS = list(GYM_IDS)
N_ORACLE = 10_000
TOL = 1e-5
HAS_NUMBA = importlib.util.find_spec("numba") is not None


@pytest.fixture(autouse=True)
def compiled_steps_from_the_start(monkeypatch):
    """The simulators here run their compiled kernels from the first step (numba installed), not after
    rlstruct.envs._jit.jit_after() env steps: what these tests compare is the kernels."""
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, "0")
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install rlstruct[fast])")


@pytest.fixture(params=SIMS, ids=[c.__name__ for c in SIMS])
def sim(request) -> type[TorchVecEnv]:
    return request.param


@pytest.fixture(params=device_params())
def device(request) -> str:
    return request.param


# ------------------------------------------------------------------------------------------- helpers
def _mix(rng: np.random.Generator, n: int, *parts: tuple[float, float], signed: bool = False) -> np.ndarray:
    """``n`` values, an equal share drawn uniformly from each ``(low, high)`` range (randomly negated if signed)."""
    chunks = np.array_split(np.arange(n), len(parts))
    out = np.empty(n)
    for idx, (lo, hi) in zip(chunks, parts):
        out[idx] = rng.uniform(lo, hi, len(idx))
    if signed:
        out *= rng.choice([-1.0, 1.0], n)
    return rng.permutation(out)


def oracle_batch(sim: type[TorchVecEnv], n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(states float64 [n, P], actions)``: states inside, near and across the termination boundaries."""
    rng = np.random.default_rng(seed)
    if sim is CartPole:
        x = _mix(rng, n, (0.0, 2.3), (2.3, 2.5), (2.39, 2.41), signed=True)
        theta = _mix(rng, n, (0.0, 0.19), (0.19, 0.23), (0.205, 0.214), signed=True)
        states = np.stack([x, rng.uniform(-3, 3, n), theta, rng.uniform(-3, 3, n)], 1)
        return states, rng.integers(0, 2, n)
    if sim is Acrobot:
        t1 = rng.uniform(-math.pi, math.pi, n)
        # A third of theta2 values put the free end's height -cos(t1) - cos(t1 + t2) right at the threshold 1.
        c = np.clip(-1.0 - np.cos(t1) + rng.normal(0, 0.05, n), -1, 1)
        t2_edge = np.arccos(c) * rng.choice([-1.0, 1.0], n) - t1
        t2_edge = (t2_edge + math.pi) % (2 * math.pi) - math.pi
        t2 = np.where(np.arange(n) % 3 == 0, t2_edge, rng.uniform(-math.pi, math.pi, n))
        # Velocities up to the caps (so that angles wrap past +-pi and the caps clip).
        v1 = rng.uniform(-4 * math.pi, 4 * math.pi, n)
        v2 = rng.uniform(-9 * math.pi, 9 * math.pi, n)
        return np.stack([t1, t2, v1, v2], 1), rng.integers(0, 3, n)
    if sim is MountainCar:
        pos = _mix(rng, n, (-1.2, 0.6), (0.45, 0.55), (-1.2, -1.1))
        pos[: n // 20] = -1.2  # at the left wall
        vel = rng.uniform(-0.07, 0.07, n)
        return np.stack([pos, vel], 1), rng.integers(0, 3, n)
    theta = rng.uniform(-3 * math.pi, 3 * math.pi, n)  # several turns: angle_normalize wraps
    theta[: n // 10] = math.pi * rng.integers(-3, 4, n // 10)  # exactly on the wrapping points
    states = np.stack([theta, rng.uniform(-8, 8, n)], 1)
    return states, rng.uniform(-3, 3, (n, 1)).astype(np.float32)  # beyond the +-2 clip


def gym_step_each(sim: type[TorchVecEnv], states: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
    """One gymnasium step from each state (a plain loop: the reference)."""
    env = gym.make(GYM_IDS[sim]).unwrapped
    env.reset(seed=0)
    out = {"physics": [], "reward": [], "terminated": [], "frame": []}
    for s, a in zip(states, actions):
        env.state = s.copy()
        if sim is CartPole:
            env.steps_beyond_terminated = None
        obs, reward, terminated, truncated, _ = env.step(a if sim is Pendulum else int(a))
        assert not truncated
        out["physics"].append(np.asarray(env.state, dtype=np.float64))
        out["reward"].append(reward)
        out["terminated"].append(terminated)
        out["frame"].append(obs)
    env.close()
    return {k: np.array(v) for k, v in out.items()}


def with_physics(env: TorchVecEnv, physics: torch.Tensor, elapsed: torch.Tensor | None = None) -> None:
    state = env.get_state()
    state.set("physics", physics.to(env.device))
    if elapsed is not None:
        state.set("elapsed_steps", elapsed.to(env.device))
    env.set_state(state)


def random_actions(env: TorchVecEnv, n: int, gen: torch.Generator) -> DictTensor:
    if env.n_actions is not None:
        a = torch.randint(0, env.n_actions, (n,), generator=gen)
    else:
        a = torch.rand((n,) + env.action_shape, generator=gen) * 4 - 2
    return DictTensor({"action": a.to(env.device)})


def rollout(env: TorchVecEnv, n_steps: int, seed: int = 0) -> list[DictTensor]:
    gen = torch.Generator().manual_seed(seed)
    obs, ids = env.reset()
    out = [obs]
    for _ in range(n_steps):
        if ids.shape[0] == 0:
            break
        (obs_next, _), (obs, ids) = env.step(random_actions(env, ids.shape[0], gen))
        out += [obs_next, obs]
    return out


def assert_identical(a: DictTensor, b: DictTensor) -> None:
    assert list(a.keys()) == list(b.keys())
    for k in a.keys():
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].cpu(), b[k].cpu()), k


# ------------------------------------------------------------------------------------------- oracle
def test_one_step_matches_gymnasium_on_10k_boundary_states(sim, device):
    states, actions = oracle_batch(sim, N_ORACLE, seed=list(GYM_IDS).index(sim))
    ref = gym_step_each(sim, states, actions)

    env = sim(N_ORACLE, device=device, seed=0)
    env.reset()
    with_physics(env, torch.from_numpy(states))
    (obs, ids), _ = env.step(DictTensor({"action": torch.from_numpy(actions).to(device)}))
    physics = env.get_state()["physics"].cpu().numpy()

    assert ids.tolist() == list(range(N_ORACLE))
    np.testing.assert_allclose(physics, ref["physics"], rtol=0, atol=TOL)
    np.testing.assert_allclose(obs["reward"].cpu().numpy(), ref["reward"], rtol=0, atol=TOL)
    np.testing.assert_allclose(obs["frame"].cpu().numpy(), ref["frame"], rtol=0, atol=TOL)
    assert np.array_equal(obs["terminated"].cpu().numpy(), ref["terminated"])
    assert not obs["truncated"].any()
    assert torch.equal(obs["done"], obs["terminated"])
    if sim is not Pendulum:  # the batch really straddles the boundary
        assert 0.05 < ref["terminated"].mean() < 0.95


# Relative agreement (errors over max(1, |x|)) of one float32 step with gymnasium's float64 one from the same
# (float32) states. Acrobot's big rk4 step (dt = 0.2 s) at velocities up to the caps amplifies the rounding: its
# worst state of the batch is off by 3e-4 of its velocity, the 99.9th percentile by 2e-5.
FLOAT32_TOL = {CartPole: 1e-6, Acrobot: 1e-3, MountainCar: 1e-6, Pendulum: 1e-6}


def test_float32_physics_matches_gymnasium_within_single_precision(sim, device):
    states, actions = oracle_batch(sim, N_ORACLE, seed=list(GYM_IDS).index(sim))
    states = states.astype(np.float32).astype(np.float64)  # the states a float32 env can hold
    ref = gym_step_each(sim, states, actions)

    env = sim(N_ORACLE, device=device, seed=0, physics_dtype=torch.float32)
    env.reset()
    with_physics(env, torch.from_numpy(states))
    (obs, _), _ = env.step(DictTensor({"action": torch.from_numpy(actions).to(device)}))
    physics = env.get_state()["physics"].cpu()

    assert physics.dtype == torch.float32 and env.physics_dtype == torch.float32
    tol = FLOAT32_TOL[sim]
    for got, want in ((physics.double().numpy(), ref["physics"]), (obs["frame"].cpu().double().numpy(), ref["frame"])):
        assert (np.abs(got - want) / np.maximum(1.0, np.abs(want))).max() < tol
    np.testing.assert_allclose(obs["reward"].cpu().numpy(), ref["reward"], rtol=0, atol=1e-5)
    assert np.array_equal(obs["terminated"].cpu().numpy(), ref["terminated"])


@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_float32_physics_stays_float32_and_starts_from_the_rounded_float64_draws(sim, autoreset):
    """Every kernel keeps the state float32 (no constant widens it), the kernels agree to the bit, and the initial
    states are the float64 env's rounded."""
    kw = dict(seed=4, autoreset=autoreset, max_episode_steps=5)
    numpy_env = force_numpy(sim(16, physics_dtype=torch.float32, **kw))
    assert sim(16, physics_dtype=torch.float32, **kw).kernel == "numpy"  # the compiled kernels are float64
    dense, sparse = sim(16, physics_dtype=torch.float32, **kw), sim(16, physics_dtype=torch.float32, **kw)
    dense._use_kernels("torch")
    sparse._use_kernels("torch", sparse=True)
    reference = rollout(numpy_env, 30)
    assert numpy_env.get_state()["physics"].dtype == torch.float32
    for other in (dense, sparse):
        for x, y in zip(reference, rollout(other, 30), strict=True):
            assert_identical(x, y)
        assert_identical(numpy_env.get_state(), other.get_state())
    wide, narrow = sim(16, **kw), sim(16, physics_dtype=torch.float32, **kw)
    wide.reset()
    narrow.reset()
    assert torch.equal(narrow.get_state()["physics"], wide.get_state()["physics"].float())


def test_truncation_matches_gymnasium_time_limit(sim, device):
    limit, n = 7, 64
    rng = np.random.default_rng(1)
    env = sim(n, device=device, seed=0, max_episode_steps=limit)
    env.reset()
    elapsed = rng.integers(0, limit, n)
    start = env.get_state()["physics"].cpu()  # fresh reset states: far from termination
    with_physics(env, start, torch.from_numpy(elapsed))
    actions = torch.zeros(n, dtype=torch.int64) if sim is not Pendulum else torch.zeros(n, 1)
    (obs, _), _ = env.step(DictTensor({"action": actions.to(device)}))

    reference = gym.make(GYM_IDS[sim], max_episode_steps=limit)
    expected = []
    for s, e in zip(start.numpy(), elapsed):
        reference.reset(seed=0)
        reference.unwrapped.state = s.copy()
        reference._elapsed_steps = int(e)  # the TimeLimit wrapper's counter
        _, _, _, truncated, _ = reference.step(actions[0].numpy() if sim is Pendulum else 0)
        expected.append(truncated)
    assert obs["truncated"].cpu().tolist() == expected
    assert obs["truncated"].cpu().tolist() == (elapsed == limit - 1).tolist()
    assert env.get_state()["elapsed_steps"].cpu().tolist() == (elapsed + 1).tolist()


def test_defaults_and_spaces_match_gymnasium(sim):
    env = sim(2)
    reference = gym.make(GYM_IDS[sim])
    assert isinstance(env, VecEnv) and env.autoreset is False and env.device == torch.device("cpu")
    assert env.max_episode_steps == reference.spec.max_episode_steps
    assert env.action_space == reference.action_space
    assert env.observation_space == reference.observation_space


def test_reset_states_follow_gymnasium_ranges(sim):
    env = sim(20_000, seed=3)
    env.reset()
    physics = env.get_state()["physics"].numpy()
    low, high = np.array(env.reset_low), np.array(env.reset_high)
    draws = physics[:, : len(low)]
    assert ((draws > low) & (draws < high)).all()
    u = np.sort((draws - low) / (high - low), axis=0)
    ks = np.abs(u - (np.arange(1, len(u) + 1) / len(u))[:, None]).max()
    assert ks < 0.015  # Kolmogorov-Smirnov statistic against the uniform law (p ~ 2e-4 at this size)
    if sim is MountainCar:
        assert (physics[:, 1] == 0).all()
    if sim is Acrobot:  # gymnasium casts its reset state to float32
        assert np.array_equal(physics, physics.astype(np.float32).astype(np.float64))
    frames = env.reset()[0]["frame"].numpy()
    assert all(env.observation_space.contains(f) for f in frames[:100])


# ------------------------------------------------------------------------------------------- RNG
def test_same_seed_same_trajectories_bitwise(sim, device):
    a = rollout(sim(6, device=device, seed=11, autoreset=True, max_episode_steps=9), 40)
    b = rollout(sim(6, device=device, seed=11, autoreset=True, max_episode_steps=9), 40)
    for x, y in zip(a, b):
        assert_identical(x, y)


def test_different_seeds_and_envs_draw_differently(sim):
    f0 = sim(8, seed=0).reset()[0]["frame"]
    f1 = sim(8, seed=1).reset()[0]["frame"]
    assert not torch.equal(f0, f1)
    assert len({tuple(r.tolist()) for r in f0}) == 8


def test_env_k_does_not_depend_on_n_envs(sim):
    small = sim(4, seed=5, autoreset=True, max_episode_steps=6)
    large = sim(8, seed=5, autoreset=True, max_episode_steps=6)
    obs_s, _ = small.reset()
    obs_l, _ = large.reset()
    assert_identical(obs_s, obs_l.slice(0, 4))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # several episodes each: the fresh draws agree too
        action = random_actions(large, 8, gen)
        (nl, _), (rl, _) = large.step(action)
        (ns, _), (rs, _) = small.step(DictTensor({"action": action["action"][:4]}))
        assert_identical(ns, nl.slice(0, 4))
        assert_identical(rs, rl.slice(0, 4))
    assert (small.get_state()["episode"] >= 3).all()


def test_reset_draws_depend_only_on_seed_env_and_episode(sim):
    env = sim(5, seed=2)
    first = env.reset()[0]["frame"]
    second = env.reset()[0]["frame"]
    assert not torch.equal(first, second)
    # Episode 1's draws, computed directly from (rng_key, episode) on a fresh env of another size.
    other = sim(3, seed=2)
    draws = uniform_draws(other._state.rng_key, torch.ones(3, dtype=torch.int64),
                          other._arrays(TorchOps))
    assert torch.equal(other._frame(TorchOps, other._initial_physics(TorchOps, draws)), second[:3])


def force_numpy(env: TorchVecEnv) -> TorchVecEnv:
    """``env`` on the numpy kernels (what the CPU runs without numba)."""
    env._use_kernels("numpy")  # and step_into on them (step and a copy)
    return env


@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_every_step_kernel_gives_the_same_bits(sim, autoreset):
    """On the CPU the default step is one compiled call (numba installed and compiled kernels for this simulator)
    or the kernels on numpy views, both with sparse reset draws; accelerators run the same kernels on torch
    tensors with dense draws (and a fused CPU step the torch kernels with sparse draws)."""
    kw = dict(seed=4, autoreset=autoreset, max_episode_steps=5)
    default = sim(16, **kw)
    assert default.kernel == ("jit" if _jit.jit_kernels() is not None and sim._jit_name is not None else "numpy")
    dense, sparse = sim(16, **kw), sim(16, **kw)
    dense._use_kernels("torch")
    sparse._use_kernels("torch", sparse=True)
    numpy_env = force_numpy(sim(16, **kw))
    reference = rollout(numpy_env, 30)
    for other in (default, dense, sparse):
        for x, y in zip(reference, rollout(other, 30), strict=True):
            assert_identical(x, y)
        assert_identical(numpy_env.get_state(), other.get_state())


@needs_numba
@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_compiled_step_gives_the_numpy_bits_across_the_boundaries(autoreset, monkeypatch):
    """10,000 CartPoles on and across the termination boundaries, a third of them truncated on the first step: the
    compiled step and the numpy kernels agree bit for bit, over several steps with resets (auto-reset) or envs
    dropping out (episodic)."""
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "1")
    states, actions = oracle_batch(CartPole, N_ORACLE, seed=7)
    elapsed = torch.from_numpy(np.arange(N_ORACLE) % 3)
    envs = []
    for env in (CartPole(N_ORACLE, seed=1, autoreset=autoreset, max_episode_steps=3),
                force_numpy(CartPole(N_ORACLE, seed=1, autoreset=autoreset, max_episode_steps=3))):
        env.reset()
        with_physics(env, torch.from_numpy(states), elapsed)
        envs.append(env)
    assert envs[0].kernel == "jit"
    gen = torch.Generator().manual_seed(0)
    action, ids = torch.from_numpy(actions), torch.arange(N_ORACLE)
    for t in range(4):
        (next_a, ids_a), (run_a, ids) = envs[0].step(DictTensor({"action": action}))
        (next_b, ids_b), (run_b, ids_r) = envs[1].step(DictTensor({"action": action}))
        assert_identical(next_a, next_b)
        assert_identical(run_a, run_b)
        assert torch.equal(ids_a, ids_b) and torch.equal(ids, ids_r)
        if t == 0:  # the first step really straddles both boundaries
            assert 0.05 < float(next_a["terminated"].float().mean()) < 0.95
            assert 0.2 < float(next_a["truncated"].float().mean()) < 0.5
        if ids.shape[0] == 0:
            break
        action = torch.randint(0, 2, ids.shape, generator=gen)
    assert_identical(envs[0].get_state(), envs[1].get_state())


@needs_numba
def test_compiled_step_into_writes_the_numpy_bits_and_keeps_no_reference(monkeypatch):
    """The compiled kernel writing into given tensors (what a batcher's buffer gets): the numpy kernels' bits across
    the termination and truncation boundaries; the env's state owes nothing to the destinations, which are reused
    at every step and then scribbled over."""
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "1")
    states, actions = oracle_batch(CartPole, N_ORACLE, seed=8)
    elapsed = torch.from_numpy(np.arange(N_ORACLE) % 3)
    into, ref = CartPole(N_ORACLE, seed=2, autoreset=True, max_episode_steps=3), force_numpy(
        CartPole(N_ORACLE, seed=2, autoreset=True, max_episode_steps=3))
    for env in (into, ref):
        obs, _ = env.reset()
        with_physics(env, torch.from_numpy(states), elapsed)
    assert into.writes_in_place() and not ref.writes_in_place()
    nxt = DictTensor({k: torch.empty_like(v) for k, v in obs.items()})
    run = DictTensor({k: torch.empty_like(v) for k, v in obs.items()})
    gen = torch.Generator().manual_seed(0)
    action = torch.from_numpy(actions)
    for _ in range(4):
        into.step_into(DictTensor({"action": action}), nxt, run)
        (next_b, _), (run_b, _) = ref.step(DictTensor({"action": action}))
        assert_identical(nxt, next_b)
        assert_identical(run, run_b)
        for v in (*nxt.values(), *run.values()):
            v.zero_()
        action = torch.randint(0, 2, (N_ORACLE,), generator=gen)
    assert_identical(into.get_state(), ref.get_state())
    (next_a, _), (run_a, _) = into.step(DictTensor({"action": action}))  # step after step_into continues exactly
    (next_b, _), (run_b, _) = ref.step(DictTensor({"action": action}))
    assert_identical(next_a, next_b)
    assert_identical(run_a, run_b)


def test_rlstruct_jit_0_selects_the_numpy_kernels(monkeypatch):
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "0")
    assert CartPole(4).kernel == "numpy" and _jit.jit_kernels() is None
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "1")
    assert CartPole(4).kernel == ("jit" if HAS_NUMBA else "numpy")
    assert Acrobot(4).kernel == "numpy"  # no compiled kernels for this simulator
    assert CartPole(4, compile=True).kernel == "compiled"


@needs_numba
@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_the_compiled_kernels_take_over_after_jit_after_env_steps_without_a_change_of_bits(autoreset, monkeypatch):
    """By default a simulator starts on its numpy kernels (no numba load for a short run) and moves to the compiled
    ones once it has stepped RLSTRUCT_JIT_AFTER env steps: the same trajectory as the numpy kernels throughout."""
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, "40")
    env = CartPole(8, seed=3, autoreset=autoreset, max_episode_steps=30)
    reference = force_numpy(CartPole(8, seed=3, autoreset=autoreset, max_episode_steps=30))
    assert env.kernel == "numpy"
    kinds = []
    env.reset()
    reference.reset()
    gen = torch.Generator().manual_seed(0)
    for _ in range(12):
        n = env._ids.shape[0]
        if n == 0:
            break
        action = DictTensor({"action": torch.randint(0, 2, (n,), generator=gen)})
        for x, y in zip(env.step(action), reference.step(action), strict=True):
            assert_identical(x[0], y[0])
        kinds.append(env.kernel)
    assert kinds[:4] == ["numpy"] * 4 and kinds[5:] == ["jit"] * (len(kinds) - 5)  # 8 rows a step: the 5th is 40
    assert_identical(env.get_state(), reference.get_state())


@needs_numba  # the setting is read where the compiled steps are built
@pytest.mark.parametrize("value", ["-1", "soon"])
def test_a_bad_rlstruct_jit_after_is_named(value, monkeypatch):
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, value)
    with pytest.raises(ValueError, match=f"RLSTRUCT_JIT_AFTER must be an integer >= 0 .*got '{value}'; unset it"):
        CartPole(4)


def test_without_numba_the_numpy_kernels_run(monkeypatch):
    monkeypatch.setattr(_jit, "_loaded", {})
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    env = CartPole(8, seed=2, autoreset=True, max_episode_steps=4)
    assert _jit.jit_kernels() is None and env.kernel == "numpy"
    reference = force_numpy(CartPole(8, seed=2, autoreset=True, max_episode_steps=4))
    for x, y in zip(rollout(env, 12), rollout(reference, 12), strict=True):
        assert_identical(x, y)


def test_draws_are_the_same_bits_in_numpy_and_torch(sim):
    env = sim(1000, seed=12345)
    episode = torch.arange(1000, dtype=torch.int64) * 7919 % 2**40  # past 2**32: the counter wraps
    key = env._state.rng_key
    from_torch = uniform_draws(key, episode, env._arrays(TorchOps))
    from_numpy = uniform_draws(key.numpy().astype(np.uint32), episode.numpy(), env._arrays(NumpyOps))
    assert from_numpy.dtype == np.float64 and torch.equal(from_torch, torch.from_numpy(from_numpy))
    fresh_t = env._initial_physics(TorchOps, from_torch)
    fresh_n = env._initial_physics(NumpyOps, from_numpy)
    assert torch.equal(fresh_t, torch.from_numpy(fresh_n))
    assert torch.equal(env._frame(TorchOps, fresh_t), torch.from_numpy(env._frame(NumpyOps, fresh_n)))


@needs_numba
def test_the_compiled_rng_is_the_rng_modules():
    """The compiled kernels' hash and counter are :mod:`rlstruct.envs._rng`'s functions, compiled: the same bits as
    the int64 torch and the uint32 numpy versions."""
    from rlstruct.envs import _jit_kernels

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(0, 2**32, 500), [0, 1, 2**31 - 1, 2**31, 2**32 - 1]]).astype(np.int64)
    episode = rng.integers(0, 2**40, x.shape[0]).astype(np.int64)
    salt = rng.integers(0, 2**32, x.shape[0]).astype(np.int64)
    hashed = _rng.mix32(torch.from_numpy(x)).numpy()
    assert np.array_equal(_rng.mix32(x.astype(np.uint32), True), hashed.astype(np.uint32))
    assert [_jit_kernels.mix32(v) for v in x] == hashed.tolist()
    counters = _rng.counter(torch.from_numpy(x), torch.from_numpy(episode), torch.from_numpy(salt)).numpy()
    assert [_jit_kernels.counter(*v) for v in zip(x, episode, salt)] == counters.tolist()
    wrapped = _rng.counter(x.astype(np.uint32), episode.astype(np.uint32), salt.astype(np.uint32), True)
    assert np.array_equal(wrapped, counters.astype(np.uint32))


# ------------------------------------------------------------------------------------------- state
@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_get_set_state_continues_exactly(sim, device, autoreset):
    source = sim(6, device=device, seed=21, autoreset=autoreset, max_episode_steps=12)
    gen = torch.Generator().manual_seed(0)
    obs, ids = source.reset()
    for _ in range(8):
        (_, _), (obs, ids) = source.step(random_actions(source, ids.shape[0], gen))
    state = source.get_state()
    assert list(state.keys()) == ["physics", "elapsed_steps", "episode", "rng_key", "last_action", "running"]
    assert state["physics"].shape == (6, len(sim.physics_names)) and state["physics"].dtype == torch.float64
    assert torch.equal(state["running"].nonzero().squeeze(1), ids)
    target = sim(6, device=device, seed=999, autoreset=autoreset, max_episode_steps=12)
    target.set_state(state.to("cpu"))  # a state taken on (or moved to) another device
    for _ in range(30):
        if ids.shape[0] == 0:
            break
        action = random_actions(source, ids.shape[0], gen)
        (a_next, a_ids), (a_run, ids) = source.step(action)
        (b_next, b_ids), (b_run, b_run_ids) = target.step(action)
        assert_identical(a_next, b_next)
        assert_identical(a_run, b_run)
        assert torch.equal(a_ids, b_ids) and torch.equal(ids, b_run_ids)
    assert_identical(source.get_state(), target.get_state())


@pytest.mark.cuda
def test_gpu_envs_seeded_from_a_cpu_state():
    cpu = CartPole(32, seed=3, autoreset=True, max_episode_steps=10)
    gpu = CartPole(32, device="cuda", seed=3, autoreset=True, max_episode_steps=10)
    obs_c, _ = cpu.reset()
    obs_g, _ = gpu.reset()
    assert_identical(obs_c, obs_g)  # the reset draws are the same bits on every device
    gpu.set_state(cpu.get_state())
    gen = torch.Generator().manual_seed(0)
    for _ in range(25):
        a = random_actions(cpu, 32, gen)
        (nc, _), (rc, _) = cpu.step(a)
        (ng, _), (rg, _) = gpu.step(a.to("cuda"))
        torch.testing.assert_close(ng["frame"].cpu(), nc["frame"], rtol=0, atol=1e-5)
        torch.testing.assert_close(rg["frame"].cpu(), rc["frame"], rtol=0, atol=1e-5)
    state_c, state_g = cpu.get_state(), gpu.get_state()
    assert torch.equal(state_c["episode"], state_g["episode"].cpu())
    assert torch.equal(state_c["rng_key"], state_g["rng_key"].cpu())


KERNELS = ["jit", "numpy", "torch"]


def _with_kernels(env: TorchVecEnv, kind: str) -> TorchVecEnv:
    if kind == "jit" and (_jit.jit_kernels() is None or env._jit_name is None):
        pytest.skip("no compiled kernels for this simulator here")
    if kind != "torch" and env.device.type != "cpu":
        pytest.skip("host kernels run on the CPU")
    env._use_kernels(kind)
    return env


@pytest.mark.parametrize("kind", KERNELS)
def test_set_graph_state_rebinds_the_state_and_keeps_the_trajectory(sim, device, kind):
    """graph_state is a fresh dict of the env's own tensors; after set_graph_state(clones) the step reads the clones
    and rebinds the env to new tensors, and the trajectory is bit for bit that of an env never handed a state."""
    kw = dict(device=device, seed=6, autoreset=True, max_episode_steps=7)
    env, twin = _with_kernels(sim(5, **kw), kind), _with_kernels(sim(5, **kw), kind)
    env.reset(), twin.reset()
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        state = env.graph_state()
        assert list(state) == ["physics", "elapsed_steps", "episode", "rng_key", "last_action"]
        assert state["physics"].shape == (len(sim.physics_names), 5) and state is not env.graph_state()
        assert all(v is w for v, w in zip(state.values(), env.graph_state().values()))  # no copies
        clones = {k: v.clone() for k, v in state.items()}
        env.set_graph_state(clones)
        assert all(v is clones[k] for k, v in env.graph_state().items())
        action = random_actions(env, 5, gen)
        (a_next, _), (a_run, _) = env.step(action)
        (b_next, _), (b_run, _) = twin.step(action)
        assert_identical(a_next, b_next)
        assert_identical(a_run, b_run)
        assert env.graph_state()["physics"] is not clones["physics"]
    assert_identical(env.get_state(), twin.get_state())


@pytest.mark.parametrize("kind", KERNELS)
def test_the_step_reads_the_tensors_set_graph_state_gave(sim, kind):
    """What a CUDA-graph replay relies on: the state written in place into the tensors handed over (the batcher's
    copy at the end of a captured loop) is the state the next step starts from."""
    kw = dict(autoreset=True, max_episode_steps=6)
    a, b = _with_kernels(sim(4, seed=1, **kw), kind), _with_kernels(sim(4, seed=2, **kw), kind)
    gen = torch.Generator().manual_seed(0)
    for env in (a, b):
        env.reset()
        for _ in range(3):
            env.step(random_actions(env, 4, gen))
    static = {k: v.clone() for k, v in a.graph_state().items()}
    a.set_graph_state(static)
    for k, v in b.graph_state().items():
        static[k].copy_(v)
    for _ in range(10):
        action = random_actions(a, 4, gen)
        (a_next, _), (a_run, _) = a.step(action)
        (b_next, _), (b_run, _) = b.step(action)
        assert_identical(a_next, b_next)
        assert_identical(a_run, b_run)


def test_set_graph_state_errors():
    env = CartPole(3, autoreset=True)
    state = env.graph_state()
    with pytest.raises(SpaceError, match=r"must be a dict with the keys \['elapsed_steps'.*got \['physics'\]"):
        env.set_graph_state({"physics": state["physics"]})
    with pytest.raises(SpaceError, match=r"state\['episode'\] must be torch.int64 \[3\], got torch.int32 \[3\]"):
        env.set_graph_state({**state, "episode": state["episode"].int()})
    with pytest.raises(SpaceError, match=r"state\['physics'\] must be torch.float64 \[4, 3\], got .* \[3, 4\]"):
        env.set_graph_state({**state, "physics": state["physics"].t()})
    with pytest.raises(DeviceMismatchError, match=r"state\['rng_key'\] must be on cpu, got meta"):
        env.set_graph_state({**state, "rng_key": state["rng_key"].to("meta")})
    with pytest.raises(EnvStateError, match="needs an auto-reset env.*build it with autoreset=True"):
        CartPole(3).set_graph_state(state)
    env.set_graph_state(state)  # still usable


def _host_copy(x):
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


def _flat(x) -> list[torch.Tensor]:
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat(v)]
    return [] if x is None else [torch.as_tensor(x)]


@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
@pytest.mark.parametrize("kind", KERNELS)
def test_kernels_are_pure_functions_of_the_state_and_action_given(kind, autoreset):
    """A kernel reads the state and the action it is handed, writes into neither, and touches no env attribute:
    called twice on the same arguments it gives the same bits, and the env it came from is where it was."""
    env = _with_kernels(CartPole(512, seed=3, autoreset=autoreset, max_episode_steps=2), kind)
    states, _ = oracle_batch(CartPole, 512, seed=5)
    env.reset()
    with_physics(env, torch.from_numpy(states), torch.from_numpy(np.arange(512) % 2))
    before = env.get_state()
    kernel = env._stepper.autoreset_kernel if autoreset else env._stepper.episodic_kernel
    state = env._host.of(env._state) if kind != "torch" else env._state
    frozen = [_host_copy(x) for x in state]
    action = np.arange(512) % 2 if kind != "torch" else torch.arange(512) % 2
    first, second = kernel(state, action), kernel(state, action)
    assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(state, frozen))
    assert bool(torch.as_tensor(first[1].done).any())  # across the boundaries: restarts and truncations
    for x, y in zip(_flat(first), _flat(second), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert_identical(before, env.get_state())


def test_kernel_modules_do_not_import_the_env_class():
    """The RNG, the array namespaces and the kernels sit below the env class: no import cycle through it."""
    import ast
    from pathlib import Path

    import rlstruct.envs

    root = Path(rlstruct.envs.__file__).parent
    for name in ("_rng", "_array_ops", "_sim_kernels", "_jit", "_jit_kernels", "_steppers", "_sim_io"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = [
            (node.module or "") + "." + alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        ]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        assert not [m for m in imported if "_torch_env" in m or "classic_control" in m], name


# ------------------------------------------------------------------------------------------- step variants
def test_autoreset_emits_terminal_then_fresh_observation(device):
    env = CartPole(4, device=device, seed=0, autoreset=True)
    obs, _ = env.reset()
    push = torch.ones(4, dtype=torch.int64, device=device)
    for t in range(200):
        before = env.get_state()
        (obs_next, ids_next), (obs_run, ids_run) = env.step(DictTensor({"action": push}))
        if obs_next["done"].any():
            break
    done = obs_next["done"]
    assert ids_next is ids_run and ids_next.tolist() == [0, 1, 2, 3]
    # The terminal observation is past a threshold, the fresh one inside gymnasium's reset box.
    terminal = obs_next["frame"][done].cpu()
    assert ((terminal[:, 0].abs() > 2.4) | (terminal[:, 2].abs() > CartPole.THETA_THRESHOLD_RADIANS)).all()
    assert obs_next["terminated"][done].all() and obs_next["reward"][done].eq(1).all()
    assert (obs_run["frame"][done].abs() < 0.05).all()
    assert torch.equal(obs_run["initial_state"], done) and not obs_next["initial_state"].any()
    assert not (obs_run["done"] | obs_run["terminated"] | obs_run["truncated"]).any()
    assert not obs_run["reward"][done].any() and not obs_run["last_action"][done].any()
    assert_identical(obs_run.index(~done), obs_next.index(~done))
    after = env.get_state()
    assert torch.equal(after["episode"], before["episode"] + done.long())
    assert not after["elapsed_steps"][done].any()
    assert (after["elapsed_steps"][~done] == t + 1).all()


def test_autoreset_truncation(device):
    env = Pendulum(3, device=device, seed=0, autoreset=True, max_episode_steps=4)
    env.reset()
    for t in range(1, 9):
        (obs_next, _), (obs_run, _) = env.step(DictTensor({"action": torch.zeros(3, 1, device=device)}))
        expect = t % 4 == 0
        assert obs_next["truncated"].tolist() == [expect] * 3 and not obs_next["terminated"].any()
        assert obs_run["initial_state"].tolist() == [expect] * 3
    assert env.get_state()["episode"].tolist() == [2, 2, 2]


def test_episodic_envs_drop_out_in_order(device):
    env = MountainCar(6, device=device, seed=0, max_episode_steps=200)
    env.reset()
    state = env.get_state()
    # Envs 1 and 4 one step from the goal, env 3 one step from its time limit.
    physics = state["physics"].clone()
    physics[[1, 4]] = torch.tensor([0.49, 0.05], dtype=torch.float64, device=device)
    state.set("physics", physics)
    state.set("elapsed_steps", torch.tensor([0, 0, 0, 199, 0, 0], device=device))
    env.set_state(state)
    right = torch.full((6,), 2, device=device)
    (obs_next, ids), (obs_run, ids_run) = env.step(DictTensor({"action": right}))
    assert obs_next["terminated"].tolist() == [False, True, False, False, True, False]
    assert obs_next["truncated"].tolist() == [False, False, False, True, False, False]
    assert ids_run.tolist() == [0, 2, 5] and torch.equal(ids_run, ids[~obs_next["done"]])
    assert_identical(obs_run, obs_next.index(~obs_next["done"]))
    assert not obs_run["initial_state"].any()
    with pytest.raises(BatchSizeError, match="one row per running env"):
        env.step(DictTensor({"action": right}))
    (obs_next2, ids2), _ = env.step(DictTensor({"action": right[:3]}))
    assert ids2.tolist() == [0, 2, 5] and obs_next2.n_elems() == 3
    finished = env.get_state()
    assert finished["running"].tolist() == [True, False, True, False, False, True]
    # Finished envs keep their terminal state.
    assert torch.equal(finished["physics"][[1, 3, 4]].float(), obs_next["frame"][[1, 3, 4]])


def test_episodic_raises_once_every_env_has_finished():
    env = CartPole(3, seed=0, max_episode_steps=2)
    obs, ids = env.reset()
    for _ in range(2):
        (_, _), (obs, ids) = env.step(DictTensor({"action": torch.zeros(ids.shape[0], dtype=torch.int64)}))
    assert ids.shape == (0,) and obs.n_elems() == 0
    with pytest.raises(EnvStateError, match="call env.reset"):
        env.step(DictTensor({"action": torch.zeros(0, dtype=torch.int64)}))
    assert env.reset()[1].tolist() == [0, 1, 2]


def test_pendulum_last_action_is_the_given_torque():
    env = Pendulum(2, seed=0)
    env.reset()
    a = torch.tensor([[3.5], [-0.25]], dtype=torch.float64)
    (obs, _), _ = env.step(DictTensor({"action": a}))
    assert obs["last_action"].dtype == torch.float32 and obs["last_action"].tolist() == [[3.5], [-0.25]]
    (flat, _), _ = env.step(DictTensor({"action": a[:, 0]}))  # [B] is taken as [B, 1]
    assert flat["last_action"].shape == (2, 1)



@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
def test_actions_numpy_cannot_read_step_like_float32_ones(autoreset):
    # bfloat16 has no numpy dtype and a negative-bit view refuses .numpy(): the copy falls back to torch.
    torques = torch.tensor([[1.5], [-0.25]])
    variants = [torques.to(torch.bfloat16), torch._neg_view(-torques), torques.expand(2, 1)]
    reference = Pendulum(2, seed=3, autoreset=autoreset)
    reference.reset()
    (expected, _), _ = reference.step(DictTensor({"action": torques}))
    for a in variants:
        env = Pendulum(2, seed=3, autoreset=autoreset)
        env.reset()
        (obs, _), _ = env.step(DictTensor({"action": a}))
        assert torch.equal(obs["last_action"], torques) and torch.equal(obs["frame"], expected["frame"])
    a = torques.clone()
    (obs, _), _ = env.step(DictTensor({"action": a}))
    a.fill_(0.0)  # the env keeps its own copy of the action
    assert torch.equal(obs["last_action"], torques)

# ------------------------------------------------------------------------------------------- errors
def test_action_errors(sim):
    env = sim(3)
    with pytest.raises(EnvStateError, match="before reset"):
        env.step(DictTensor({"action": torch.zeros(3, dtype=torch.int64)}))
    env.reset()
    if sim is Pendulum:
        with pytest.raises(SpaceError, match=r"floating tensor of shape \[3, 1\].*got torch.int64"):
            env.step(DictTensor({"action": torch.zeros(3, 1, dtype=torch.int64)}))
        with pytest.raises(SpaceError, match=r"got torch.float32 \[3, 2\]"):
            env.step(DictTensor({"action": torch.zeros(3, 2)}))
    else:
        with pytest.raises(SpaceError, match=r"integer tensor of shape \[3\].*got torch.float32 \[3\].*randint"):
            env.step(DictTensor({"action": torch.zeros(3)}))
        with pytest.raises(SpaceError, match=r"got torch.int64 \[3, 1\]"):
            env.step(DictTensor({"action": torch.zeros(3, 1, dtype=torch.int64)}))
        with pytest.raises(SpaceError, match="got torch.bool"):
            env.step(DictTensor({"action": torch.zeros(3, dtype=torch.bool)}))
        env.step(DictTensor({"action": torch.zeros(3, dtype=torch.uint8)}))  # any integer dtype
    with pytest.raises(BatchSizeError, match=r"one row per running env \(3 rows"):
        env.step(DictTensor({"action": torch.zeros(4, dtype=torch.int64)}))
    with pytest.raises(DeviceMismatchError, match=r"must be on cpu, got meta; move it with .to\('cpu'\)"):
        env.step(DictTensor({"action": torch.zeros(3, dtype=torch.int64, device="meta")}))
    with pytest.raises(KeyError, match="'action'"):
        env.step(DictTensor({"act": torch.zeros(3, dtype=torch.int64)}))
    with pytest.raises(TypeError, match="wrap it"):
        env.step(torch.zeros(3, dtype=torch.int64))


def test_env_info_errors():
    env = CartPole(3)
    with pytest.raises(BatchSizeError, match="env_info must have n_envs=3 rows .*got 2"):
        env.reset(DictTensor({"x": torch.zeros(2)}))
    with pytest.raises(DeviceMismatchError, match="env_info must be on cpu, got meta"):
        env.reset(DictTensor({"x": torch.zeros(3, device="meta")}))
    with pytest.raises(TypeError, match="env_info must be a DictTensor"):
        env.reset({"x": torch.zeros(3)})
    assert env.reset(DictTensor({"x": torch.zeros(3)}))[1].tolist() == [0, 1, 2]


def test_state_errors():
    env = CartPole(3, autoreset=True)
    with pytest.raises(EnvStateError, match="get_state was called before reset"):
        env.get_state()
    env.reset()
    good = env.get_state()
    with pytest.raises(TypeError, match="DictTensor from get_state"):
        env.set_state(dict(good.items()))
    with pytest.raises(SpaceError, match=r"lacks keys \['rng_key'\]"):
        env.set_state(DictTensor({k: v for k, v in good.items() if k != "rng_key"}))
    with pytest.raises(BatchSizeError, match="state has 2 rows, this env has n_envs=3"):
        env.set_state(good.slice(0, 2))
    bad = good.clone()
    bad.set("physics", torch.zeros(3, 2, dtype=torch.float64))
    with pytest.raises(SpaceError, match=r"state\['physics'\] must be floating \[3, 4\], got torch.float64 \[3, 2\]"):
        env.set_state(bad)
    bad = good.clone()
    bad.set("elapsed_steps", torch.zeros(3))
    with pytest.raises(SpaceError, match=r"state\['elapsed_steps'\] must be integer"):
        env.set_state(bad)
    bad = good.clone()
    bad.set("running", torch.tensor([True, False, True]))
    with pytest.raises(SpaceError, match="auto-resets"):
        env.set_state(bad)
    bad = good.clone()
    bad.set("rng_key", torch.full((3,), -1))
    with pytest.raises(SpaceError, match=r"rng_key'\] must be in \[0, 2\*\*32\)"):
        env.set_state(bad)
    env.set_state(good)  # still usable
    env.close()
    env.close()  # idempotent
    for call in (env.reset, env.get_state, lambda: env.step(DictTensor({"action": torch.zeros(3, dtype=torch.int64)}))):
        with pytest.raises(EnvStateError, match="CartPole is closed; build a new one"):
            call()


def test_constructor_errors():
    with pytest.raises(ValueError, match="n_envs must be a positive int, got 0"):
        CartPole(0)
    with pytest.raises(ValueError, match="max_episode_steps must be a positive int or None, got 0"):
        Acrobot(2, max_episode_steps=0)
    with pytest.raises(ValueError, match="physics_dtype must be torch.float64 or torch.float32, got torch.float16"):
        Pendulum(2, physics_dtype=torch.float16)
    with pytest.raises(SeedError, match=r"seed must be an int in \[0, 2\*\*31\), got float 1.5"):
        MountainCar(2, seed=1.5)
    with pytest.raises(SeedError, match=r"got -1; pass a non-negative int"):
        CartPole(2, seed=-1)
    with pytest.raises(SeedError, match=r"got 2147483648"):
        CartPole(2, seed=2**31)
    assert CartPole(2, seed=2**31 - 1).seed == 2**31 - 1
    env = Pendulum(2, max_episode_steps=None)
    env.reset()
    env.step(DictTensor({"action": torch.zeros(2)}))
    assert "Pendulum(n_envs=2, device=cpu, seed=0, episodic)" == repr(env)


# ------------------------------------------------------------------------------------------- fused step
def assert_close_trajectories(a: list[DictTensor], b: list[DictTensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x.keys()) == list(y.keys())
        for k in x.keys():
            if x[k].is_floating_point():
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=1e-9)
            else:
                assert torch.equal(x[k], y[k]), k


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compiled_steps_match_eager():
    """compile=True: the fused dense step (small CPU batches, and accelerators), the fused physics with
    sparse draws (large CPU batches) and the episodic step."""
    kw = dict(seed=8, max_episode_steps=30)
    eager = rollout(CartPole(64, autoreset=True, **kw), 60)
    dense = CartPole(64, autoreset=True, compile=True, **kw)
    assert dense.kernel == "compiled" and not dense._stepper.sparse_draws
    assert_close_trajectories(eager, rollout(dense, 60))
    sparse = CartPole(64, autoreset=True, compile=True, **kw)
    sparse._use_kernels("compiled", sparse=True)  # what N > 2048 envs run, at a size that compiles fast
    assert_close_trajectories(eager, rollout(sparse, 60))
    episodic = rollout(CartPole(64, **kw), 40)
    assert_close_trajectories(episodic, rollout(CartPole(64, compile=True, **kw), 40))
