"""CartPoleNoVel-v1: CartPole without its velocities, on the torch and gymnasium backends.

Oracle: for the same seed and actions, the partially observed env goes through CartPole's very states, and its
observation is CartPole's with the velocity columns dropped.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.algos import describe_env
from rlstruct.envs import CartPole, CartPoleNoVel, make_env
from tests.conftest import device_params

pytestmark = pytest.mark.timeout(120)
KEPT = [0, 2]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("autoreset", [True, False])
def test_torch_simulator_is_cartpole_without_velocities(device, autoreset):
    n, steps = 64, 120
    full = CartPole(n, device=device, seed=3, autoreset=autoreset, max_episode_steps=50)
    part = CartPoleNoVel(n, device=device, seed=3, autoreset=autoreset, max_episode_steps=50)
    assert part.observation_space.shape == (2,)
    obs_f, ids_f = full.reset()
    obs_p, ids_p = part.reset()
    assert torch.equal(obs_p["frame"], obs_f["frame"][:, KEPT])
    g = torch.Generator().manual_seed(0)
    ended = 0
    for _ in range(steps):
        if ids_f.numel() == 0:
            break
        a = torch.randint(0, 2, (ids_f.numel(),), generator=g).to(device)
        (nf, _), (obs_f, ids_f) = full.step(DictTensor({"action": a}))
        (np_, _), (obs_p, ids_p) = part.step(DictTensor({"action": a}))
        assert torch.equal(np_["frame"], nf["frame"][:, KEPT])
        assert torch.equal(obs_p["frame"], obs_f["frame"][:, KEPT])
        for k in ("reward", "done", "terminated", "truncated"):
            assert torch.equal(np_[k], nf[k]), k
        assert torch.equal(ids_p, ids_f)
        ended += int(nf["done"].sum())
        assert torch.equal(part.get_state()["physics"], full.get_state()["physics"])
    assert ended > 0  # the comparison went through episode ends (and, with autoreset, restarts)


def test_gymnasium_env_is_cartpole_without_velocities():
    full, part = gym.make("CartPole-v1"), gym.make("CartPoleNoVel-v1")
    assert part.spec.max_episode_steps == 500 and part.spec.reward_threshold == 475.0
    assert part.observation_space.shape == (2,)
    rng = np.random.default_rng(0)
    episodes = 0
    for episode in range(3):
        of, _ = full.reset(seed=episode)
        op, _ = part.reset(seed=episode)
        np.testing.assert_array_equal(op, of[KEPT])
        done = False
        while not done:
            a = int(rng.integers(2))
            of, rf, tf, uf, _ = full.step(a)
            op, rp, tp, up, _ = part.step(a)
            np.testing.assert_array_equal(op, of[KEPT])
            assert (rp, tp, up) == (rf, tf, uf)
            np.testing.assert_array_equal(part.unwrapped.state, full.unwrapped.state)
            done = tf or uf
        episodes += 1
    assert episodes == 3


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_both_backends_build_it_and_describe_it(backend):
    env = make_env("CartPoleNoVel-v1", 3, backend=backend, seed=0, autoreset=True)
    obs, _ = env.reset()
    assert obs["frame"].shape == (3, 2) and obs["frame"].dtype == torch.float32
    env.close()
    spec = describe_env("CartPoleNoVel-v1", backend, None)
    assert (spec.obs_shape, spec.n_actions, spec.max_episode_steps, spec.reward_threshold) == ((2,), 2, 500, 475.0)
