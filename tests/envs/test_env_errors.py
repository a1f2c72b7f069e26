"""One error type per situation, whichever env raises it (the table of ``rlstruct/errors.py``).

Each situation is one test parametrized over every env implementation: the gymnasium adapters (a list of
envs and a vector env, episodic and auto-reset, NEXT_STEP vector envs auto-reset by the adapter), DeviceEnv, the
torch simulators (auto-reset and episodic), ``make_env`` for each backend (ale, gymnax and brax skip when their
package is absent), the JAX adapter, and the gymnasium bridge (``to_gymnasium``, ``to_gymnasium_env``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor, _accel
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
from rlstruct.errors import ActionRangeError, EnvStateError, SeedError, SpaceError
from rlstruct.seeding import MAX_SEED, env_seeds
from tests import fakes_gym
from tests.atari_pool import ATARI_POOL, make_atari_env
from tests.fakes_accel import RecordingAccelerator

N = 2
SIMS = {"CartPole": CartPole, "Acrobot": Acrobot, "MountainCar": MountainCar, "Pendulum": Pendulum}


def _same_step_vector(n: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def _envpool_env(seed: int, **kwargs):
    # envpool itself is not installed here: its stand-in has envpool's gymnasium API.
    saved = sys.modules.get("envpool")
    sys.modules["envpool"] = fakes_gym.fake_envpool_module()
    try:
        return make_env("CartPole-v1", N, backend="envpool", seed=seed, **kwargs)
    finally:
        if saved is None:
            del sys.modules["envpool"]
        else:
            sys.modules["envpool"] = saved


def _ale(seed: int, **kwargs):
    pytest.importorskip("ale_py", reason="the atari extra is not installed: pip install 'rlstruct[atari]'")
    return make_atari_env("ALE/Breakout-v5", N, backend="ale", seed=seed, backend_kwargs={"num_threads": 1}, **kwargs)


@pytest.fixture(autouse=True)
def _lend_atari_envs():
    with ATARI_POOL.lending():
        yield


def _gymnax(seed: int, **kwargs):
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    return make_env("CartPole-v1", N, backend="gymnax", seed=seed, **kwargs)


def _brax(seed: int, **kwargs):
    pytest.importorskip("brax", reason="the brax extra is not installed: pip install 'rlstruct[brax]'")
    return make_env("fast", N, backend="brax", seed=seed, **kwargs)


def _next_step_vector(seed: int):
    return GymEnvInf(fakes_gym.NextStepVectorEnv([gym.make("CartPole-v1") for _ in range(N)]), seed)


# Every VecEnv implementation, built with a given seed.
VEC_ENVS: dict[str, Callable[[int], object]] = {
    "GymEnv-list": lambda seed: GymEnv([gym.make("CartPole-v1") for _ in range(N)], seed),
    "GymEnv-vector": lambda seed: GymEnv(gym.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point"), seed),
    "GymEnvInf-list": lambda seed: GymEnvInf([gym.make("CartPole-v1") for _ in range(N)], seed),
    "GymEnvInf-vector": lambda seed: GymEnvInf(_same_step_vector(N), seed),
    "DeviceEnv-GymEnvInf": lambda seed: DeviceEnv(GymEnvInf([gym.make("CartPole-v1") for _ in range(N)], seed), "cpu",
                                                  "cpu"),
    "DeviceEnv-CartPole": lambda seed: DeviceEnv(CartPole(N, seed=seed, autoreset=True), "cpu", "cpu"),
    **{
        f"{name}-{mode}": (lambda cls, auto: lambda seed: cls(N, seed=seed, autoreset=auto))(cls, mode == "autoreset")
        for name, cls in SIMS.items()
        for mode in ("autoreset", "episodic")
    },
    "make_env-torch": lambda seed: make_env("CartPole-v1", N, backend="torch", seed=seed),
    "make_env-gymnasium": lambda seed: make_env("CartPole-v1", N, backend="gymnasium", seed=seed),
    "make_env-gymnasium-autoreset": lambda seed: make_env("CartPole-v1", N, backend="gymnasium", seed=seed,
                                                          autoreset=True),
    "make_env-envpool": _envpool_env,
    "make_env-envpool-autoreset": lambda seed: _envpool_env(seed, autoreset=True),
    "GymEnvInf-next-step-vector": _next_step_vector,
    "make_env-ale": _ale,
    "make_env-ale-autoreset": lambda seed: _ale(seed, autoreset=True),
    "make_env-gymnax": _gymnax,
    "make_env-gymnax-autoreset": lambda seed: _gymnax(seed, autoreset=True),
    "make_env-brax": _brax,
    "make_env-brax-autoreset": lambda seed: _brax(seed, autoreset=True),
}

# The bridge, over an auto-reset simulator and over a gymnasium adapter.
BRIDGES: dict[str, Callable[[], object]] = {
    "to_gymnasium-CartPole": lambda: to_gymnasium(CartPole(N, autoreset=True), output="numpy"),
    "to_gymnasium-CartPole-torch": lambda: to_gymnasium(CartPole(N, autoreset=True), output="torch"),
    "to_gymnasium-GymEnvInf": lambda: to_gymnasium(GymEnvInf([gym.make("CartPole-v1") for _ in range(N)], 0)),
    "to_gymnasium_env-CartPole": lambda: to_gymnasium_env(CartPole(1)),
    "to_gymnasium_env-Pendulum": lambda: to_gymnasium_env(Pendulum(1, autoreset=True)),
    "to_gymnasium_env-GymEnv": lambda: to_gymnasium_env(GymEnv([gym.make("CartPole-v1")], 0)),
}


def _zero_action(env, discrete: torch.dtype, box: torch.dtype) -> DictTensor:
    """Zero actions for every env: ``discrete`` for a Discrete action space, ``box`` for a Box."""
    space, n = env.action_space, env.n_envs()
    if isinstance(space, spaces.Discrete):
        a = torch.zeros(n, dtype=discrete)
    else:
        a = torch.zeros((n,) + tuple(space.shape), dtype=box)
    return DictTensor({"action": a.to(env.device)})


def valid_action(env) -> DictTensor:
    return _zero_action(env, torch.int64, torch.float32)


def misfit_action(env) -> DictTensor:
    """An action of the wrong dtype kind for the action space (floats for Discrete, ints for Box)."""
    return _zero_action(env, torch.float32, torch.int64)


def bridge_action(env):
    return env.action_space.sample()


def bridge_misfit_action(env) -> np.ndarray:
    """Vector bridge: one row per env of the wrong dtype kind; single env: the wrong number of elements."""
    if not hasattr(env, "num_envs"):
        return np.zeros(5, dtype=np.float32)
    space = env.single_action_space
    if isinstance(space, spaces.Discrete):
        return np.zeros(env.num_envs, dtype=np.float32)
    return np.zeros((env.num_envs,) + tuple(space.shape), dtype=np.int64)


# ----------------------------------------------------------------------------- step before reset, after close
@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_step_before_reset_is_an_env_state_error(make):
    env = make(0)
    with pytest.raises(EnvStateError, match=r"before reset\(\); call env.reset\(\) first"):
        env.step(valid_action(env))


@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_step_and_reset_after_close_are_env_state_errors(make):
    env = make(0)
    env.reset()
    env.close()
    env.close()  # idempotent
    with pytest.raises(EnvStateError, match=r"is closed; build a new one"):
        env.step(valid_action(env))
    with pytest.raises(EnvStateError, match=r"is closed; build a new one"):
        env.reset()


@pytest.mark.parametrize("make", BRIDGES.values(), ids=BRIDGES.keys())
def test_bridge_step_before_reset_and_after_close_are_env_state_errors(make):
    env = make()
    with pytest.raises(EnvStateError, match=r"before reset\(\); call env.reset\(\) first"):
        env.step(bridge_action(env))
    env.reset()
    env.step(bridge_action(env))
    env.close()
    with pytest.raises(EnvStateError, match=r"is closed; build a new one"):
        env.step(bridge_action(env))
    with pytest.raises(EnvStateError, match=r"is closed"):
        env.reset()


# Episodic envs whose episodes end after 3 steps.
EPISODIC: dict[str, Callable[[], object]] = {
    "GymEnv-list": lambda: GymEnv([gym.make("CartPole-v1", max_episode_steps=3) for _ in range(N)], 0),
    "GymEnv-vector": lambda: GymEnv(
        gym.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point", max_episode_steps=3), 0
    ),
    "DeviceEnv-GymEnv": lambda: DeviceEnv(GymEnv([gym.make("CartPole-v1", max_episode_steps=3) for _ in range(N)], 0),
                                          "cpu", "cpu"),
    **{name: (lambda cls: lambda: cls(N, max_episode_steps=3))(cls) for name, cls in SIMS.items()},
    "make_env-torch": lambda: make_env("CartPole-v1", N, backend="torch", max_episode_steps=3),
    "make_env-gymnasium": lambda: make_env("CartPole-v1", N, backend="gymnasium", max_episode_steps=3),
    "make_env-envpool": lambda: _envpool_env(0, max_episode_steps=3),
    "make_env-ale": lambda: _ale(0, max_episode_steps=3),
    "make_env-gymnax": lambda: _gymnax(0, max_episode_steps=3),
    "make_env-brax": lambda: _brax(0, max_episode_steps=3),
}


@pytest.mark.parametrize("make", EPISODIC.values(), ids=EPISODIC.keys())
def test_step_once_every_episodic_env_has_finished_is_an_env_state_error(make):
    env = make()
    _, ids = env.reset()
    for _ in range(3):
        _, (_, ids) = env.step(DictTensor({k: v[: ids.shape[0]] for k, v in valid_action(env).items()}))
    assert ids.shape == (0,)
    with pytest.raises(EnvStateError, match=r"every one of the 2 episodic envs has finished; call env.reset\(\)"):
        env.step(DictTensor({k: v[:0] for k, v in valid_action(env).items()}))
    assert env.reset()[1].tolist() == list(range(N))


@pytest.mark.parametrize(
    "make",
    [lambda: to_gymnasium_env(CartPole(1, max_episode_steps=2)),
     lambda: to_gymnasium_env(GymEnv([gym.make("CartPole-v1", max_episode_steps=2)], 0))],
    ids=["to_gymnasium_env-CartPole", "to_gymnasium_env-GymEnv"],
)
def test_bridge_step_after_an_episodic_episode_is_an_env_state_error(make):
    env = make()
    env.reset()
    for _ in range(2):
        *_, truncated, _ = env.step(bridge_action(env))
    assert truncated
    with pytest.raises(EnvStateError, match=r"episodic envs has finished; call env.reset\(\)"):
        env.step(bridge_action(env))


# ----------------------------------------------------------------------------------------------- bad seeds
BAD_SEEDS = [
    (-1, r"seed must be an int in \[0, 2\*\*31\), got -1; pass a non-negative int below 2147483648"),
    (2**31, r"seed must be an int in \[0, 2\*\*31\), got 2147483648"),
    (1.5, r"seed must be an int in \[0, 2\*\*31\), got float 1.5; pass e.g. seed=0"),
    (True, r"seed must be an int in \[0, 2\*\*31\), got the bool True"),
]


@pytest.mark.parametrize("seed, match", BAD_SEEDS, ids=["negative", "2**31", "float", "bool"])
@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_a_bad_seed_is_a_seed_error(make, seed, match):
    with pytest.raises(SeedError, match=match):
        make(seed)


@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_the_largest_seed_is_accepted(make):
    env = make(MAX_SEED)
    obs, ids = env.reset()
    assert ids.shape == (N,)


@pytest.mark.parametrize("seed, match", BAD_SEEDS, ids=["negative", "2**31", "float", "bool"])
@pytest.mark.parametrize("make", BRIDGES.values(), ids=BRIDGES.keys())
def test_a_bad_bridge_reset_seed_is_a_seed_error(make, seed, match):
    env = make()
    with pytest.raises(SeedError, match=match):
        env.reset(seed=seed)


def test_every_derived_env_seed_fits_a_c_int():
    seeds = [s for base in (0, 1, MAX_SEED) for s in env_seeds(base, 64)]
    assert all(0 <= s <= MAX_SEED for s in seeds) and len(set(seeds)) == len(seeds)


# ----------------------------------------------------------------------------------------------- spaces
UNSUPPORTED = {
    "GymEnv-list": lambda env: GymEnv([env], 0),
    "GymEnv-vector": lambda env: GymEnv(gym.vector.SyncVectorEnv([lambda: env]), 0),
    "GymEnvInf-list": lambda env: GymEnvInf([env], 0),
    "GymEnvInf-vector": lambda env: GymEnvInf(
        gym.vector.SyncVectorEnv([lambda: env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP), 0
    ),
}


@pytest.mark.parametrize("build", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
@pytest.mark.parametrize(
    "obs_space, act_space, match",
    [
        (spaces.Tuple([spaces.Discrete(2)]), spaces.Discrete(2), "observation_space must be a Box, Discrete"),
        (spaces.Box(0, 1, (2,)), spaces.MultiBinary(3), "action_space must be Discrete, Box or MultiDiscrete"),
    ],
    ids=["tuple-observation", "multibinary-action"],
)
def test_an_unsupported_space_is_a_space_error(build, obs_space, act_space, match):
    with pytest.raises(SpaceError, match=match):
        build(fakes_gym.SpaceEnv(obs_space, act_space))


@pytest.mark.parametrize(
    "obs_space, act_space, match",
    [
        (spaces.Tuple([spaces.Discrete(2)]), spaces.Discrete(2), "observation_space must be a Box space"),
        (spaces.Box(0, 1, (2,)), spaces.MultiBinary(3), "action_space must be Discrete or Box"),
    ],
    ids=["tuple-observation", "multibinary-action"],
)
def test_an_unsupported_space_of_a_jax_env_is_a_space_error(obs_space, act_space, match):
    pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    from rlstruct.envs import JaxVecEnv

    with pytest.raises(SpaceError, match=match):
        JaxVecEnv(lambda key: None, lambda key, state, action: None, obs_space, act_space, N)


def test_make_env_with_an_unsupported_space_is_a_space_error():
    with pytest.raises(SpaceError, match=r"observation_space must be a Box, Discrete.*Tuple"):
        make_env("Blackjack-v1", N, backend="gymnasium")


@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_an_action_that_does_not_fit_the_space_is_a_space_error(make):
    env = make(0)
    env.reset()
    with pytest.raises(SpaceError, match=r"action\['action'\] must (have|be) "):
        env.step(misfit_action(env))


@pytest.mark.parametrize("make", BRIDGES.values(), ids=BRIDGES.keys())
def test_a_bridge_action_that_does_not_fit_the_space_is_a_space_error(make):
    env = make()
    env.reset()
    with pytest.raises(SpaceError, match=r"action(\['action'\])? must"):
        env.step(bridge_misfit_action(env))


# ------------------------------------------------------------------------------------- action values
def out_of_range_action(env) -> tuple[DictTensor, str]:
    """An action outside the action space (a Discrete's row 0 above it and row 1 below, a Box's row 1 NaN), and what
    the message must say of it: the space, the range, the values and the env ids."""
    space, n = env.action_space, env.n_envs()
    if isinstance(space, spaces.Discrete):
        a = torch.tensor([space.n, -1])
        match = (rf"action\['action'\] must be in Discrete\({space.n}\), the integers in \[0, {space.n - 1}\], "
                 rf"got {space.n}, -1 at env ids 0, 1 \(2 of 2 rows\)")
    else:
        a = torch.zeros((n,) + tuple(space.shape))
        a[1] = float("nan")
        match = r"action\['action'\] must be in Box\(.*finite values.*got \[nan.* at env ids 1 \(1 of 2 rows\)"
    return DictTensor({"action": a.to(env.device)}), match


@pytest.mark.parametrize("make", VEC_ENVS.values(), ids=VEC_ENVS.keys())
def test_an_action_outside_the_space_is_an_action_range_error(make):
    env = make(0)
    env.reset()
    action, match = out_of_range_action(env)
    with pytest.raises(ActionRangeError, match=match + r"; .*(never clamped|check the policy's outputs)"):
        env.step(action)
    assert env.deferred_action_check() is None  # checked at once on the CPU
    env.step(valid_action(env))  # the refused step left the env as it was
    env.close()


EPISODIC_THREE: dict[str, Callable[[], object]] = {
    **{name: (lambda cls: lambda: cls(3))(cls) for name, cls in SIMS.items()},
    "GymEnv": lambda: GymEnv([gym.make("CartPole-v1") for _ in range(3)], 0),
}


@pytest.mark.parametrize("make", EPISODIC_THREE.values(), ids=EPISODIC_THREE.keys())
def test_an_episodic_env_names_the_running_env_ids(make):
    env = make()
    env.reset()
    if isinstance(env, GymEnv):
        env._running = env._running[[0, 2]]  # env 1 has finished
    else:
        state = env.get_state()
        state["running"][1] = False
        env.set_state(state)
    if isinstance(env.action_space, spaces.Discrete):
        a = torch.tensor([0, env.action_space.n])
    else:
        a = torch.tensor([[0.0], [float("-inf")]])
    with pytest.raises(ActionRangeError, match=r"at env ids 2 \(1 of 2 rows\)"):
        env.step(DictTensor({"action": a}))


@pytest.mark.parametrize(
    "make, bad",
    [(lambda: to_gymnasium(CartPole(N, autoreset=True), output="numpy"), np.array([0, 2])),
     (lambda: to_gymnasium(CartPole(N, autoreset=True), output="torch"), torch.tensor([-1, 0])),
     (lambda: to_gymnasium_env(CartPole(1)), 7),
     (lambda: to_gymnasium_env(Pendulum(1, autoreset=True)), np.array([np.inf], np.float32))],
    ids=["to_gymnasium-numpy", "to_gymnasium-torch", "to_gymnasium_env-CartPole", "to_gymnasium_env-Pendulum"],
)
def test_a_bridge_action_outside_the_space_is_an_action_range_error(make, bad):
    env = make()
    env.reset()
    with pytest.raises(ActionRangeError, match=r"action\['action'\] must be in (Discrete\(2\)|Box).* got "):
        env.step(bad)


def test_a_multidiscrete_action_is_checked_element_by_element():
    env = GymEnvInf([fakes_gym.SpaceEnv(spaces.Box(0, 1, (2,)), spaces.MultiDiscrete([3, 5], start=[1, 0]))
                     for _ in range(2)], 0)
    env.reset()
    env.step(DictTensor({"action": torch.tensor([[1, 0], [3, 4]])}))
    with pytest.raises(ActionRangeError, match=r"element k an integer in \[low\[k\], high\[k\]\] \(low \[1, 0\], "
                                               r"high \[3, 4\]\), got \[0, 4\] at env ids 1 \(1 of 2 rows\)"):
        env.step(DictTensor({"action": torch.tensor([[1, 0], [0, 4]])}))


def _mujoco_torch(seed: int, **kwargs):
    pytest.importorskip("mujoco_torch")
    return make_env("Hopper-v5", N, backend="mujoco_torch", seed=seed, **kwargs)


# Envs with a device of their own (an accelerator's, with the recording fake installed for the CPU).
ON_DEVICE: dict[str, Callable[[], object]] = {
    "CartPole": lambda: CartPole(N, autoreset=True),
    "Pendulum": lambda: Pendulum(N, autoreset=True),
    "DeviceEnv-Acrobot": lambda: DeviceEnv(Acrobot(N, autoreset=True), "cpu", "cpu"),
    "make_env-gymnax": lambda: _gymnax(0, autoreset=True),
}


@pytest.mark.parametrize("make", ON_DEVICE.values(), ids=ON_DEVICE.keys())
def test_on_an_accelerator_the_check_is_recorded_and_read_later_naming_the_step(make):
    with _accel.installed("cpu", RecordingAccelerator()):
        env = make()
    record = env.deferred_action_check()
    env.reset()
    bad, match = out_of_range_action(env)
    for t in range(4):
        env.step(bad if t in (1, 3) else valid_action(env))  # recorded on the device: no host read, no error
    n_bad = 2 if isinstance(env.action_space, spaces.Discrete) else 1
    with pytest.raises(ActionRangeError, match=match + rf" at step 1, the first of {2 * n_bad} offending rows over 4 "
                                                       r"steps \(of the last read\)"):
        record.check(" (of the last read)")
    record.check()  # the record was cleared
    env.step(valid_action(env))
    record.snapshot(" of acquisition 2")  # what a batcher does at the end of an acquisition, without a sync
    record.raise_pending(wait=True)


def test_mujoco_torch_defers_its_check_on_an_accelerator():
    # Not stepped here: a NaN action makes its solver run every iteration, for seconds.
    with _accel.installed("cpu", RecordingAccelerator()):
        env = _mujoco_torch(0, autoreset=True)
    assert env.deferred_action_check() is not None


def test_a_deferred_check_of_a_step_of_fewer_rows_counts_them():
    with _accel.installed("cpu", RecordingAccelerator()):
        env = CartPole(3)
    env.reset()
    env.step(DictTensor({"action": torch.tensor([0, 0, 0])}))
    state = env.get_state()
    state["running"][1] = False
    env.set_state(state)
    env.step(DictTensor({"action": torch.tensor([1, 9])}))
    with pytest.raises(ActionRangeError, match=r"must be in Discrete\(2\), the integers in \[0, 1\], got an "
                                               r"offending row at step 1, the first of 1 offending rows over 2 steps "
                                               r"\(the values"):
        env.deferred_action_check().check()
