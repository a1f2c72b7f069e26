"""Brax envs as VecEnvs (``backend="brax"``, :class:`~rlstruct.envs.BraxEnv`).

Oracle: from the same Brax states and the same actions, BraxEnv's observations, rewards and terminations are those
of the raw Brax env stepped by ``jax.vmap(env.step)``. Contract: auto-reset (terminal observation in
``observation_next``, a fresh one in ``observation_running``, truncation at the limit), episodic freezing, seeding,
the typed errors, an env object of the user's, ``make_env`` and the batcher. The Brax env is ``inverted_pendulum`` on
the ``spring`` pipeline, which compiles fastest on a CPU (a few seconds per env count and mode), and ``fast``, Brax's
trivial test env (no physics: it compiles in a fraction of a second), where only the plumbing is tested.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import BraxEnv, make_env
from rlstruct.envs.factory import BACKENDS
from rlstruct.errors import EnvStateError, MissingDependencyError, SpaceError
from tests.fakes import UniformBoxAgent
from tests.fakes_gym import assert_same

jax: Any = None  # the module's tests import JAX when they run (the fixture below), not when pytest collects them
jnp: Any = None

pytestmark = [
    pytest.mark.slow,  # the fixtures compile Brax's step through XLA: 4-8 CPU s for the first test that uses one
    pytest.mark.timeout(300),  # a Brax compile under a loaded CI machine
    # Brax warns at every env built from a name that its own pipelines are no longer maintained.
    pytest.mark.filterwarnings("ignore:Brax System:UserWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def _brax_and_jax():
    """Brax and JAX, imported when the first test of the module runs rather than at collection: `make quick`, which
    leaves these slow tests out, then does not pay their imports (about 2 s in each pytest worker)."""
    global jax, jnp
    pytest.importorskip("brax", reason="the brax extra is not installed: pip install 'rlstruct[brax]'")
    jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    jnp = jax.numpy


N = 4  # pendulums per fixture: the tests share these compiled sizes
LIMIT = 20  # the fixtures' time limit: the oracle and auto-reset tests run to it
PIPELINE = {"backend": "spring"}


def act(a) -> DictTensor:
    return DictTensor({"action": torch.as_tensor(a, dtype=torch.float32)})


def pendulums(autoreset: bool, seed: int = 0, n: int = N) -> BraxEnv:
    return make_env("inverted_pendulum", n, backend="brax", seed=seed, autoreset=autoreset, max_episode_steps=LIMIT,
                    backend_kwargs=PIPELINE)


@pytest.fixture(scope="module")
def auto():
    return pendulums(True)


@pytest.fixture(scope="module")
def episodic():
    return pendulums(False)


@pytest.fixture(scope="module")
def raw_step(auto):
    """Brax's own step of the same env, vmapped over the envs and jitted: the oracle."""
    return jax.jit(jax.vmap(auto.brax_env.step))


def pushes(gen: torch.Generator, n: int) -> torch.Tensor:
    """Random actions, env 0 always pushed right: its pole falls within ~7 steps (a termination to test)."""
    a = torch.rand(n, 1, generator=gen) * 2 - 1
    a[0] = 1.0
    return a


# --------------------------------------------------------------------------------------------- the oracle
@pytest.mark.long(reason="the first user of its fixtures pays JAX's jit compiles of Brax's step, raw and "
                         "wrapped: 13-16 CPU s")
def test_observations_rewards_and_terminations_are_the_raw_brax_envs(episodic, raw_step):
    """The raw Brax env stepped from BraxEnv's initial states with the same actions: same observations, rewards and
    terminations for every running env, up to the time limit."""
    episodic.reset()
    brax_state, elapsed = episodic.get_state()["env"]
    assert not np.asarray(elapsed).any()
    gen = torch.Generator().manual_seed(0)
    ids = torch.arange(N)
    n_terminated = 0
    for t in range(LIMIT):
        a = pushes(gen, N)
        brax_state = raw_step(brax_state, a.numpy())
        (nxt, ids_next), (_, ids) = episodic.step(act(a[ids]))
        rows = ids_next.numpy()
        np.testing.assert_allclose(nxt["frame"].numpy(), np.asarray(brax_state.obs)[rows], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(nxt["reward"].numpy(), np.asarray(brax_state.reward)[rows], rtol=1e-6)
        assert nxt["terminated"].tolist() == (np.asarray(brax_state.done)[rows] > 0).tolist(), t
        assert nxt["truncated"].all() == (t == LIMIT - 1), t
        n_terminated += int(nxt["terminated"].sum())
        if ids.shape[0] == 0:
            break
    assert n_terminated >= 1 and ids.shape[0] == 0


def test_autoreset_keeps_the_terminal_observation_and_starts_fresh_episodes(auto, raw_step):
    """Each step is the raw Brax step from the env's own state; the envs that finish show their terminal
    observation in observation_next and a fresh one (within Brax's reset noise, +-0.01) in observation_running, and
    are truncated exactly LIMIT steps after their episode started."""
    obs, ids = auto.reset()
    assert obs["initial_state"].all() and not obs["done"].any() and ids.tolist() == list(range(N))
    assert np.abs(obs["frame"].numpy()).max() <= 0.01
    gen = torch.Generator().manual_seed(1)
    age = torch.zeros(N, dtype=torch.int64)
    n_terminated = n_truncated = 0
    for _ in range(2 * LIMIT):
        a = pushes(gen, N)
        expected = raw_step(auto.get_state()["env"][0], a.numpy())
        (nxt, ids_next), (running, ids_running) = auto.step(act(a))
        age += 1
        assert ids_next.tolist() == ids_running.tolist() == list(range(N))
        np.testing.assert_allclose(nxt["frame"].numpy(), np.asarray(expected.obs), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(nxt["reward"].numpy(), np.asarray(expected.reward), rtol=1e-6)
        assert torch.equal(nxt["terminated"], torch.from_numpy(np.asarray(expected.done) > 0))
        assert torch.equal(nxt["truncated"], age == LIMIT)
        done = nxt["done"]
        assert torch.equal(done, nxt["terminated"] | nxt["truncated"]) and not nxt["initial_state"].any()
        assert torch.equal(nxt["last_action"], a)
        assert torch.equal(running["initial_state"], done) and not running["done"].any()
        assert not running["reward"][done].any() and not running["last_action"][done].any()
        if done.any():
            assert running["frame"][done].abs().max().item() <= 0.01
        assert_same(running.index(~done), nxt.index(~done))
        n_terminated += int(nxt["terminated"].sum())
        n_truncated += int(nxt["truncated"].sum())
        age[done] = 0
    assert n_terminated >= 2 and n_truncated >= 1


def test_episodic_envs_freeze_once_finished(episodic):
    """An env that finished leaves the running set, and its Brax state stays as it ended until the next reset."""
    _, ids = episodic.reset()
    gen = torch.Generator().manual_seed(2)
    frozen = None
    for t in range(LIMIT):
        a = pushes(gen, N)[ids]
        (nxt, ids_next), (running, ids) = episodic.step(act(a))
        assert torch.equal(ids, ids_next[~nxt["done"]]) and running.n_elems() == ids.shape[0]
        brax_state, elapsed = episodic.get_state()["env"]
        if frozen is None and 0 not in ids.tolist():
            frozen = (np.asarray(brax_state.obs)[0].copy(), int(np.asarray(elapsed)[0]))
        elif frozen is not None:
            assert np.array_equal(np.asarray(brax_state.obs)[0], frozen[0]) and int(np.asarray(elapsed)[0]) == frozen[1]
    assert frozen is not None and frozen[1] < LIMIT  # env 0 terminated early, then stayed frozen
    assert ids.shape == (0,) and nxt["truncated"].all()
    with pytest.raises(EnvStateError, match=f"every one of the {N} episodic envs has finished"):
        episodic.step(act(torch.zeros(0, 1)))
    obs, ids = episodic.reset()
    assert ids.tolist() == list(range(N)) and obs["initial_state"].all()


def test_seeds_reproduce_and_differ(auto):
    """Same seed, same episodes (an env of the same name, settings and limit reuses the compiled functions); another
    seed, other episodes; a second reset starts new ones."""
    a, b, c = pendulums(True), pendulums(True), pendulums(True, seed=1)
    assert a._jit_step is auto._jit_step and a._jit_reset is auto._jit_reset
    oa, ob, oc = a.reset()[0]["frame"], b.reset()[0]["frame"], c.reset()[0]["frame"]
    assert torch.equal(oa, ob) and not torch.equal(oa, oc) and not torch.equal(oa[0], oa[1])
    gen = torch.Generator().manual_seed(3)
    for _ in range(LIMIT + 2):  # through auto-resets, whose fresh episodes come from the seeded keys too
        action = act(pushes(gen, N))
        (na, _), (ra, _) = a.step(action)
        (nb, _), (rb, _) = b.step(action)
        (nc, _), _ = c.step(action)
        assert_same(na, nb) and assert_same(ra, rb)
    assert not torch.equal(na["frame"], nc["frame"])
    assert not torch.equal(a.reset()[0]["frame"], oa)


# ----------------------------------------------------------------------------------------------- errors
def test_unknown_names_bad_limits_and_the_missing_package(monkeypatch):
    with pytest.raises(ValueError, match=r"env must be a Brax env name, got 'no_such_env'; Brax knows \[.*'ant'"):
        make_env("no_such_env", 2, backend="brax")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"max_episode_steps must be a positive int or None, got"):
            make_env("fast", 2, backend="brax", max_episode_steps=bad)
    monkeypatch.setitem(sys.modules, "brax", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[brax\]'"):
        make_env("fast", 2, backend="brax")


def test_dict_observations_need_an_observation_key():
    """Brax's ``fast`` env with dict observations (as MuJoCo Playground's envs have): the key names the entry."""
    with pytest.raises(SpaceError, match=r"observation_key must name one entry of env 'fast'.*got None; pass one of "
                                         r"\['state'\]"):
        BraxEnv("fast", 2, obs_mode="dict_state")
    with pytest.raises(SpaceError, match=r"got 'pixels'; pass one of \['privileged_state', 'state'\]"):
        BraxEnv("fast", 2, obs_mode="dict_state", asymmetric_obs=True, observation_key="pixels")
    with pytest.raises(SpaceError, match=r"observation_key is for envs with dict observations.*leave observation_key"):
        BraxEnv("fast", 2, observation_key="state")
    env = make_env("fast", 2, backend="brax", backend_kwargs={"obs_mode": "dict_state", "observation_key": "state"})
    assert env.observation_space.shape == (2,)
    obs, _ = env.reset()
    (nxt, _), _ = env.step(act(torch.ones(2, 1)))
    # fast: the velocity grows by dt = 0.02 per step with a positive action, the position by velocity * dt.
    torch.testing.assert_close(nxt["frame"], torch.tensor([[0.0004, 0.02]] * 2))


# ---------------------------------------------------------------------------------- an env of the user's
class PointState(NamedTuple):
    """A Brax-like State: the fields BraxEnv reads (obs, reward, done) and the env's own."""

    obs: Any
    reward: Any
    done: Any
    position: Any


class PointMass:
    """A duck-typed env with Brax's interface (no brax inside): a point moved by ``0.1 * action``, rewarded
    ``-position**2``, terminated beyond ``|position| > 0.25``; with ``dict_obs``, the observation is a dict
    (as in MuJoCo Playground) whose ``"state"`` entry is ``[position, 2 * position]``."""

    action_size = 1

    def __init__(self, dict_obs: bool = False):
        self.dict_obs = dict_obs

    def _state(self, position, reward, done):
        obs = jnp.stack([position, 2 * position])
        if self.dict_obs:
            obs = {"state": obs, "privileged": jnp.zeros(3)}
        return PointState(obs, reward, done, position)

    def reset(self, rng):
        position = jax.random.uniform(rng, (), minval=-0.05, maxval=0.05)
        return self._state(position, jnp.float32(0.0), jnp.float32(0.0))

    def step(self, state, action):
        position = state.position + 0.1 * action[0]
        return self._state(position, -position**2, jnp.where(jnp.abs(position) > 0.25, 1.0, 0.0))


@pytest.mark.parametrize("dict_obs", [False, True], ids=["array", "dict"])
def test_an_env_object_with_braxs_interface(dict_obs):
    env = BraxEnv(PointMass(dict_obs), 3, seed=4, autoreset=True, max_episode_steps=50,
                  observation_key="state" if dict_obs else None)
    assert env.name == "PointMass" and env.observation_space.shape == (2,) and env.action_space.shape == (1,)
    obs, _ = env.reset()
    position = obs["frame"][:, 0].clone()
    # Within float32 rounding: XLA may compute the drawn position once per use inside a fusion, one of them with a
    # fused multiply-add (the elemental emitters of the test session's XLA flags do).
    torch.testing.assert_close(obs["frame"][:, 1], 2 * position)
    assert position.abs().max() <= 0.05
    a = torch.tensor([[1.0], [-1.0], [0.5]])
    for t in range(3):
        (nxt, _), (running, _) = env.step(act(a))
        position = position + 0.1 * a[:, 0]
        torch.testing.assert_close(nxt["frame"][:, 0], position)
        torch.testing.assert_close(nxt["reward"], -position**2)
        assert nxt["terminated"].tolist() == (position.abs() > 0.25).tolist()
    # Envs 0 and 1 crossed |x| = 0.25 at the third step: auto-reset; env 2 (0.15 from its start) goes on.
    assert nxt["terminated"].tolist() == [True, True, False] and running["initial_state"].tolist() == [True, True,
                                                                                                       False]
    other = BraxEnv(PointMass(dict_obs), 3, seed=4, autoreset=True, max_episode_steps=50,
                    observation_key="state" if dict_obs else None)
    assert other._jit_step is not env._jit_step  # an object of the user's never shares compiled functions
    with pytest.raises(TypeError, match=r"env_kwargs are passed to brax.envs.get_environment.*PointMass"):
        BraxEnv(PointMass(), 2, backend="spring")
    with pytest.raises(TypeError, match=r"Brax's Env interface.*got object without 'reset'"):
        BraxEnv(object(), 2)


# ------------------------------------------------------------------------------ make_env, batchers, CLI
def test_make_env_builds_a_brax_env_with_its_settings():
    assert "brax" in BACKENDS
    env = make_env("fast", 3, backend="brax", seed=2, autoreset=True, max_episode_steps=7)
    assert type(env) is BraxEnv and env.max_episode_steps == 7 and env.writes_in_place()
    assert repr(env) == "BraxEnv('fast', n_envs=3, autoreset=True, device=cpu)"
    assert env.action_space.low.tolist() == [-1.0] and env.action_space.high.tolist() == [1.0]
    assert BraxEnv("fast", 1).max_episode_steps == 1000  # Brax's training default
    pendulum = make_env("inverted_pendulum", 1, backend="brax", backend_kwargs={"backend": "positional"})
    assert pendulum.brax_env.backend == "positional" and pendulum.observation_space.shape == (4,)


def brax_fast(n_envs: int, seed: int):
    """Auto-reset Brax ``fast`` envs with a 5-step limit (a batcher's create_env)."""
    return make_env("fast", n_envs, backend="brax", seed=seed, autoreset=True, max_episode_steps=5)


def collect(n_processes: int, create_env, env_args: dict, seeds: list[int], n_acquisitions: int = 2):
    from rlstruct.batchers import RL_Batcher

    out = []
    with RL_Batcher(8, UniformBoxAgent, {}, create_env, env_args, n_processes, seeds,
                    agent_seeds=[s + 100 for s in seeds]) as batcher:
        batcher.reset()
        for _ in range(n_acquisitions):
            batcher.execute()
            trajectories, n_running = batcher.get()
            assert n_running == trajectories.n_elems()
            out.append(trajectories.clone())
    return out


def test_a_batcher_acquires_brax_trajectories_in_process():
    first, second = collect(0, brax_fast, {"n_envs": 3}, [5])
    frames = first.trajectories["observation/frame"]
    assert frames.shape == (3, 8, 2) and first.trajectories["action/action"].shape == (3, 8, 1)
    truncated = first.trajectories["_observation/truncated"]
    assert truncated[:, 4].all() and truncated.sum() == 3  # the limit, 5 steps after the reset
    assert first.trajectories["observation/initial_state"][:, 5].all()
    assert not torch.equal(second.trajectories["observation/frame"], frames)


@pytest.mark.timeout(120)
def test_a_batcher_worker_process_builds_brax_envs_with_make_env():
    """make_env as create_env in a spawned worker: the same trajectories as in process with the same seeds."""
    env_args = {"name": "fast", "n_envs": 3, "backend": "brax", "autoreset": True, "max_episode_steps": 5}
    in_process = collect(0, make_env, env_args, [5])
    in_worker = collect(1, make_env, env_args, [5])
    for a, b in zip(in_process, in_worker):
        assert_same(a.trajectories, b.trajectories)


def test_describe_env_gives_a_continuous_spec():
    from rlstruct.algos import describe_env

    spec = describe_env("inverted_pendulum", "brax", None)
    assert spec.n_actions is None and spec.action_shape == (1,) and spec.obs_shape == (4,)
    assert spec.action_low == (-1.0,) and spec.action_high == (1.0,) and spec.max_episode_steps == 1000


@pytest.mark.long(reason="a learning proof through JAX: compiling the training and evaluation envs and 25k-34k "
                         "env steps to the time limit take about 36 CPU seconds")
@pytest.mark.timeout(600)
def test_ppo_learns_brax_inverted_pendulum(tmp_path):
    """PPO's defaults through the Brax backend: seeds 0-9 with 1 and 2 torch threads (benchmarks/thresholds.py
    brax-inverted-pendulum) all evaluate at 1000 (the time limit, balanced throughout) within 26,624-34,816 env steps,
    under half the budget, and again with both envs on the JAX adapter's one step program (seeds 0-4, 1 and 2
    threads: all 10 at 1000 within 26,624-34,816; benchmarks/results/thresholds-brax-inverted-pendulum-one-step.json);
    most of a run is JAX compiling the envs' reset and step. No wall-clock limit: the run is bounded by its env steps,
    so a loaded machine makes it slower, never a failure."""
    from rlstruct.algos import ppo

    result = ppo.train(ppo.PPOConfig(env="inverted_pendulum", backend="brax", seed=0, max_env_steps=80_000,
                                     target_return=1000.0, progress=False, tensorboard=False,
                                     logdir=str(tmp_path)))
    assert result.reached_target, result.eval_return
