"""Simulators from the ecosystem as VecEnvs: NEXT_STEP vector envs auto-reset by the adapter, ale-py's
AtariVectorEnv (``backend="ale"``), gymnax through DLPack (``backend="gymnax"``).

The contract itself is checked in test_env_contract.py and the error types in test_env_errors.py; here, what is
particular to each backend: the NEXT_STEP adaptation against gymnasium envs stepped the reference way, ale-py's
seeds and frames, gymnax against rlstruct's torch CartPole from the same physical state.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import GymEnv, GymEnvInf, make_env
from rlstruct.errors import DeviceUnavailableError, MissingDependencyError, SpaceError
from rlstruct.seeding import env_seeds
from tests import fakes_gym
from tests.fakes_gym import NextStepVectorEnv, random_action


def act(a: torch.Tensor) -> DictTensor:
    return DictTensor({"action": a})


# ------------------------------------------------------------------------------------ NEXT_STEP adaptation
def vector_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a vector env's envs under GymEnv(seed): a vector env other than gymnasium's and ale-py's gets
    one int, with which NextStepVectorEnv seeds env ``k`` with ``int + k``."""
    return [env_seeds(seed, 1)[0] + k for k in range(n)]


def reference_rollout(make, n: int, seed: int, actions: list[np.ndarray]) -> list[tuple]:
    """Gymnasium envs stepped one by one, each reset as soon as it finishes: per step, the terminal observations
    (before any reset), rewards, flags, and the observations the envs act on next."""
    envs = [make() for _ in range(n)]
    [e.reset(seed=s) for e, s in zip(envs, vector_seeds(seed, n))]
    out = []
    for a in actions:
        nxt, running, rewards, terms, truncs = [], [], [], [], []
        for i, e in enumerate(envs):
            o, r, term, trunc, _ = e.step(a[i])
            nxt.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            running.append(e.reset()[0] if term or trunc else o)
        out.append((np.array(nxt), np.array(rewards, np.float32), np.array(terms), np.array(truncs),
                    np.array(running)))
    return out


@pytest.mark.parametrize("partial_rows", ["all", "reset"])
@pytest.mark.parametrize(
    "make",
    [lambda: gym.make("CartPole-v1", max_episode_steps=9), lambda: gym.make("Pendulum-v1", max_episode_steps=7),
     fakes_gym.DiscreteObsEnv],
    ids=["CartPole", "Pendulum", "DiscreteObs"],
)
@pytest.mark.parametrize("into", [False, True], ids=["step", "step_into"])
def test_next_step_vector_env_auto_resets_like_gymnasium_envs_stepped_one_by_one(make, partial_rows, into):
    """Over a NEXT_STEP vector env that resets a subset, GymEnvInf resets the finished envs right after the step:
    one step returns the terminal and the fresh observations, bit for bit those of gymnasium envs stepped and
    reset one by one, and the vector env never resets an env by itself (it has nothing pending)."""
    n, seed, steps = 3, 5, 40
    vec = NextStepVectorEnv([make() for _ in range(n)], partial_rows)
    env = GymEnvInf(vec, seed)
    space = env.action_space
    gen = torch.Generator().manual_seed(0)
    actions = [random_action(space, n, gen, "cpu")["action"] for _ in range(steps)]
    ref = reference_rollout(make, n, seed, [a.numpy() for a in actions])
    obs, _ = env.reset()
    first = [make().reset(seed=s)[0] for s in vector_seeds(seed, n)]
    np.testing.assert_array_equal(obs["frame"].numpy(), np.array(first).astype(obs["frame"].numpy().dtype))
    nxt, running = DictTensor({k: v.clone() for k, v in obs.items()}), DictTensor({k: v.clone() for k, v in
                                                                                   obs.items()})
    n_done = 0
    for a, (r_nxt, r_reward, r_term, r_trunc, r_running) in zip(actions, ref):
        if into:
            env.step_into(act(a), nxt, running)
        else:
            (nxt, _), (running, _) = env.step(act(a))
        np.testing.assert_array_equal(nxt["frame"].numpy(), r_nxt.astype(nxt["frame"].numpy().dtype))
        np.testing.assert_array_equal(running["frame"].numpy(), r_running.astype(running["frame"].numpy().dtype))
        np.testing.assert_array_equal(nxt["reward"].numpy(), r_reward)
        np.testing.assert_array_equal(nxt["terminated"].numpy(), r_term)
        np.testing.assert_array_equal(nxt["truncated"].numpy(), r_trunc)
        done = r_term | r_trunc
        assert np.array_equal(running["initial_state"].numpy(), done) and not running["done"].any()
        n_done += int(done.sum())
    assert n_done >= 3
    assert vec.n_resets == n + n_done  # the first reset, then one per finished episode, none by the vector env


def test_gymnasium_sync_vector_env_with_next_step_auto_resets():
    """gymnasium's own SyncVectorEnv (NEXT_STEP) resets a subset: GymEnvInf over it matches a list of envs."""
    def make():
        return gym.make("CartPole-v1", max_episode_steps=6)

    vec = gym.vector.SyncVectorEnv([make for _ in range(3)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    a, b = GymEnvInf(vec, 2), GymEnvInf([make() for _ in range(3)], 2)
    oa, ob = a.reset()[0], b.reset()[0]
    assert torch.equal(oa["frame"], ob["frame"])
    for _ in range(15):
        action = act(torch.ones(3, dtype=torch.int64))
        (na, _), (ra, _) = a.step(action)
        (nb, _), (rb, _) = b.step(action)
        for k in nb.keys():
            assert torch.equal(na[k], nb[k]) and torch.equal(ra[k], rb[k]), k


def test_a_next_step_vector_env_that_cannot_reset_a_subset_is_refused_for_autoreset():
    with pytest.raises(ValueError, match=r"cannot reset a subset.*reset_mask"):
        GymEnvInf(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"), 0)


# ------------------------------------------------------------------------------------------------ ale-py
def ale_env(n: int = 3, seed: int = 0, **kwargs):
    pytest.importorskip("ale_py", reason="the atari extra is not installed: pip install 'rlstruct[atari]'")
    kwargs.setdefault("backend_kwargs", {"num_threads": 1})
    return make_env("ALE/Breakout-v5", n, backend="ale", seed=seed, **kwargs)


def test_ale_autoreset_returns_the_terminal_and_the_fresh_frames_in_the_same_step():
    env = ale_env(autoreset=True, max_episode_steps=6)
    assert type(env) is GymEnvInf and env.writes_in_place()
    obs, _ = env.reset()
    assert obs["frame"].shape == (3, 4, 84, 84) and obs["frame"].dtype == torch.uint8
    # A fresh observation stacks the reset frame after three empty ones.
    assert not obs["frame"][:, :3].any() and obs["frame"][:, 3].any()
    for t in range(6):
        (nxt, ids), (running, _) = env.step(act(torch.full((3,), 1, dtype=torch.int64)))
    assert nxt["truncated"].all() and not nxt["terminated"].any() and ids.tolist() == [0, 1, 2]
    assert nxt["frame"][:, :3].any() and running["initial_state"].all()
    assert not running["frame"][:, :3].any() and running["frame"][:, 3].any()
    # The next step acts on the fresh episode: one real step (no reset left pending inside ale-py).
    (nxt, _), _ = env.step(act(torch.zeros(3, dtype=torch.int64)))
    assert not nxt["done"].any() and nxt["frame"][:, 2].any() and not nxt["frame"][:, :2].any()
    env.close()
    env.close()


@pytest.mark.slow  # 3.3 CPU s on the reference CPU: slow is 1.5 s or more
def test_ale_same_seed_same_frames_and_seeds_reach_ale_py():
    a, b, c = ale_env(seed=3, autoreset=True), ale_env(seed=3, autoreset=True), ale_env(seed=4, autoreset=True)
    seen = []
    reset = a._adapter.vec.reset
    a._adapter.vec.reset = lambda **kw: (seen.append(kw.get("seed")), reset(**kw))[1]
    frames = []
    for env in (a, b, c):
        obs, _ = env.reset()
        out = [obs["frame"]]
        gen = torch.Generator().manual_seed(0)
        for _ in range(8):
            (nxt, _), _ = env.step(random_action(env.action_space, 3, gen, "cpu"))
            out.append(nxt["frame"])
        frames.append(torch.stack(out))
    assert torch.equal(frames[0], frames[1]) and not torch.equal(frames[0], frames[2])
    assert isinstance(seen[0], np.ndarray) and seen[0].tolist() == env_seeds(3, 3)


def test_ale_episodic_envs_leave_the_running_set():
    env = ale_env(n=2, max_episode_steps=4)
    assert type(env) is GymEnv and not env.writes_in_place()
    _, ids = env.reset()
    for _ in range(4):
        (nxt, _), (obs, ids) = env.step(act(torch.zeros(ids.shape[0], dtype=torch.int64)))
    assert nxt["truncated"].all() and ids.tolist() == [] and obs.n_elems() == 0


def test_ale_names_and_missing_package(monkeypatch):
    pytest.importorskip("ale_py", reason="the atari extra is not installed: pip install 'rlstruct[atari]'")
    from rlstruct.envs.factory import ale_game

    assert [ale_game(n) for n in ("ALE/MsPacman-v5", "Pong", "space_invaders")] == ["ms_pacman", "pong",
                                                                                   "space_invaders"]
    with pytest.raises(ValueError, match=r"name must be an Atari ROM that ale-py ships, got 'NoSuchGame'"):
        make_env("NoSuchGame", 2, backend="ale")
    # backend="gymnasium" registers ale-py's ids: gymnasium's single-env AtariEnv, RGB frames.
    env = make_env("ALE/Breakout-v5", 2, backend="gymnasium")
    assert env.reset()[0]["frame"].shape == (2, 210, 160, 3)
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[atari\]'"):
        make_env("ALE/Breakout-v5", 2, backend="ale")


# ------------------------------------------------------------------------------------------------- gymnax
@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
def test_gymnax_cartpole_agrees_with_the_torch_cartpole_from_the_same_state():
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    from rlstruct.envs import CartPole

    n, steps = 4, 25
    jx = make_env("CartPole-v1", n, backend="gymnax", seed=0)
    th = CartPole(n, seed=0)
    jx.reset()
    th.reset()
    physics = torch.tensor([[0.0, 0.1, 0.02, -0.1], [0.5, -0.2, -0.03, 0.2], [-1.0, 0.0, 0.0, 0.0],
                            [0.1, 0.3, 0.05, 0.4]], dtype=torch.float64)
    state = th.get_state()
    state["physics"].copy_(physics)
    th.set_state(state)
    js = jx.get_state()
    env_state = js["env"].replace(**{k: np.asarray(physics[:, i], np.float32)
                                     for i, k in enumerate(("x", "x_dot", "theta", "theta_dot"))})
    jx.set_state({**js, "env": env_state})
    gen = torch.Generator().manual_seed(1)
    compared = 0
    for _ in range(steps):
        a = torch.randint(0, 2, (n,), generator=gen)
        (j_nxt, j_ids), (_, j_run) = jx.step(act(a))
        (t_nxt, t_ids), (_, t_run) = th.step(act(a))
        assert torch.equal(j_ids, t_ids)
        torch.testing.assert_close(j_nxt["frame"], t_nxt["frame"].float(), atol=1e-4, rtol=1e-4)
        for k in ("terminated", "truncated", "done"):
            assert torch.equal(j_nxt[k], t_nxt[k]), k
        compared += j_ids.shape[0]
        if j_run.shape[0] == 0:
            break
        # Only the running envs act next: drop the others' rows from the generator's draws alike.
        n = j_run.shape[0]
    assert compared >= 40


@pytest.mark.slow  # JAX compiles one CartPole env for the test (1.2-1.5 CPU s): slow is 1.5 s or more
def test_gymnax_truncation_is_reported_apart_from_termination():
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    # One env (one compile) for both ends: a 12-step limit outlasts a pole pushed one way (it falls at the 10th step)
    # and ends the episodes of alternate pushes.
    env = make_env("CartPole-v1", 2, backend="gymnax", seed=0, autoreset=True, max_episode_steps=12)
    env.reset()
    for t in range(12):  # alternate pushes: the pole stays up, the time limit ends the episode
        (nxt, _), (running, _) = env.step(act(torch.tensor([t % 2, 1 - t % 2])))
        assert nxt["done"].any() == (t == 11)
    assert nxt["truncated"].all() and not nxt["terminated"].any() and running["initial_state"].all()
    env.reset()
    for _ in range(12):  # always push right: the pole falls before the limit
        (nxt, _), _ = env.step(act(torch.ones(2, dtype=torch.int64)))
        if nxt["done"].any():
            break
    assert nxt["terminated"].any() and not nxt["truncated"].any()


@pytest.mark.slow  # 5.8 CPU s on the reference CPU: slow is 1.5 s or more
def test_gymnax_minatar_frames_and_bool_observations_as_uint8():
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    import jax.numpy as jnp

    from rlstruct.envs import JaxVecEnv

    env = make_env("Breakout-MinAtar", 3, backend="gymnax", seed=0, autoreset=True)
    obs, _ = env.reset()
    assert obs["frame"].shape == (3, 10, 10, 4) and env.observation_space.shape == (10, 10, 4)
    assert obs["frame"].dtype == torch.from_numpy(np.zeros(0, env.observation_space.dtype)).dtype
    (nxt, _), _ = env.step(act(torch.zeros(3, dtype=torch.int64)))
    assert nxt["frame"].shape == (3, 10, 10, 4)

    # A JAX env with bool observations (as MinAtar's in some gymnax versions): uint8 frames, and the space says so.
    def reset_fn(key):
        return jnp.zeros(3, bool), jnp.int32(0)

    def step_fn(key, t, action):
        t = t + 1
        return jnp.arange(3) < t, t, jnp.float32(1.0), t >= 2, jnp.bool_(False)

    from gymnax.environments.spaces import Box

    from rlstruct.envs.gymnax_env import _gymnasium_space

    space = Box(0, 1, (3,), jnp.bool_)

    bool_env = JaxVecEnv(reset_fn, step_fn, _gymnasium_space(space, "observation_space"), gym.spaces.Discrete(2), 2,
                         autoreset=True)
    assert bool_env.observation_space.dtype == np.uint8
    bool_env.reset()
    (nxt, _), (running, _) = bool_env.step(act(torch.zeros(2, dtype=torch.int64)))
    assert nxt["frame"].dtype == torch.uint8 and nxt["frame"].tolist() == [[1, 0, 0]] * 2
    (nxt, _), (running, _) = bool_env.step(act(torch.zeros(2, dtype=torch.int64)))
    assert nxt["frame"].tolist() == [[1, 1, 0]] * 2 and nxt["terminated"].all()
    assert running["frame"].tolist() == [[0, 0, 0]] * 2 and running["initial_state"].all()


def test_gymnax_env_info_device_spaces_and_missing_package(monkeypatch):
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    from rlstruct.envs import JaxVecEnv
    from rlstruct.envs._imports import import_jax

    env = make_env("CartPole-v1", 2, backend="gymnax")
    with pytest.raises(ValueError, match=r"env_info must be empty for a JAX env"):
        env.reset(DictTensor({"x": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"env must be a gymnax id, got 'NoSuchEnv'"):
        make_env("NoSuchEnv", 2, backend="gymnax")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError):
            make_env("CartPole-v1", 2, backend="gymnax", device="cuda:0")
    with pytest.raises(SpaceError, match=r"observation_space must be a Box space"):
        JaxVecEnv(None, None, gym.spaces.Discrete(3), gym.spaces.Discrete(2), 2)
    with pytest.raises(SpaceError, match=r"action_space must be Discrete or Box"):
        JaxVecEnv(None, None, gym.spaces.Box(0, 1, (2,)), gym.spaces.MultiBinary(3), 2)
    # JAX's GPU preallocation is turned off unless the user chose otherwise.
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    import_jax()
    assert __import__("os").environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    import_jax()
    assert __import__("os").environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    monkeypatch.setitem(sys.modules, "gymnax", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[jax\]'"):
        make_env("CartPole-v1", 2, backend="gymnax")


def test_gymnax_envs_of_one_kind_share_their_compiled_step():
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    a = make_env("CartPole-v1", 2, backend="gymnax", seed=0, autoreset=True, max_episode_steps=7)
    b = make_env("CartPole-v1", 2, backend="gymnax", seed=1, autoreset=True, max_episode_steps=7)
    c = make_env("CartPole-v1", 2, backend="gymnax", seed=1, autoreset=True, max_episode_steps=8)
    assert a._jit_step is b._jit_step and a._jit_step is not c._jit_step


def test_the_training_and_evaluation_envs_of_one_kind_compile_one_reset_and_one_step():
    """An auto-reset env (a run's training envs) and an episodic one (its evaluation envs) of one kind step
    differently but reset alike: they share the one jitted reset and the one jitted step (their mode its argument),
    each of whose XLA compiles for a physics env takes seconds, and the reset gives both the same first observations
    for one seed."""
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    auto = make_env("Pendulum-v1", 3, backend="gymnax", seed=5, autoreset=True, max_episode_steps=9)
    episodic = make_env("Pendulum-v1", 3, backend="gymnax", seed=5, autoreset=False, max_episode_steps=9)
    assert auto._jit_reset is episodic._jit_reset and auto._jit_step is not episodic._jit_step
    assert auto._jit_step.func is episodic._jit_step.func  # one program, bound to each env's mode
    assert torch.equal(auto.reset()[0]["frame"], episodic.reset()[0]["frame"])
