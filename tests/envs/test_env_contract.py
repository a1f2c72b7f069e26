"""The VecEnv contract, checked on every env implementation and every available device.

Implementations: GymEnv / GymEnvInf over a list of gymnasium envs and over gymnasium vector envs
(``vector_entry_point`` with NEXT_STEP auto-reset, ``SyncVectorEnv`` with SAME_STEP and NEXT_STEP, a plain
NEXT_STEP vector env that resets a subset), the torch simulators (when ``rlstruct.envs.classic_control`` is
importable), ale-py's AtariVectorEnv (``backend="ale"``), envpool, gymnax envs through DLPack
(``backend="gymnax"``), and DeviceEnv-wrapped variants. On a CUDA device the CPU envs run behind
``DeviceEnv(env, "cpu", device)`` and the torch simulators and JAX envs are built on the device. The ale, envpool
and gymnax cases skip when their package is absent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf, VecEnv, make_env
from rlstruct.errors import BatchSizeError, DeviceMismatchError, EnvStateError, SpaceError
from tests.atari_pool import ATARI_POOL, make_atari_env
from tests.conftest import device_params
from tests.fakes_gym import NextStepVectorEnv, assert_same, random_action

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP
NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP
# Short episodes keep the episodic runs (which go until every env is done) fast.
MAX_STEPS = {"CartPole-v1": 60, "Pendulum-v1": 20, "Acrobot-v1": 20, "MountainCar-v0": 20, "ALE/Breakout-v5": 10,
             "MinAtar/Freeway-v1": 20}
RESERVED = ["reward", "done", "terminated", "truncated", "initial_state", "last_action"]
HAS_TORCH_SIMS = importlib.util.find_spec("rlstruct.envs.classic_control") is not None


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[int, int, str], VecEnv]  # (n_envs, seed, device) -> env on device
    autoreset: bool
    env_id: str
    has_state: bool = False
    #: a native backend whose env builds slowly (ale-py, JAX's jit): 1.5-2.5 CPU s a test, so `make quick` leaves
    #: its cases out; `make test` runs them
    slow: bool = False

    def param(self):
        return pytest.param(self, id=self.id, marks=[pytest.mark.slow] if self.slow else [])


def _on(env: VecEnv, device: str) -> VecEnv:
    return env if device == "cpu" else DeviceEnv(env, "cpu", device)


def _gym_list(name: str, autoreset: bool) -> Case:
    def build(n, seed, device):
        cls = GymEnvInf if autoreset else GymEnv
        return _on(cls([gym.make(name, max_episode_steps=MAX_STEPS[name]) for _ in range(n)], seed), device)

    return Case(f"list-{name}-{'inf' if autoreset else 'episodic'}", build, autoreset, name)


def _gym_vector(name: str, autoreset: bool, mode: str) -> Case:
    def build(n, seed, device):
        if mode == "entry_point":
            vec = gym.make_vec(name, n, vectorization_mode="vector_entry_point", max_episode_steps=MAX_STEPS[name])
        else:
            am = SAME_STEP if mode == "sync_same_step" else NEXT_STEP
            vec = gym.make_vec(
                name, n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": am},
                max_episode_steps=MAX_STEPS[name],
            )
        return _on(GymEnv(vec, seed, autoreset=autoreset), device)

    return Case(f"{mode}-{name}-{'inf' if autoreset else 'episodic'}", build, autoreset, name)


def _torch_sim(name: str, autoreset: bool, physics_dtype: torch.dtype = torch.float64) -> Case:
    def build(n, seed, device):
        return make_env(
            name, n, device=device, seed=seed, autoreset=autoreset, backend="torch", max_episode_steps=MAX_STEPS[name],
            backend_kwargs={"physics_dtype": physics_dtype},
        )

    suffix = "" if physics_dtype == torch.float64 else "-float32"
    return Case(f"torch-{name}-{'inf' if autoreset else 'episodic'}{suffix}", build, autoreset, name, has_state=True)


def _fake_next_step(name: str, autoreset: bool, partial_rows: str) -> Case:
    def build(n, seed, device):
        vec = NextStepVectorEnv([gym.make(name, max_episode_steps=MAX_STEPS[name]) for _ in range(n)], partial_rows)
        return _on(GymEnv(vec, seed, autoreset=autoreset), device)

    return Case(f"next_step_{partial_rows}-{name}-{'inf' if autoreset else 'episodic'}", build, autoreset, name)


#: the extra that installs each backend's package (a name that is not here is its own extra's)
BACKEND_EXTRAS = {"ale_py": "atari", "gymnax": "jax", "jax": "jax", "mujoco_torch": "mujoco", "mujoco.mjx": "mujoco"}


@pytest.fixture(autouse=True)
def _lend_atari_envs(request):
    with ATARI_POOL.lending(request.node.originalname not in FRESH_ATARI_ENVS):
        yield


#: the seeding tests build their own ale-py envs
FRESH_ATARI_ENVS = {"test_same_seed_reproduces", "test_seeds_differ_across_envs_and_consecutive_seeds"}


def _backend(backend: str, package: str, name: str, autoreset: bool, has_state: bool = False, **kwargs) -> Case:
    """``make_env(name, ..., backend=backend)``, skipped when ``package`` is not installed."""
    def build(n, seed, device):
        extra = BACKEND_EXTRAS.get(package, package)
        pytest.importorskip(package, reason=f"the {extra} extra is not installed: pip install 'rlstruct[{extra}]'")
        make = make_atari_env if backend == "ale" else make_env
        return make(name, n, device=device, seed=seed, autoreset=autoreset, backend=backend,
                    max_episode_steps=MAX_STEPS[name], **kwargs)

    return Case(f"{backend}-{name}-{'inf' if autoreset else 'episodic'}", build, autoreset, name, has_state,
                slow=backend in ("ale", "gymnax"))


def _device_wrapped(inner: Case) -> Case:
    def build(n, seed, device):
        env = inner.build(n, seed, "cpu")
        return DeviceEnv(env, env.device, device)

    return Case(f"deviceenv-{inner.id}", build, inner.autoreset, inner.env_id, inner.has_state, inner.slow)


def _cases() -> list[Case]:
    cases = []
    for name in ("CartPole-v1", "Pendulum-v1"):
        for autoreset in (False, True):
            cases.append(_gym_list(name, autoreset))
            cases.append(_gym_vector(name, autoreset, "sync_same_step"))
    cases.append(_gym_vector("CartPole-v1", False, "entry_point"))
    cases.append(_gym_vector("Pendulum-v1", False, "sync_next_step"))
    cases.append(_gym_vector("CartPole-v1", True, "sync_next_step"))
    cases.append(_fake_next_step("CartPole-v1", True, "reset"))
    cases.append(_fake_next_step("Pendulum-v1", True, "all"))
    cases.append(_fake_next_step("CartPole-v1", False, "all"))
    # The native backends build slowly (a second or so each): one or two cases each here, the rest of their
    # behaviour in test_ecosystem.py.
    cases.append(_backend("ale", "ale_py", "ALE/Breakout-v5", True, backend_kwargs={"num_threads": 1}))
    for autoreset in (False, True):
        cases.append(_backend("envpool", "envpool", "CartPole-v1", autoreset))
    for name, autoreset in (("CartPole-v1", False), ("Pendulum-v1", True)):
        cases.append(_backend("gymnax", "gymnax", name, autoreset, has_state=True))
    cases.append(_device_wrapped(_gym_list("CartPole-v1", False)))
    cases.append(_device_wrapped(_gym_list("Pendulum-v1", True)))
    if HAS_TORCH_SIMS:
        for name in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1"):
            for autoreset in (False, True):
                cases.append(_torch_sim(name, autoreset))
        cases.append(_device_wrapped(_torch_sim("CartPole-v1", True)))
        for name, autoreset in (("CartPole-v1", True), ("Pendulum-v1", False)):
            cases.append(_torch_sim(name, autoreset, torch.float32))
        for autoreset in (False, True):
            cases.append(_backend("torch", "rlstruct", "MinAtar/Freeway-v1", autoreset, has_state=True))
    return cases


CASES = _cases()


def _cases_where(keep: Callable[[Case], bool]):
    return pytest.mark.parametrize("case", [c.param() for c in CASES if keep(c)])


@pytest.fixture(params=[c.param() for c in CASES])
def case(request) -> Case:
    return request.param


@pytest.fixture(params=device_params())
def device(request) -> str:
    return request.param


# ------------------------------------------------------------------------------------------- helpers
def action_dtype(space: gym.Space) -> torch.dtype:
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return torch.int64
    return torch.from_numpy(space.low).dtype


def observation_keys(space: gym.Space) -> list[str]:
    return list(space.spaces) if isinstance(space, spaces.Dict) else ["frame"]


def observation_specs(space: gym.Space) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per observation key: the row shape and the dtype the adapters must give it."""
    subs = space.spaces if isinstance(space, spaces.Dict) else {"frame": space}
    out = {}
    for k, sub in subs.items():
        if isinstance(sub, (spaces.Discrete, spaces.MultiDiscrete)):
            out[k] = (tuple(sub.shape), torch.int64)
        else:
            out[k] = (tuple(sub.shape), torch.from_numpy(np.zeros((), sub.dtype)).dtype)
    return out


def rollout(env: VecEnv, seed: int, n_steps: int, reset_at: int | None = None) -> list:
    """Observations and ids of ``n_steps`` random steps (resetting when nothing runs, and at ``reset_at``)."""
    gen = torch.Generator().manual_seed(seed)
    obs, ids = env.reset()
    out = [(obs, ids)]
    for t in range(n_steps):
        if ids.shape[0] == 0 or t == reset_at:
            obs, ids = env.reset()
            out.append((obs, ids))
            continue
        (obs_next, ids_next), (obs, ids) = env.step(random_action(env.action_space, ids.shape[0], gen, env.device))
        out.append((obs_next, ids_next, obs, ids))
    return out


# ------------------------------------------------------------------------------------------- tests
def test_attributes(case, device):
    env = case.build(3, 0, device)
    assert hasattr(env, "get_state") is case.has_state
    assert env.n_envs() == 3
    assert env.device == torch.device(device)
    assert env.autoreset is case.autoreset
    assert isinstance(env.action_space, (spaces.Discrete, spaces.Box, spaces.MultiDiscrete))
    assert isinstance(env.observation_space, gym.Space)
    env.close()
    env.close()


def test_reset_observation(case, device):
    env = case.build(3, 0, device)
    obs, ids = env.reset()
    dev = torch.device(device)
    assert list(obs.keys()) == observation_keys(env.observation_space) + RESERVED
    assert ids.dtype == torch.int64 and ids.device == dev and ids.tolist() == [0, 1, 2]
    assert obs.n_elems() == 3 and obs.device() == dev
    for k, (shape, dtype) in observation_specs(env.observation_space).items():
        assert obs[k].shape == (3,) + shape and obs[k].dtype == dtype, k
    assert obs["reward"].dtype == torch.float32 and obs["reward"].shape == (3,)
    assert not obs["reward"].any()
    for k in ("done", "terminated", "truncated"):
        assert obs[k].dtype == torch.bool and obs[k].shape == (3,) and not obs[k].any(), k
    assert obs["initial_state"].dtype == torch.bool and obs["initial_state"].all()
    la = obs["last_action"]
    assert la.shape == (3,) + tuple(env.action_space.shape) and la.dtype == action_dtype(env.action_space)
    assert not la.any()


def test_step_shapes_and_values(case, device):
    env = case.build(4, 1, device)
    obs, ids = env.reset()
    specs = obs.specs()
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        action = random_action(env.action_space, ids.shape[0], gen, env.device)
        (obs_next, ids_next), (obs_running, ids_running) = env.step(action)
        assert torch.equal(ids_next, ids)
        for o, i in ((obs_next, ids_next), (obs_running, ids_running)):
            assert o.specs() == specs and list(o.keys()) == list(specs)
            assert o.n_elems() == i.shape[0] and o.device() == env.device
            assert i.dtype == torch.int64 and i.device == env.device
            assert torch.equal(o["done"], o["terminated"] | o["truncated"])
        assert not obs_next["initial_state"].any()
        assert torch.equal(obs_next["last_action"], action["action"].to(obs_next["last_action"].dtype))
        assert torch.equal(ids_running, ids_running.sort().values)
        ids = ids_running
        if ids.shape[0] == 0:
            break


def test_outputs_are_not_overwritten_by_later_steps(case, device):
    env = case.build(3, 2, device)
    obs, ids = env.reset()
    kept = [obs.clone()]
    returned = [obs]
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        if ids.shape[0] == 0:
            break
        (obs_next, _), (obs, ids) = env.step(random_action(env.action_space, ids.shape[0], gen, env.device))
        returned += [obs_next, obs]
        kept += [obs_next.clone(), obs.clone()]
    for r, k in zip(returned, kept):
        assert_same(r, k)


@_cases_where(lambda c: not c.autoreset)
def test_episodic_runs_until_every_env_is_done(case, device):
    env = case.build(4, 3, device)
    obs, ids = env.reset()
    finished = []
    gen = torch.Generator().manual_seed(1)
    for _ in range(500):
        (obs_next, ids_next), (obs_running, ids_running) = env.step(
            random_action(env.action_space, ids.shape[0], gen, env.device)
        )
        done = obs_next["done"]
        finished += ids_next[done].tolist()
        assert torch.equal(ids_running, ids_next[~done])
        assert_same(obs_running, obs_next.index(~done))
        ids = ids_running
        if ids.shape[0] == 0:
            break
    assert ids.shape[0] == 0 and ids.dtype == torch.int64 and ids.device == env.device
    assert obs_running.n_elems() == 0
    assert sorted(finished) == [0, 1, 2, 3]
    obs, ids = env.reset()
    assert ids.tolist() == [0, 1, 2, 3] and obs["initial_state"].all() and not obs["done"].any()


@_cases_where(lambda c: c.autoreset)
def test_autoreset_returns_terminal_then_fresh_observation(case, device):
    env = case.build(4, 4, device)
    obs, ids = env.reset()
    keys = observation_keys(env.observation_space)
    gen = torch.Generator().manual_seed(2)
    n_done = 0
    for _ in range(200):
        (obs_next, ids_next), (obs_running, ids_running) = env.step(
            random_action(env.action_space, 4, gen, env.device)
        )
        assert ids_next.tolist() == ids_running.tolist() == [0, 1, 2, 3]
        done = obs_next["done"]
        assert not obs_next["initial_state"].any()
        assert torch.equal(obs_running["initial_state"], done)
        for k in ("done", "terminated", "truncated"):
            assert not obs_running[k].any(), k
        assert not obs_running["reward"][done].any()
        assert not obs_running["last_action"][done].any()
        keep = ~done
        assert_same(obs_running.index(keep), obs_next.index(keep))
        for k in keys:
            fresh, terminal = obs_running[k][done], obs_next[k][done]
            assert all(not torch.equal(f, t) for f, t in zip(fresh, terminal)), k
        n_done += int(done.sum())
        if n_done >= 6:
            break
    assert n_done >= 6


@_cases_where(lambda c: c.autoreset)
def test_step_into_writes_what_step_returns(case, device):
    """Every auto-reset env takes step_into (natively, or as step and a copy): the same observations as step."""
    ref, env = case.build(3, 8, device), case.build(3, 8, device)
    obs, _ = ref.reset()
    env.reset()
    nxt = DictTensor({k: torch.empty_like(v) for k, v in obs.items()})
    running = DictTensor({k: torch.empty_like(v) for k, v in obs.items()})
    gen = torch.Generator().manual_seed(3)
    for _ in range(30):
        action = random_action(ref.action_space, 3, gen, ref.device)
        (obs_next, _), (obs_running, _) = ref.step(action)
        env.step_into(action, nxt, running)
        assert_same(nxt, obs_next)
        assert_same(running, obs_running)
    assert isinstance(env.writes_in_place(), bool)


@_cases_where(lambda c: not c.autoreset)
def test_step_into_refuses_an_episodic_env(case, device):
    env = case.build(2, 0, device)
    obs, _ = env.reset()
    assert env.writes_in_place() is False
    with pytest.raises(EnvStateError, match="needs an auto-reset env"):
        env.step_into(random_action(env.action_space, 2, torch.Generator(), env.device), obs.clone(), obs.clone())


def test_graph_state_is_none_or_the_state_that_set_graph_state_takes_back(case, device):
    """The CUDA-graph contract: ``graph_state()`` is ``None`` (then ``set_graph_state`` refuses), or a dict of the
    env's state tensors on its device, which ``set_graph_state`` takes back (clones of them: the env steps on
    exactly as one never handed a state)."""
    env, ref = case.build(3, 0, device), case.build(3, 0, device)
    env.reset(), ref.reset()
    state = env.graph_state()
    if state is None:
        with pytest.raises(EnvStateError, match="set_graph_state needs"):
            env.set_graph_state({})
        return
    assert case.autoreset and all(isinstance(v, torch.Tensor) and v.device == env.device for v in state.values())
    env.set_graph_state({k: v.clone() for k, v in state.items()})
    gen = torch.Generator().manual_seed(4)
    for _ in range(10):
        action = random_action(env.action_space, 3, gen, env.device)
        (a_next, _), (a_run, _) = env.step(action)
        (b_next, _), (b_run, _) = ref.step(action)
        assert_same(a_next, b_next)
        assert_same(a_run, b_run)


def test_same_seed_reproduces(case, device):
    a = rollout(case.build(3, 5, device), seed=0, n_steps=30, reset_at=15)
    b = rollout(case.build(3, 5, device), seed=0, n_steps=30, reset_at=15)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if isinstance(u, DictTensor):
                assert_same(u, v)
            else:
                assert torch.equal(u, v)


def test_reset_twice_gives_different_episodes(case, device):
    env = case.build(3, 6, device)
    first, _ = env.reset()
    second, _ = env.reset()
    k = observation_keys(env.observation_space)[0]
    assert not torch.equal(first[k], second[k])


def test_seeds_differ_across_envs_and_consecutive_seeds(case, device):
    env = case.build(3, 7, device)
    obs0, _ = env.reset()
    obs1, _ = case.build(3, 8, device).reset()
    k = observation_keys(env.observation_space)[0]
    f0, f1 = obs0[k].cpu(), obs1[k].cpu()
    assert not torch.equal(f0, f1)
    assert not torch.equal(f0[0], f0[1]) and not torch.equal(f0[1], f0[2])
    # A batcher gives its workers consecutive seeds: no env may repeat another worker's env.
    assert not torch.equal(f0[1], f1[0]) and not torch.equal(f0[2], f1[1])


@_cases_where(lambda c: c.has_state)
def test_get_set_state_round_trip(case, device):
    env = case.build(3, 9, device)
    obs, ids = env.reset()
    gen = torch.Generator().manual_seed(3)
    action = random_action(env.action_space, 3, gen, env.device)
    state = env.get_state()
    first = env.step(action)
    env.set_state(state)
    second = env.step(action)
    for (u, i), (v, j) in zip(first, second):
        assert_same(u, v)
        assert torch.equal(i, j)


def test_wrong_action_raises(case, device):
    env = case.build(3, 10, device)
    obs, ids = env.reset()
    good = random_action(env.action_space, 3, torch.Generator().manual_seed(0), env.device)["action"]
    wrong_shape = torch.zeros((3,) + good.shape[1:] + (3,), dtype=good.dtype, device=env.device)
    with pytest.raises(SpaceError, match="action"):
        env.step(DictTensor({"action": wrong_shape}))
    wrong_dtype = good.float() if good.dtype == torch.int64 else good.long()
    with pytest.raises(SpaceError, match="action"):
        env.step(DictTensor({"action": wrong_dtype}))
    with pytest.raises(BatchSizeError, match="one row per running env"):
        env.step(DictTensor({"action": good[:2]}))
    env.step(DictTensor({"action": good}))  # the env still works after the errors


def test_env_info_must_have_one_cpu_row_per_env(case, device):
    env = case.build(3, 11, device)
    with pytest.raises(BatchSizeError, match="env_info"):
        env.reset(DictTensor({"x": torch.zeros(2)}))
    with pytest.raises(DeviceMismatchError, match="env_info must be on cpu"):
        env.reset(DictTensor({"x": torch.zeros(3, device="meta")}))
    obs, ids = env.reset(DictTensor({}))
    assert ids.shape == (3,)


def test_device_env_round_trip(case, device):
    inner = case.build(3, 12, "cpu")
    returned = {}
    reset, step = inner.reset, inner.step

    def spy_reset(*args):
        returned["reset"] = reset(*args)
        return returned["reset"]

    def spy_step(action):
        returned["step"] = step(action)
        return returned["step"]

    inner.reset, inner.step = spy_reset, spy_step
    env = DeviceEnv(inner, inner.device, device)
    assert env.device == torch.device(device) and env.n_envs() == 3 and env.autoreset is case.autoreset
    assert env.action_space == inner.action_space and env.observation_space == inner.observation_space
    obs, ids = env.reset()
    same = torch.device(device) == inner.device
    assert obs.device() == torch.device(device) and ids.device == torch.device(device)
    if same:
        assert obs is returned["reset"][0] and ids is returned["reset"][1]
    else:
        assert_same(obs, returned["reset"][0])
    action = random_action(env.action_space, 3, torch.Generator().manual_seed(0), device)
    (obs_next, ids_next), (obs_running, ids_running) = env.step(action)
    (r_next, r_ids), (r_running, r_ids_running) = returned["step"]
    pairs = ((obs_next, r_next), (obs_running, r_running), (ids_next, r_ids), (ids_running, r_ids_running))
    for mine, theirs in pairs:
        if same:
            assert mine is theirs
        elif isinstance(mine, DictTensor):
            assert mine.device() == torch.device(device)
            assert_same(mine, theirs)
        else:
            assert mine.device == torch.device(device) and torch.equal(mine.cpu(), theirs.cpu())
    with pytest.raises(DeviceMismatchError, match="env_info must be on cpu"):
        env.reset(DictTensor({"x": torch.zeros(3, device="meta")}))
    env.close()


@_cases_where(lambda c: c.env_id == "Pendulum-v1")
def test_one_dimensional_box_takes_flat_actions(case, device):
    env = case.build(2, 13, device)
    assert isinstance(env.action_space, spaces.Box) and env.action_space.shape == (1,)
    env.reset()
    flat = torch.zeros(2, device=env.device)
    (obs_next, _), _ = env.step(DictTensor({"action": flat}))
    assert obs_next["last_action"].shape == (2, 1)


def test_last_action_does_not_alias_the_agent_tensor(case, device):
    env = case.build(2, 14, device)
    env.reset()
    action = random_action(env.action_space, 2, torch.Generator().manual_seed(0), env.device)
    (obs_next, _), _ = env.step(action)
    before = obs_next["last_action"].clone()
    action["action"].add_(1)
    assert torch.equal(obs_next["last_action"], before)


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_env_index_makes_part_of_the_envs_the_same_envs_as_in_the_whole(backend):
    """Envs 2 and 3 of a seed, built as the first two of an env with env_index=2, replay the episodes (auto-resets
    included) of envs 2 and 3 of the env of all four."""
    whole = make_env("CartPole-v1", 4, seed=5, backend=backend, autoreset=True, max_episode_steps=6)
    part = make_env("CartPole-v1", 2, seed=5, backend=backend, autoreset=True, max_episode_steps=6, env_index=2)
    (obs_w, _), (obs_p, _) = whole.reset(), part.reset()
    assert torch.equal(obs_w["frame"][2:], obs_p["frame"])
    for _ in range(8):
        (_, _), (obs_w, _) = whole.step(DictTensor({"action": torch.ones(4, dtype=torch.int64)}))
        (_, _), (obs_p, _) = part.step(DictTensor({"action": torch.ones(2, dtype=torch.int64)}))
        assert torch.equal(obs_w["frame"][2:], obs_p["frame"])
    with pytest.raises(ValueError, match=r"env_index must be an int >= 0 \(the global index of the first env\)"):
        make_env("CartPole-v1", 2, backend=backend, env_index=-1)
