"""GymEnv / GymEnvInf specifics (spaces, list vs vector, options, seeds, errors), DeviceEnv and make_env."""

from __future__ import annotations

import functools
import importlib.util
import pickle
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf, VecEnv, make_env
from rlstruct.envs._gym_adapters import ListAdapter, VectorAdapter
from rlstruct.errors import (
    BatchSizeError,
    DeviceMismatchError,
    DeviceUnavailableError,
    EnvStateError,
    MissingDependencyError,
    SeedError,
    SpaceError,
)
from rlstruct.seeding import env_seeds
from tests import fakes_gym
from tests.fakes_gym import assert_same, random_action

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP
NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP
RESERVED = ["reward", "done", "terminated", "truncated", "initial_state", "last_action"]
HAS_TORCH_SIMS = importlib.util.find_spec("rlstruct.envs.classic_control") is not None


def sync_vec(make, n, mode=SAME_STEP):
    return gym.vector.SyncVectorEnv([make for _ in range(n)], autoreset_mode=mode)


def act(a) -> DictTensor:
    return DictTensor({"action": torch.as_tensor(a)})


# ------------------------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("vector", [False, True], ids=["list", "vector"])
def test_dict_observation_keeps_keys_and_dtypes(vector):
    envs = sync_vec(fakes_gym.DictImageEnv, 3) if vector else [fakes_gym.DictImageEnv() for _ in range(3)]
    env = GymEnv(envs, 0)
    obs, ids = env.reset()
    # The Dict space's own key order (gymnasium sorts the keys of a plain dict).
    assert list(env.observation_space.spaces) == ["count", "image", "position"]
    assert list(obs.keys()) == ["count", "image", "position"] + RESERVED
    assert obs["image"].dtype == torch.uint8 and obs["image"].shape == (3, 3, 6, 6)
    assert obs["position"].dtype == torch.float32 and obs["position"].shape == (3, 2)
    assert obs["count"].dtype == torch.int64 and obs["count"].shape == (3,)
    assert obs["last_action"].dtype == torch.int64 and obs["last_action"].shape == (3, 2)
    assert not obs["last_action"].any()
    a = torch.tensor([[0, 1], [2, 3], [1, 1]])
    (obs_next, _), (obs_running, _) = env.step(act(a))
    assert obs_next["image"].dtype == torch.uint8 and (obs_next["image"] == 1).all()
    assert obs_next["count"].tolist() == [1, 1, 1]
    assert obs_next["reward"].tolist() == [1.0, 5.0, 2.0]
    assert torch.equal(obs_next["last_action"], a)
    assert torch.equal(obs_next["position"], obs["position"])


def test_uint8_image_frame_and_box_action():
    env = GymEnv([fakes_gym.ImageEnv(length=2) for _ in range(2)], 0)
    obs, _ = env.reset()
    assert obs["frame"].dtype == torch.uint8 and obs["frame"].shape == (2, 4, 5)
    assert obs["last_action"].dtype == torch.float32 and obs["last_action"].shape == (2, 2)
    a = torch.full((2, 2), 0.25)
    (o1, _), _ = env.step(act(a))
    (o2, _), (running, ids) = env.step(act(a))
    assert torch.equal(o2["frame"], obs["frame"] + 2)
    assert o2["truncated"].all() and not o2["terminated"].any() and o2["done"].all()
    assert ids.numel() == 0 and running.n_elems() == 0 and running["frame"].dtype == torch.uint8


@pytest.mark.parametrize("vector", [False, True], ids=["list", "vector-next-step"])
def test_discrete_observation_and_action_with_start(vector):
    # Over a NEXT_STEP vector env, finished envs are stepped with a dummy action that must be valid (start=1).
    make = functools.partial(fakes_gym.DiscreteObsEnv, length=50)
    env = GymEnv(sync_vec(make, 4, NEXT_STEP) if vector else [make() for _ in range(4)], 1)
    obs, ids = env.reset()
    assert obs["frame"].dtype == torch.int64 and obs["frame"].shape == (4,)
    assert obs["last_action"].dtype == torch.int64 and not obs["last_action"].any()
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        (obs_next, _), (obs, ids) = env.step(random_action(env.action_space, ids.shape[0], gen, "cpu"))
        assert ((obs_next["frame"] >= 0) & (obs_next["frame"] < 7)).all()
        if ids.numel() == 0:
            break
    assert ids.numel() == 0


@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "inf"])
def test_a_vector_env_that_reuses_its_buffers_is_copied(autoreset):
    vec = gym.vector.SyncVectorEnv(
        [functools.partial(gym.make, "CartPole-v1", max_episode_steps=5)] * 2, copy=False, autoreset_mode=SAME_STEP
    )
    env = GymEnv(vec, 0, autoreset=autoreset)
    obs, ids = env.reset()
    returned, kept = [obs], [obs.clone()]
    for _ in range(6):
        if ids.numel() == 0:
            break
        (obs_next, _), (obs, ids) = env.step(act(torch.ones(ids.shape[0], dtype=torch.int64)))
        returned += [obs_next, obs]
        kept += [obs_next.clone(), obs.clone()]
    for r, k in zip(returned, kept):
        assert_same(r, k)


def test_step_once_every_env_has_finished_asks_for_a_reset():
    env = GymEnv([fakes_gym.ImageEnv(length=1)], 0)
    env.reset()
    _, (obs, ids) = env.step(act(torch.zeros(1, 2)))
    assert ids.numel() == 0 and obs.n_elems() == 0 and obs["frame"].dtype == torch.uint8
    with pytest.raises(EnvStateError, match=r"every one of the 1 episodic envs has finished; call env.reset\(\)"):
        env.step(act(torch.zeros(0, 2)))
    assert env.reset()[1].tolist() == [0]


# ------------------------------------------------------------------------------------------- list vs vector
@pytest.mark.parametrize(
    "make",
    [
        functools.partial(gym.make, "CartPole-v1", max_episode_steps=40),
        functools.partial(gym.make, "Pendulum-v1", max_episode_steps=15),
        fakes_gym.DictImageEnv,
    ],
    ids=["CartPole", "Pendulum", "DictImage"],
)
@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "inf"])
def test_list_and_vector_give_the_same_trajectories(make, autoreset):
    def rollout(env):
        gen = torch.Generator().manual_seed(0)
        obs, ids = env.reset()
        out = [obs]
        for _ in range(80):
            (obs_next, _), (obs, ids) = env.step(random_action(env.action_space, ids.shape[0], gen, "cpu"))
            out += [obs_next, obs]
            if ids.numel() == 0:
                break
        return out

    a = rollout(GymEnv([make() for _ in range(3)], 11, autoreset=autoreset))
    b = rollout(GymEnv(sync_vec(make, 3), 11, autoreset=autoreset))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_same(x, y)


def empty_like(obs: DictTensor) -> DictTensor:
    return DictTensor({k: torch.empty_like(v) for k, v in obs.items()})


@pytest.mark.parametrize(
    "make",
    [
        functools.partial(gym.make, "CartPole-v1", max_episode_steps=12),
        functools.partial(gym.make, "Pendulum-v1", max_episode_steps=9),
        fakes_gym.DictImageEnv,
        fakes_gym.DiscreteObsEnv,
    ],
    ids=["CartPole", "Pendulum", "DictImage", "DiscreteObs"],
)
@pytest.mark.parametrize("source", ["list", "vector"])
def test_step_into_writes_what_step_returns(make, source):
    """An auto-reset env writes in place, over a list (each env's results) and over a vector env (its arrays):
    the same observations as step, bit for bit, across auto-resets, into the same destinations at every step."""
    def build():
        return GymEnvInf([make() for _ in range(3)] if source == "list" else sync_vec(make, 3), 4)

    ref, env = build(), build()
    assert env.writes_in_place() and not GymEnv([make()], 0).writes_in_place()
    obs, _ = ref.reset()
    assert_same(obs, env.reset()[0])
    nxt, running = empty_like(obs), empty_like(obs)
    gen = torch.Generator().manual_seed(0)
    resets = 0
    for _ in range(40):
        action = random_action(ref.action_space, 3, gen, "cpu")
        (obs_next, _), (obs_running, _) = ref.step(action)
        env.step_into(action, nxt, running)
        assert_same(nxt, obs_next)
        assert_same(running, obs_running)
        resets += int(obs_next["done"].sum())
    assert resets > 0


def test_step_into_reuses_reset_options_and_checks_its_destinations():
    envs = [fakes_gym.OptionsEnv(length=2) for _ in range(2)]
    env = GymEnvInf(envs, 0)
    a = act(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvStateError, match="before reset"):
        env.step_into(a, DictTensor(), DictTensor())
    obs, _ = env.reset(DictTensor({"level": torch.tensor([10.0, 20.0])}))
    nxt, running = empty_like(obs), empty_like(obs)
    env.step_into(a, nxt, running)
    env.step_into(a, nxt, running)
    assert nxt["done"].all() and running["initial_state"].all()
    assert running["frame"][:, 0].tolist() == [10.0, 20.0] and envs[1].reset_options[-1] == {"level": 20.0}
    bad = empty_like(obs)
    bad.set("reward", torch.empty(2, dtype=torch.float64))
    with pytest.raises(SpaceError, match=r"observation_next\['reward'\] must be float32 \[2\], got float64"):
        env.step_into(a, bad, running)
    missing = DictTensor({k: v for k, v in empty_like(obs).items() if k != "truncated"})
    with pytest.raises(KeyError, match="lacks the key 'truncated'"):
        env.step_into(a, nxt, missing)
    with pytest.raises(BatchSizeError):
        env.step_into(act(torch.zeros(3, dtype=torch.int64)), nxt, running)


class WrongShapeEnv(fakes_gym.SpaceEnv):
    """Says its observations are ``[4]`` but returns ``[5]`` from ``step``."""

    def __init__(self):
        super().__init__(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))

    def step(self, action):
        return np.zeros(5, np.float32), 0.0, False, False, {}


def test_observations_that_contradict_the_space_are_named():
    env = GymEnvInf([WrongShapeEnv() for _ in range(2)], 0)
    obs, _ = env.reset()
    a = act(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(SpaceError, match=r"observation 'frame' of shape \[5\].*space says \[4\]"):
        env.step(a)
    with pytest.raises(SpaceError, match=r"observation 'frame' of shapes \[\[5\]\].*space says \[4\]"):
        env.step_into(a, empty_like(obs), empty_like(obs))


def test_step_into_destinations_must_be_on_the_env_device():
    env = GymEnvInf([gym.make("CartPole-v1") for _ in range(2)], 0)
    obs, _ = env.reset()
    meta = DictTensor({k: torch.empty_like(v, device="meta") for k, v in obs.items()})
    a = act(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(DeviceMismatchError, match=r"observation_next\['frame'\] is on meta; give CPU tensors"):
        env.step_into(a, meta, empty_like(obs))
    # Over a vector env, the same checks.
    vec = GymEnvInf(sync_vec(functools.partial(gym.make, "CartPole-v1"), 2), 0)
    vec.reset()
    with pytest.raises(DeviceMismatchError, match=r"observation_running\['frame'\] is on meta; give CPU tensors"):
        vec.step_into(a, empty_like(obs), meta)
    partial = DictTensor({k: v for k, v in empty_like(obs).items() if k != "reward"})
    with pytest.raises(KeyError, match=r"observation_next lacks the key 'reward'"):
        vec.step_into(a, partial, empty_like(obs))
    # The generic step_into (step, then a copy): the same situations.
    with pytest.raises(DeviceMismatchError, match="observation_running is on meta, the env's observations on cpu"):
        VecEnv.step_into(vec, a, empty_like(obs), meta)
    with pytest.raises(KeyError, match=r"observation_next lacks the observation keys \['reward'\]"):
        VecEnv.step_into(vec, a, partial, empty_like(obs))


def test_step_into_needs_an_auto_reset_env():
    from rlstruct.errors import EnvStateError

    env = GymEnv(sync_vec(fakes_gym.OptionsEnv, 2), 0)
    obs, _ = env.reset()
    with pytest.raises(EnvStateError, match="needs an auto-reset env"):
        env.step_into(act(torch.zeros(2, dtype=torch.int64)), empty_like(obs), empty_like(obs))


def test_list_seeds_are_the_documented_ones_and_only_used_once():
    env = GymEnv([gym.make("CartPole-v1") for _ in range(3)], 5)
    obs, _ = env.reset()
    again, _ = env.reset()
    for k, s in enumerate(env_seeds(5, 3)):
        ref = gym.make("CartPole-v1")
        assert np.array_equal(obs["frame"][k].numpy(), ref.reset(seed=s)[0])
        assert np.array_equal(again["frame"][k].numpy(), ref.reset()[0])


def test_a_vector_env_without_per_env_seeds_gets_the_first_derived_seed():
    env = GymEnv(gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point"), 5)
    obs, _ = env.reset()
    ref = gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point")
    assert np.array_equal(obs["frame"].numpy(), ref.reset(seed=env_seeds(5, 1)[0])[0])


def test_env_seeds_differ_across_envs_and_consecutive_seeds():
    seeds = [env_seeds(s, 8) for s in range(16)]
    flat = [x for row in seeds for x in row]
    assert len(set(flat)) == len(flat)
    assert env_seeds(3, 2) == env_seeds(3, 5)[:2]
    # Every derived seed fits a C int (ale-py's and envpool's bindings take nothing larger).
    assert all(0 <= s < 2**31 for s in flat) and max(flat) >= 2**30
    with pytest.raises(SeedError, match=r"seed must be an int in \[0, 2\*\*31\), got -1"):
        env_seeds(-1, 2)
    with pytest.raises(SeedError, match="seed must be an int in .* got float 1.5"):
        env_seeds(1.5, 2)


# ------------------------------------------------------------------------------------------- env_info
def test_env_info_rows_are_passed_as_reset_options_and_reused_by_autoreset():
    envs = [fakes_gym.OptionsEnv(length=2) for _ in range(3)]
    env = GymEnvInf(envs, 0)
    obs, _ = env.reset(DictTensor({"level": torch.tensor([10.0, 20.0, 30.0])}))
    assert obs["frame"][:, 0].tolist() == [10.0, 20.0, 30.0]
    assert [e.reset_options for e in envs] == [[{"level": 10.0}], [{"level": 20.0}], [{"level": 30.0}]]
    a = act(torch.zeros(3, dtype=torch.int64))
    env.step(a)
    (obs_next, _), (obs_running, _) = env.step(a)
    assert obs_next["done"].all() and obs_next["frame"][:, 0].tolist() == [12.0, 22.0, 32.0]
    assert obs_running["frame"][:, 0].tolist() == [10.0, 20.0, 30.0]
    assert envs[1].reset_options == [{"level": 20.0}, {"level": 20.0}]
    env.reset()
    assert envs[2].reset_options[-1] is None


def test_env_info_over_a_vector_env_needs_equal_rows():
    env = GymEnv(sync_vec(fakes_gym.OptionsEnv, 2), 0)
    obs, _ = env.reset(DictTensor({"level": torch.tensor([4.0, 4.0])}))
    assert obs["frame"][:, 0].tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match=r"env_info\['level'\] differs across rows; pass a list of envs"):
        env.reset(DictTensor({"level": torch.tensor([4.0, 5.0])}))
    inf = GymEnvInf(sync_vec(fakes_gym.OptionsEnv, 2), 0)
    with pytest.raises(ValueError, match="cannot parametrise a vector env's auto-resets"):
        inf.reset(DictTensor({"level": torch.tensor([4.0, 4.0])}))


def test_env_info_errors():
    env = GymEnv([fakes_gym.OptionsEnv() for _ in range(2)], 0)
    with pytest.raises(BatchSizeError, match=r"env_info must have n_envs=2 rows .* got 3"):
        env.reset(DictTensor({"level": torch.zeros(3)}))
    with pytest.raises(DeviceMismatchError, match="env_info must be on cpu, got meta; build env_info on the CPU"):
        env.reset(DictTensor({"level": torch.zeros(2, device="meta")}))


# ------------------------------------------------------------------------------------------- errors
def test_construction_errors():
    with pytest.raises(TypeError, match="list of gymnasium.Env or a gymnasium.vector.VectorEnv"):
        GymEnv(gym.make("CartPole-v1"), 0)
    with pytest.raises(ValueError, match="at least one gymnasium.Env"):
        GymEnv([], 0)
    with pytest.raises(TypeError, match=r"envs\[1\] must be a gymnasium.Env"):
        GymEnv([gym.make("CartPole-v1"), "CartPole-v1"], 0)
    with pytest.raises(SpaceError, match=r"same observation_space.*build the list from one env id"):
        GymEnv([gym.make("CartPole-v1"), gym.make("Acrobot-v1")], 0)
    with pytest.raises(SeedError, match=r"seed must be an int in \[0, 2\*\*31\), got -1"):
        GymEnv([gym.make("CartPole-v1")], -1)
    with pytest.raises(SeedError, match="seed must be an int in .* got NoneType None"):
        GymEnv([gym.make("CartPole-v1")], None)


@pytest.mark.parametrize(
    "obs_space, act_space, match",
    [
        (spaces.Tuple([spaces.Discrete(2)]), spaces.Discrete(2), "observation_space must be a Box, Discrete"),
        (spaces.Dict({"a": spaces.Dict({"b": spaces.Discrete(2)})}), spaces.Discrete(2), r"nested Dict"),
        (spaces.Dict({"reward": spaces.Discrete(2)}), spaces.Discrete(2), r"key 'reward' collides"),
        (spaces.Box(0, 1, (2,)), spaces.MultiBinary(3), "action_space must be Discrete, Box or MultiDiscrete"),
    ],
    ids=["tuple-obs", "nested-dict", "reserved-key", "multibinary-action"],
)
def test_unsupported_spaces_raise(obs_space, act_space, match):
    with pytest.raises(SpaceError, match=match):
        GymEnv([fakes_gym.SpaceEnv(obs_space, act_space)], 0)


def test_vector_autoreset_modes():
    with pytest.raises(ValueError, match=r"autoreset_mode=SAME_STEP, got NEXT_STEP .*vector_kwargs"):
        GymEnvInf(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"), 0)
    with pytest.raises(ValueError, match="autoreset_mode=DISABLED"):
        GymEnv(sync_vec(fakes_gym.OptionsEnv, 2, gym.vector.AutoresetMode.DISABLED), 0)
    GymEnv(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"), 0)


def test_step_errors():
    env = GymEnv([gym.make("CartPole-v1") for _ in range(2)], 0)
    with pytest.raises(EnvStateError, match=r"before reset\(\); call env.reset\(\) first"):
        env.step(act(torch.zeros(2, dtype=torch.int64)))
    env.reset()
    expected = r"shape \[B\] and an integer dtype .* got dtype torch.float32; convert it with .to\(torch.int64\)"
    with pytest.raises(SpaceError, match=expected):
        env.step(act(torch.zeros(2)))
    with pytest.raises(SpaceError, match=r"shape \[B\] .* got shape \[2, 1\]"):
        env.step(act(torch.zeros(2, 1, dtype=torch.int64)))
    with pytest.raises(BatchSizeError, match=r"one row per running env \(2\), got 3"):
        env.step(act(torch.zeros(3, dtype=torch.int64)))
    with pytest.raises(DeviceMismatchError, match=r"must be on cpu .* got meta; .* wrap the env in DeviceEnv"):
        env.step(act(torch.zeros(2, dtype=torch.int64, device="meta")))
    with pytest.raises(KeyError, match="'action'"):
        env.step(DictTensor({"act": torch.zeros(2, dtype=torch.int64)}))
    pendulum = GymEnv([gym.make("Pendulum-v1")], 0)
    pendulum.reset()
    with pytest.raises(SpaceError, match=r"shape \[B, 1\] and a floating dtype .* got dtype torch.int64"):
        pendulum.step(act(torch.zeros(1, 1, dtype=torch.int64)))
    env.close()
    env.close()
    with pytest.raises(EnvStateError, match="closed"):
        env.reset()


def test_integer_actions_of_any_width_are_cast():
    env = GymEnv([gym.make("CartPole-v1") for _ in range(2)], 0)
    env.reset()
    (obs, _), _ = env.step(act(torch.ones(2, dtype=torch.int32)))
    assert obs["last_action"].dtype == torch.int64 and obs["last_action"].tolist() == [1, 1]


# ------------------------------------------------------------------------------------------- DeviceEnv
class _StatefulEnv(GymEnv):
    def get_state(self):
        return "state"

    def set_state(self, state):
        self.restored = state


def test_device_env_forwards_attributes_and_state_api():
    inner = _StatefulEnv([gym.make("CartPole-v1") for _ in range(2)], 0, autoreset=True)
    env = DeviceEnv(inner, "cpu", "cpu")
    assert env.n_envs() == 2 and env.autoreset is True and env.device == torch.device("cpu")
    assert env.action_space is inner.action_space and env.observation_space is inner.observation_space
    assert env.get_state() == "state"
    env.set_state("s")
    assert inner.restored == "s"
    plain = DeviceEnv(GymEnv([gym.make("CartPole-v1")], 0), "cpu", "cpu")
    assert not hasattr(plain, "get_state") and not hasattr(plain, "set_state")
    with pytest.raises(AttributeError, match="no attribute 'foo'"):
        plain.foo
    env.close()
    assert inner._closed


def test_device_env_moves_observations_to_the_target_device():
    env = DeviceEnv(GymEnv([gym.make("CartPole-v1") for _ in range(2)], 0), "cpu", "meta")
    obs, ids = env.reset()
    assert obs.device() == torch.device("meta") and ids.device == torch.device("meta")
    assert env.device == torch.device("meta")


def test_device_env_errors():
    inner = GymEnv([gym.make("CartPole-v1")], 0)
    expected = r"from_device must be the env's device cpu, got meta; pass DeviceEnv\(env, 'cpu'"
    with pytest.raises(DeviceMismatchError, match=expected):
        DeviceEnv(inner, "meta", "cpu")
    with pytest.raises(DeviceUnavailableError, match="to_device='cuda:63' does not exist"):
        DeviceEnv(inner, "cpu", "cuda:63")
    env = DeviceEnv(inner, "cpu", "cpu")
    with pytest.raises(DeviceMismatchError, match="env_info must be on cpu, got meta"):
        env.reset(DictTensor({"x": torch.zeros(1, device="meta")}))


@pytest.mark.cuda
def test_device_env_to_cuda_round_trip():
    env = DeviceEnv(GymEnvInf([gym.make("CartPole-v1") for _ in range(2)], 0), "cpu", "cuda:0")
    obs, ids = env.reset()
    assert obs.device().type == "cuda" and ids.device.type == "cuda"
    (obs_next, ids), (obs, ids) = env.step(act(torch.zeros(2, dtype=torch.int64, device="cuda:0")))
    assert obs_next["last_action"].device.type == "cuda" and obs.device().type == "cuda"


# ------------------------------------------------------------------------------------------- make_env
@pytest.mark.skipif(not HAS_TORCH_SIMS, reason="rlstruct.envs.classic_control is not there yet")
@pytest.mark.parametrize("name", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1"])
def test_make_env_torch_backend(name):
    from rlstruct.envs import classic_control

    env = make_env(name, 3, seed=1, autoreset=True, max_episode_steps=7)
    assert type(env) is getattr(classic_control, name.split("-")[0])
    assert env.n_envs() == 3 and env.autoreset and env.max_episode_steps == 7
    default = make_env(name, 1)
    assert default.max_episode_steps == gym.spec(name).max_episode_steps


def test_make_env_torch_backend_unknown_name():
    expected = r"simulates \['CartPole-v1', .*got 'LunarLander-v3'; pass backend='gymnasium'"
    with pytest.raises(ValueError, match=expected):
        make_env("LunarLander-v3", 2)


def test_make_env_gymnasium_backend():
    episodic = make_env("CartPole-v1", 3, backend="gymnasium", seed=2, max_episode_steps=3)
    assert type(episodic) is GymEnv and isinstance(episodic._adapter, VectorAdapter)  # the one-call vector entry point
    obs, ids = episodic.reset()
    for _ in range(3):
        (obs_next, _), (obs, ids) = episodic.step(act(torch.zeros(ids.shape[0], dtype=torch.int64)))
    assert obs_next["truncated"].all() and ids.numel() == 0
    inf = make_env("CartPole-v1", 3, backend="gymnasium", autoreset=True)
    assert type(inf) is GymEnvInf and isinstance(inf._adapter, ListAdapter)  # NEXT_STEP vector env: a list instead
    pendulum = make_env("Pendulum-v1", 2, backend="gymnasium", max_episode_steps=2)
    assert type(pendulum) is GymEnv and isinstance(pendulum._adapter, ListAdapter)
    pendulum.reset()
    pendulum.step(act(torch.zeros(2, 1)))
    (obs_next, _), _ = pendulum.step(act(torch.zeros(2, 1)))
    assert obs_next["truncated"].all()
    on_meta = make_env("CartPole-v1", 2, backend="gymnasium", device="meta")
    assert isinstance(on_meta, DeviceEnv) and on_meta.reset()[0].device() == torch.device("meta")


@pytest.mark.cuda
def test_make_env_gymnasium_backend_on_cuda():
    env = make_env("CartPole-v1", 2, backend="gymnasium", device="cuda")
    assert isinstance(env, DeviceEnv)
    obs, ids = env.reset()
    assert obs.device() == torch.device("cuda:0")


def test_make_env_envpool_backend_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(MissingDependencyError, match="`pip install envpool`"):
        make_env("CartPole-v1", 2, backend="envpool")


def test_make_env_envpool_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", fakes_gym.fake_envpool_module())
    env = make_env("CartPole-v1", 3, backend="envpool", seed=4, max_episode_steps=30)
    assert type(env) is GymEnv and env._adapter.vec.pool.seed == env_seeds(4, 1)[0]
    assert env._adapter.vec.pool.kwargs == {"max_episode_steps": 30}
    obs, ids = env.reset()
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        _, (obs, ids) = env.step(random_action(env.action_space, ids.shape[0], gen, "cpu"))
        if ids.numel() == 0:
            break
    assert ids.numel() == 0
    with pytest.raises(ValueError, match="envpool envs take no reset options"):
        env.reset(DictTensor({"x": torch.zeros(3)}))
    env.close()
    assert env._adapter.vec.pool.closed


def test_make_env_envpool_backend_autoreset_resets_the_finished_envs_by_id(monkeypatch):
    """envpool resets a finished env on its next step: the adapter resets it at once with ``pool.reset(env_ids)``,
    so one step returns the terminal and the fresh observations, and the next step acts on the fresh one."""
    monkeypatch.setitem(sys.modules, "envpool", fakes_gym.fake_envpool_module())
    env = make_env("CartPole-v1", 3, backend="envpool", seed=4, autoreset=True, max_episode_steps=5)
    assert type(env) is GymEnvInf and env.writes_in_place()
    env.reset()
    pool = env._adapter.vec.pool
    for t in range(5):
        (nxt, _), (running, _) = env.step(act(torch.zeros(3, dtype=torch.int64)))
    assert nxt["truncated"].all() and running["initial_state"].all() and pool.partial_resets == [[0, 1, 2]]
    assert not torch.equal(nxt["frame"], running["frame"])
    (nxt, _), _ = env.step(act(torch.zeros(3, dtype=torch.int64)))
    # A real step from the fresh observation (no second reset by the pool): reward 1, and no flags.
    assert nxt["reward"].tolist() == [1.0, 1.0, 1.0] and not nxt["done"].any() and pool.vec.n_resets == 6


def test_make_env_argument_errors():
    backends = r"\['auto', 'torch', 'gymnasium', 'envpool', 'ale', 'gymnax', 'mjx', 'mujoco_torch', 'brax'\]"
    with pytest.raises(ValueError, match=rf"backend must be one of {backends}, got 'jax'"):
        make_env("CartPole-v1", 2, backend="jax")
    with pytest.raises(ValueError, match="n_envs must be >= 1, got 0"):
        make_env("CartPole-v1", 0, backend="gymnasium")
    with pytest.raises(ValueError, match="env must be a registered gymnasium id, got 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0", 2, backend="gymnasium")
    with pytest.raises(ValueError, match="env must be a registered gymnasium id, got 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0", 2, backend="auto")
    # an id of the user's own package, which a fresh process has not imported: the message names the module form
    with pytest.raises(ValueError, match=r"got 'MyPole-v0'; did you mean .*\? Or, for an id your package registers, "
                                         r"name the module that registers it: --env yourpackage.envs:MyPole-v0"):
        make_env("MyPole-v0", 2, backend="gymnasium")
    with pytest.raises(ValueError, match=r"env 'CartPole-v7' is not registered in gymnasium .*, which has CartPole-v0, "
                                         r"CartPole-v1; pass one of those"):
        make_env("CartPole-v7", 2, backend="gymnasium")


def test_auto_backend_picks_the_torch_simulator_where_there_is_one():
    assert type(make_env("CartPole-v1", 2, backend="auto")).__name__ == "CartPole"
    assert isinstance(make_env("FrozenLake-v1", 2, backend="auto"), GymEnv)


def test_make_env_pickles_as_a_create_env():
    create_env = pickle.loads(pickle.dumps(functools.partial(make_env, "CartPole-v1", 2, backend="gymnasium")))
    a, _ = create_env(seed=3).reset()
    b, _ = make_env("CartPole-v1", 2, backend="gymnasium", seed=3).reset()
    assert_same(a, b)
