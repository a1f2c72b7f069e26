"""The gymnasium bridge (rlstruct.envs.bridge), proven with code nobody here wrote.

* gymnasium's own ``check_env`` on a one-env view of every torch simulator (episodic and auto-reset),
  with a spec that makes it check reset and step determinism, allowed no warning that gymnasium's own
  implementation of the same env does not also get; and a control showing the checker catches a
  bridge that ignores the seed.
* gymnasium's passive checkers and vector wrappers (``RecordEpisodeStatistics``) on the vector env.
* Exact equivalence with gymnasium's ``SyncVectorEnv(autoreset_mode=SAME_STEP)``: gymnasium envs taken
  into rlstruct (``GymEnvInf``) and back out (``to_gymnasium``) give the very same tuples and infos.
* The SAME_STEP semantics against the simulator stepped directly, for both outputs.
* EnvPool's gymnasium envs through ``GymEnv`` (when envpool is installed) and SB3's PPO learning on
  the bridged torch CartPole (when stable-baselines3 is installed).
"""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.utils.passive_env_checker import (
    check_action_space,
    check_obs,
    check_observation_space,
    data_shares_objects,
    env_reset_passive_checker,
)

from rlstruct import DictTensor
from rlstruct.envs import (
    Acrobot,
    CartPole,
    DeviceEnv,
    GymEnv,
    GymEnvInf,
    MountainCar,
    Pendulum,
    make_env,
    to_gymnasium,
    to_gymnasium_env,
)
from rlstruct.envs.bridge import BridgeError, GymnasiumEnv, GymnasiumVectorEnv
from rlstruct.errors import EnvStateError, SeedError, SpaceError
from rlstruct.seeding import env_seeds
from tests.conftest import device_params
from tests.fakes_gym import DictImageEnv

SIMS = {"CartPole-v1": CartPole, "Acrobot-v1": Acrobot, "MountainCar-v0": MountainCar, "Pendulum-v1": Pendulum}
SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


def _actions(space: gym.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, n)
    return rng.uniform(space.low, space.high, (n,) + space.shape).astype(np.float32)


def _warnings_of(fn) -> set[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return {str(w.message) for w in caught}


# ----------------------------------------------------------------------------- gymnasium's check_env
@pytest.mark.parametrize("autoreset", [False, True], ids=["episodic", "autoreset"])
@pytest.mark.parametrize("name", list(SIMS))
def test_check_env_on_single_env_view(name, autoreset):
    def make(**kwargs):
        return to_gymnasium_env(SIMS[name](1, seed=3, autoreset=autoreset))

    env = make()
    # A spec with nondeterministic=False makes check_env compare observations across seeded resets and steps.
    env.spec = EnvSpec(f"rlstruct/{name}", entry_point=make, nondeterministic=False)
    ours = _warnings_of(lambda: check_env(env, skip_render_check=True))
    theirs = _warnings_of(lambda: check_env(gym.make(name).unwrapped, skip_render_check=True))
    assert ours <= theirs, f"warnings gymnasium's own {name} does not get: {ours - theirs}"


@pytest.mark.filterwarnings("ignore:.*infinity")  # CartPole's unbounded velocities, as gymnasium's own
def test_check_env_catches_a_bridge_that_ignores_the_seed():
    class Unseeded(GymnasiumEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(options=options)
            gym.Env.reset(self, seed=seed)
            return obs, info

    env = Unseeded(CartPole(1, seed=0))
    env.spec = EnvSpec("rlstruct/Unseeded", entry_point=lambda **kw: Unseeded(CartPole(1)), nondeterministic=False)
    with pytest.raises(AssertionError, match="non-deterministic"):
        check_env(env, skip_render_check=True)


def test_single_env_seed_replays_the_simulator():
    env = to_gymnasium_env(CartPole(1, seed=0))
    obs, info = env.reset(seed=11)
    fresh, _ = CartPole(1, seed=11).reset()
    np.testing.assert_array_equal(obs, fresh["frame"][0].numpy())
    assert info == {} and obs.dtype == np.float32
    out = env.step(np.int64(1))
    assert type(out[1]) is float and type(out[2]) is bool and type(out[3]) is bool


def test_single_env_errors():
    with pytest.raises(BridgeError, match=r"single env, got n_envs=2; build it with n_envs=1"):
        to_gymnasium_env(CartPole(2))
    with pytest.raises(TypeError, match="takes an rlstruct VecEnv"):
        to_gymnasium_env(gym.make("CartPole-v1"))
    env = to_gymnasium_env(Pendulum(1, max_episode_steps=1))
    env.reset()
    with pytest.raises(SpaceError, match=r"action must fit Box.*got shape \[2\]"):
        env.step(np.zeros(2, np.float32))
    obs, reward, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
    assert truncated and not terminated and obs.shape == (3,)
    # An episodic env's episode is over: the simulator asks for a reset.
    with pytest.raises(EnvStateError, match=r"call env.reset\(\)"):
        env.step(np.zeros(1, np.float32))
    env.close()
    env.close()


# ----------------------------------------------------------------------------- the vector env's API
@pytest.mark.parametrize("output", ["torch", "numpy"])
@pytest.mark.parametrize("name", list(SIMS))
def test_vector_env_api(name, output):
    n = 5
    envs = to_gymnasium(SIMS[name](n, seed=0, autoreset=True), output=output)
    assert isinstance(envs, gym.vector.VectorEnv) and isinstance(envs, GymnasiumVectorEnv)
    assert envs.num_envs == n and envs.metadata["autoreset_mode"] == SAME_STEP
    assert envs.single_observation_space == envs.env.observation_space
    assert envs.single_action_space == envs.env.action_space
    assert envs.observation_space == gym.vector.utils.batch_space(envs.single_observation_space, n)
    assert envs.action_space == gym.vector.utils.batch_space(envs.single_action_space, n)
    for space in (envs.single_observation_space, envs.observation_space):
        check_observation_space(space)
    for space in (envs.single_action_space, envs.action_space):
        check_action_space(space)
    assert repr(envs).startswith("GymnasiumVectorEnv(")
    obs, infos = envs.reset(seed=0)
    assert infos == {}
    envs.action_space.seed(0)
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    if output == "numpy":
        assert obs.dtype == np.float32 and obs.shape == envs.observation_space.shape
        assert rewards.dtype == np.float64 and terminations.dtype == np.bool_ and truncations.dtype == np.bool_
    else:
        assert isinstance(obs, torch.Tensor) and obs.dtype == torch.float32
        assert obs.shape == envs.observation_space.shape
        assert rewards.dtype == torch.float32 and terminations.dtype == torch.bool and truncations.dtype == torch.bool
    assert rewards.shape == terminations.shape == truncations.shape == (n,)
    envs.close()


def test_passive_checkers_on_the_vector_env():
    envs = to_gymnasium(Acrobot(6, seed=0, autoreset=True, max_episode_steps=7), output="numpy")
    calls = []
    assert _warnings_of(lambda: calls.append(env_reset_passive_checker(envs, seed=1))) == set()
    rng = np.random.default_rng(0)

    def run():
        for _ in range(20):
            obs, rewards, terminations, truncations, infos = envs.step(_actions(envs.single_action_space, 6, rng))
            check_obs(obs, envs.observation_space, "step")
            assert isinstance(infos, dict) and np.isfinite(rewards).all()
            calls.append((obs, infos))

    assert _warnings_of(run) == set()
    # gymnasium's data-reuse check: no two calls hand out the same buffer (users keep what they get).
    for i in range(len(calls)):
        for j in range(i + 1, len(calls)):
            assert not data_shares_objects(calls[i], calls[j])


def test_torch_output_hands_out_fresh_tensors():
    envs = to_gymnasium(CartPole(4, seed=0, autoreset=True, max_episode_steps=3))
    out = [envs.reset()[0]]
    for _ in range(5):
        obs, rewards, terminations, truncations, infos = envs.step(torch.zeros(4, dtype=torch.int64))
        out += [obs, rewards, terminations, truncations, infos["final_obs"], infos["_final_obs"]]
    # No two tensors handed out share a byte (rows of one allocation may share a storage, not memory).
    assert all(t.is_contiguous() for t in out)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in out)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


# ----------------------------------------------------------------------------- SAME_STEP semantics
@pytest.mark.parametrize("output", ["torch", "numpy"])
@pytest.mark.parametrize("device", device_params())
def test_same_step_semantics_against_the_simulator(output, device):
    n, seed = 16, 5
    envs = to_gymnasium(CartPole(n, device=device, seed=seed, autoreset=True, max_episode_steps=12), output=output)
    twin = CartPole(n, device=device, seed=seed, autoreset=True, max_episode_steps=12)
    obs, _ = envs.reset()
    twin_obs, _ = twin.reset()
    host = (lambda x: x) if output == "numpy" else (lambda x: x.cpu().numpy())
    np.testing.assert_array_equal(host(obs), twin_obs["frame"].cpu().numpy())
    gen = torch.Generator().manual_seed(0)
    n_term = n_trunc = 0
    for _ in range(60):
        a = torch.randint(0, 2, (n,), generator=gen)
        step_a = a.numpy() if output == "numpy" else a.to(device)
        obs, rewards, terminations, truncations, infos = envs.step(step_a)
        (nxt, _), (run, _) = twin.step(DictTensor({"action": a.to(device)}))
        done = nxt["done"].cpu().numpy()
        np.testing.assert_array_equal(host(obs), run["frame"].cpu().numpy())
        np.testing.assert_array_equal(host(rewards), nxt["reward"].cpu().numpy())
        np.testing.assert_array_equal(host(terminations), nxt["terminated"].cpu().numpy())
        np.testing.assert_array_equal(host(truncations), nxt["truncated"].cpu().numpy())
        terminal = nxt["frame"].cpu().numpy()
        if output == "torch":
            assert sorted(infos) == ["_final_info", "_final_obs", "final_info", "final_obs"]
            assert infos["final_obs"].device == obs.device == torch.device(device)
            np.testing.assert_array_equal(host(infos["_final_obs"]), done)
            np.testing.assert_array_equal(host(infos["_final_info"]), done)
            np.testing.assert_array_equal(host(infos["final_obs"])[done], terminal[done])
        elif done.any():
            assert infos["final_obs"].dtype == object and infos["final_info"] == {}
            np.testing.assert_array_equal(infos["_final_obs"], done)
            np.testing.assert_array_equal(infos["_final_info"], done)
            assert all(infos["final_obs"][i] is None for i in np.flatnonzero(~done))
            np.testing.assert_array_equal(np.stack(infos["final_obs"][done]), terminal[done])
        else:
            assert infos == {}
        n_term += int(nxt["terminated"].sum())
        n_trunc += int(nxt["truncated"].sum())
    assert n_term > 0 and n_trunc > 0


def _leaves_as_arrays(data):
    """Python and numpy scalars as 0-d arrays (gymnasium keeps a Discrete observation as a Python int)."""
    if isinstance(data, dict):
        return {k: _leaves_as_arrays(v) for k, v in data.items()}
    if isinstance(data, tuple):
        return tuple(_leaves_as_arrays(v) for v in data)
    if isinstance(data, np.ndarray) and data.dtype == object:
        out = np.empty(data.shape, dtype=object)
        out[...] = np.fromiter((_leaves_as_arrays(v) for v in data.flat), dtype=object, count=data.size)
        return out
    if isinstance(data, (bool, int, float, np.generic)):
        return np.asarray(data)
    return data


@pytest.mark.parametrize(
    "make",
    [lambda: gym.make("CartPole-v1", max_episode_steps=30), lambda: DictImageEnv(length=5)],
    ids=["CartPole", "Dict-observation"],
)
def test_numpy_output_equals_gymnasium_sync_vector_env(make):
    """gymnasium envs -> GymEnvInf -> to_gymnasium give exactly what gymnasium's SAME_STEP SyncVectorEnv gives."""
    n, seed = 4, 7
    ours = to_gymnasium(GymEnvInf([make() for _ in range(n)], seed), output="numpy")
    theirs = gym.vector.SyncVectorEnv([make for _ in range(n)], autoreset_mode=SAME_STEP)
    assert ours.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"]
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    assert data_equivalence(ours.reset(), theirs.reset(seed=env_seeds(seed, n)), exact=True)
    theirs.action_space.seed(0)
    finished = 0
    for _ in range(100):
        a = theirs.action_space.sample()
        got, want = ours.step(a), theirs.step(a)
        assert data_equivalence(_leaves_as_arrays(got), _leaves_as_arrays(want), exact=True), (got, want)
        finished += int(got[2].sum() + got[3].sum())
    assert finished > 10


def test_gymnasium_episode_statistics_wrapper():
    n = 8
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        to_gymnasium(CartPole(n, seed=2, autoreset=True), output="numpy")
    )
    twin = CartPole(n, seed=2, autoreset=True)
    envs.reset()
    twin.reset()
    length = np.zeros(n, dtype=np.int64)
    expected, reported = [], []
    for _ in range(120):
        a = np.ones(n, dtype=np.int64)
        _, _, _, _, infos = envs.step(a)
        (nxt, _), _ = twin.step(DictTensor({"action": torch.from_numpy(a)}))
        done = nxt["done"].numpy()
        length += 1
        expected += length[done].tolist()
        length[done] = 0
        if "episode" in infos:
            reported += infos["episode"]["l"][infos["_episode"]].tolist()
    assert len(expected) > 10 and reported == expected


# ----------------------------------------------------------------------------- seeding
@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_reset_seed_is_reproducible(output):
    n = 6

    def rollout(envs, steps=40):
        out = [np.asarray(envs.reset(seed=21)[0])]
        for t in range(steps):
            out.append(np.asarray(envs.step(np.full(n, t % 2))[0]))
        return np.stack(out)

    envs = to_gymnasium(Acrobot(n, seed=0, autoreset=True, max_episode_steps=9), output=output)
    first = rollout(envs)
    envs.step(np.zeros(n, dtype=np.int64))
    np.testing.assert_array_equal(rollout(envs), first)
    # The same as a simulator built with that seed; another seed differs.
    fresh = to_gymnasium(Acrobot(n, seed=21, autoreset=True, max_episode_steps=9), output=output)
    out = [np.asarray(fresh.reset()[0])] + [np.asarray(fresh.step(np.full(n, t % 2))[0]) for t in range(40)]
    np.testing.assert_array_equal(np.stack(out), first)
    assert not np.array_equal(np.asarray(envs.reset(seed=22)[0]), first[0])
    # gymnasium's check_env pattern: reset(seed) then reset() replays too.
    a = [np.asarray(envs.reset(seed=3)[0]), np.asarray(envs.reset()[0])]
    b = [np.asarray(envs.reset(seed=3)[0]), np.asarray(envs.reset()[0])]
    np.testing.assert_array_equal(a, b)
    assert envs.np_random_seed == 3


def test_reset_seed_through_device_env():
    inner = CartPole(3, seed=0, autoreset=True)
    envs = to_gymnasium(DeviceEnv(inner, "cpu", "cpu"), output="numpy")
    obs, _ = envs.reset(seed=9)
    np.testing.assert_array_equal(obs, CartPole(3, seed=9).reset()[0]["frame"].numpy())


def test_reset_seed_and_options_errors():
    envs = to_gymnasium(CartPole(2, autoreset=True))
    with pytest.raises(SeedError, match=r"seed must be an int in \[0, 2\*\*31\), got -1"):
        envs.reset(seed=-1)
    with pytest.raises(SeedError, match=r"seed must be an int in .* got list \[1, 2\]"):
        envs.reset(seed=[1, 2])
    with pytest.raises(SeedError, match=r"got 2147483648; pass a non-negative int below 2147483648"):
        envs.reset(seed=2**31)
    with pytest.raises(BridgeError, match=r"options \['foo'\] are not supported; options may only hold 'env_info'"):
        envs.reset(options={"foo": 1})
    with pytest.raises(BridgeError, match=r"partial resets are not needed"):
        envs.reset(options={"reset_mask": np.ones(2, dtype=bool)})
    with pytest.raises(TypeError, match=r"options must be a dict or None"):
        envs.reset(options=[1])
    obs, _ = envs.reset(options={"env_info": DictTensor({"x": torch.zeros(2)})})
    assert obs.shape == (2, 4)
    gym_envs = to_gymnasium(GymEnvInf([gym.make("CartPole-v1") for _ in range(2)], seed=0))
    with pytest.raises(BridgeError, match=r"torch simulators only, got GymEnvInf.*reset\(\) without a seed"):
        gym_envs.reset(seed=1)


# ----------------------------------------------------------------------------- construction errors, lifecycle
def test_construction_errors():
    with pytest.raises(BridgeError, match=r"needs an auto-reset env.*build it with autoreset=True"):
        to_gymnasium(CartPole(2))
    with pytest.raises(BridgeError, match=r"needs an auto-reset env"):
        to_gymnasium(make_env("CartPole-v1", 2, backend="gymnasium"))
    with pytest.raises(BridgeError, match=r"output must be one of \['torch', 'numpy'\], got 'jax'"):
        to_gymnasium(CartPole(2, autoreset=True), output="jax")
    with pytest.raises(TypeError, match=r"takes an rlstruct VecEnv.*got SyncVectorEnv"):
        to_gymnasium(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))


def test_close_and_state_errors():
    with to_gymnasium(CartPole(2, autoreset=True), output="numpy") as envs:
        with pytest.raises(EnvStateError, match=r"before reset\(\)"):
            envs.step(np.zeros(2, dtype=np.int64))
        envs.reset()
    assert envs.closed
    envs.close()
    with pytest.raises(EnvStateError, match=r"is closed; build a new one"):
        envs.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(EnvStateError, match=r"is closed"):
        envs.reset()


def test_box_actions_both_outputs():
    for output in ("torch", "numpy"):
        envs = to_gymnasium(Pendulum(3, seed=0, autoreset=True, max_episode_steps=4), output=output)
        envs.reset(seed=0)
        envs.action_space.seed(0)
        for _ in range(5):
            obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        assert tuple(obs.shape) == (3, 3)
        obs, *_ = envs.step(torch.zeros(3, 1))
        assert tuple(obs.shape) == (3, 3)


def test_torch_output_reads_nothing_on_the_host(monkeypatch):
    envs = to_gymnasium(CartPole(8, seed=0, autoreset=True, max_episode_steps=5))
    envs.reset()
    a = torch.ones(8, dtype=torch.int64)

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor in a torch-output step")

    numpy_view = torch.Tensor.numpy

    def numpy_in_cpu_kernels_only(self, *args, **kwargs):
        # The simulators' CPU step and its action copy view CPU tensors through numpy (zero-copy, no device
        # involved); anywhere else, and in the bridge above all, .numpy() would be a host read on an accelerator.
        caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
        host_modules = ("envs/_torch_env.py", "envs/_steppers.py", "envs/_sim_io.py", "envs/_actions.py")
        if self.device.type != "cpu" or not caller.endswith(host_modules):
            forbidden()
        return numpy_view(self, *args, **kwargs)

    for name in ("item", "tolist", "cpu", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    monkeypatch.setattr(torch.Tensor, "numpy", numpy_in_cpu_kernels_only)
    for _ in range(8):
        envs.step(a)
    monkeypatch.undo()
    obs, rewards, *_ = envs.step(a)
    assert obs.shape == (8, 4)


# ----------------------------------------------------------------------------- reverse direction: EnvPool
@pytest.mark.filterwarnings("ignore:EnvPool seeds are fixed")  # GymEnv seeds the first reset; envpool at make
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting to float32")  # envpool's own spaces
def test_envpool_through_gym_env():
    envpool = pytest.importorskip("envpool",
                                  reason="the envpool extra is not installed: pip install 'rlstruct[envpool]'")
    n = 6
    for env in (
        GymEnv(envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=0), seed=0),
        make_env("CartPole-v1", n, backend="envpool", seed=0),
    ):
        obs, ids = env.reset()
        assert obs["frame"].shape == (n, 4) and obs["frame"].dtype == torch.float32 and ids.tolist() == list(range(n))
        finished = 0
        while len(ids):
            (nxt, done_ids), (obs, ids) = env.step(DictTensor({"action": torch.zeros(len(ids), dtype=torch.int64)}))
            assert set(ids.tolist()) <= set(done_ids.tolist())
            term = nxt["terminated"]
            # The terminal observation, not envpool's next-step reset one: the pole or the cart is out of bounds.
            x, theta = nxt["frame"][term, 0], nxt["frame"][term, 2]
            assert bool(((x.abs() > 2.4) | (theta.abs() > 12 * 2 * np.pi / 360)).all())
            assert bool((obs["done"] == 0).all())
            finished += int(nxt["done"].sum())
        assert finished == n
        env.close()


# ----------------------------------------------------------------------------- SB3 learns through the bridge
@pytest.mark.slow
def test_sb3_ppo_learns_on_bridged_cartpole():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecEnv as SB3VecEnv

    from benchmarks._common import logging_nowhere

    class SB3Adapter(SB3VecEnv):
        """SB3's VecEnv API over a SAME_STEP gymnasium vector env (numpy output)."""

        def __init__(self, envs):
            self.envs = envs
            super().__init__(envs.num_envs, envs.single_observation_space, envs.single_action_space)

        def reset(self):
            obs, _ = self.envs.reset(seed=self._seeds[0])
            self._reset_seeds()
            return obs

        def step_async(self, actions):
            self._actions = actions

        def step_wait(self):
            obs, rewards, terminations, truncations, infos = self.envs.step(self._actions)
            dones = terminations | truncations
            out = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(dones):
                out[i]["terminal_observation"] = infos["final_obs"][i]
                out[i]["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
            return obs, rewards.astype(np.float32), dones, out

        def close(self):
            self.envs.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self.envs, attr_name)] * len(list(self._get_indices(indices)))

        def set_attr(self, attr_name, value, indices=None):
            raise NotImplementedError

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            raise NotImplementedError

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(list(self._get_indices(indices)))

    def mean_episode_length(policy, n=64):
        envs = gym.wrappers.vector.RecordEpisodeStatistics(
            to_gymnasium(CartPole(n, seed=123, autoreset=True), output="numpy")
        )
        obs, _ = envs.reset()
        lengths, seen = np.zeros(n), np.zeros(n, dtype=bool)
        while not seen.all():
            obs, _, _, _, infos = envs.step(policy(obs))
            if "_episode" in infos:
                new = infos["_episode"] & ~seen
                lengths[new] = infos["episode"]["l"][new]
                seen |= new
        return lengths.mean()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        venv = SB3Adapter(to_gymnasium(CartPole(8, seed=0, autoreset=True), output="numpy"))
        model = logging_nowhere(PPO("MlpPolicy", venv, n_steps=128, batch_size=256, learning_rate=1e-3, seed=0,
                                    device="cpu"))
        model.learn(total_timesteps=4096)
        rng = np.random.default_rng(0)
        random_length = mean_episode_length(lambda obs: rng.integers(0, 2, len(obs)))
        trained_length = mean_episode_length(lambda obs: model.predict(obs, deterministic=True)[0])
    finally:
        torch.set_num_threads(threads)
    assert trained_length > 2 * random_length, (trained_length, random_length)


def test_dict_observations_torch_output():
    envs = to_gymnasium(GymEnvInf([DictImageEnv(length=2) for _ in range(3)], seed=0))
    obs, _ = envs.reset()
    assert sorted(obs) == sorted(envs.single_observation_space.spaces) and obs["image"].dtype == torch.uint8
    envs.step(torch.zeros(3, 2, dtype=torch.int64))
    obs, rewards, terminations, truncations, infos = envs.step(torch.ones(3, 2, dtype=torch.int64))
    assert terminations.all() and infos["_final_obs"].all()
    assert (infos["final_obs"]["count"] == 2).all() and (obs["count"] == 0).all()
