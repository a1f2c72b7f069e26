"""gymnasium's MuJoCo locomotion tasks on MJX (``backend="mjx"``) and mujoco-torch (``backend="mujoco_torch"``).

Oracle: from the same ``qpos``/``qvel`` and the same actions, each backend's observation, reward and termination
agree with gymnasium's own env (MuJoCo's C engine). Contract: the points of test_env_contract.py, checked here on
envs built once per module (MJX compiles once per task and env count, for auto-reset and episodic envs alike: 10-15
CPU s on a 2-core CPU; mujoco-torch steps a few envs per second there, so its runs are a few steps long).

MJX compiles one task here, HalfCheetah (its physics against the C engine, both modes, a training run). What another
task adds on MJX is its rules (observation, reward, health, reset noise), written once for ``jax.numpy`` and torch:
they agree on both (:func:`test_each_tasks_rules_agree_on_jax_and_torch`), and mujoco-torch's Hopper is held to
gymnasium's through its termination. The auto-reset of terminated rows is the JAX env base's, which
tests/envs/test_brax.py checks through falling pendulums.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import make_env
from rlstruct.envs._locomotion import LOCOMOTION_TASKS, locomotion_task
from rlstruct.errors import (
    ActionRangeError,
    BatchSizeError,
    DeviceMismatchError,
    EnvStateError,
    MissingDependencyError,
    SpaceError,
)
from tests.fakes_gym import assert_same

pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")

pytestmark = pytest.mark.timeout(300)  # an MJX compile under a loaded CI machine

N = 4  # MJX envs per fixture: every MJX test shares these compiled sizes
LIMIT = 25  # MJX time limit: the truncation tests run to it
RESERVED = ["frame", "reward", "done", "terminated", "truncated", "initial_state", "last_action"]


def act(a) -> DictTensor:
    return DictTensor({"action": torch.as_tensor(a, dtype=torch.float32)})


def mjx_env(name: str, autoreset: bool, n: int = N, seed: int = 0, limit: int = LIMIT):
    pytest.importorskip("mujoco.mjx", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    return make_env(name, n, backend="mjx", seed=seed, autoreset=autoreset, max_episode_steps=limit)


def torch_env(name: str, autoreset: bool, n: int = 2, seed: int = 0, limit: int = 3):
    pytest.importorskip("mujoco_torch", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    return make_env(name, n, backend="mujoco_torch", seed=seed, autoreset=autoreset, max_episode_steps=limit)


@pytest.fixture(scope="module")
def cheetah_mjx():
    return mjx_env("HalfCheetah-v5", True)


@pytest.fixture(scope="module")
def cheetah_mjx_episodic():
    return mjx_env("HalfCheetah-v5", False)


# --------------------------------------------------------------------------------------------- the oracle
def with_row0(env, qpos: np.ndarray, qvel: np.ndarray):
    """The env's state with env 0 at ``(qpos, qvel)`` (and a zero solver warm start, as after a reset)."""
    state = env.get_state()
    if isinstance(state, dict):  # MJX: an immutable pytree, env state (qpos, qvel, qacc_warmstart, elapsed steps)
        old_qpos, old_qvel, warm, elapsed = state["env"]
        physical = (old_qpos.at[0].set(qpos), old_qvel.at[0].set(qvel), warm.at[0].set(0.0), elapsed)
        return {**state, "env": physical}
    state["qpos"][0] = torch.from_numpy(qpos)
    state["qvel"][0] = torch.from_numpy(qvel)
    state["qacc_warmstart"][0] = 0.0
    return state


def oracle(env, name: str, steps: int, bias: float, atol: float, atol_contact: float | None = None,
           kick: dict[int, float] | None = None) -> list[bool]:
    """Steps gymnasium's ``name`` and row 0 of ``env`` (an auto-reset env, reset) from the same state with the same
    actions (``bias`` plus uniform noise), checks that they agree within ``atol`` (``atol_contact`` once the
    C engine reports a contact), and returns gymnasium's ``terminated`` flags. ``kick`` adds velocities
    (``{qvel index: value}``) to gymnasium's reset state first, for both."""
    ref = gym.make(name)
    ref.reset(seed=3)
    data = ref.unwrapped.data
    if kick:
        qvel = data.qvel.copy()
        for i, v in kick.items():
            qvel[i] += v
        ref.unwrapped.set_state(data.qpos.copy(), qvel)
    env.set_state(with_row0(env, data.qpos.copy(), data.qvel.copy()))
    nu, n = env.action_space.shape[0], env.n_envs()
    rng = np.random.default_rng(0)
    terminated, tol = [], atol
    for t in range(steps):
        a = (bias + 0.2 * rng.uniform(-1, 1, nu)).astype(np.float32)
        obs, reward, term, trunc, _ = ref.step(a)
        (nxt, _), (running, _) = env.step(act(np.tile(a, (n, 1))))
        if data.ncon and atol_contact is not None:
            tol = atol_contact
        np.testing.assert_allclose(nxt["frame"][0].numpy(), obs, atol=tol, rtol=0, err_msg=f"step {t}")
        assert nxt["reward"][0].item() == pytest.approx(reward, abs=tol), t
        assert nxt["terminated"][0].item() is term and not trunc, t
        terminated.append(term)
        if term:
            # The auto-reset: the terminal observation in observation_next, a fresh episode in observation_running.
            assert running["initial_state"][0] and not running["done"][0] and running["reward"][0] == 0
            assert not torch.equal(running["frame"][0], nxt["frame"][0])
            break
    return terminated


@pytest.mark.long(reason="the first user of its module fixture pays MJX's jit compile of HalfCheetah: "
                         "14-17 CPU s on a 2-core machine")
@pytest.mark.slow
def test_mjx_half_cheetah_matches_gymnasium(cheetah_mjx):
    """MJX (float32) stays within 1e-3 of gymnasium's float64 HalfCheetah over 20 steps."""
    cheetah_mjx.reset()
    assert not any(oracle(cheetah_mjx, "HalfCheetah-v5", 20, 0.0, 1e-3))


@pytest.mark.slow
def test_mujoco_torch_hopper_matches_gymnasium_through_its_termination():
    """mujoco-torch (float64) agrees with MuJoCo's C engine to 1e-6 while nothing touches the ground; its contact
    solution then departs from the C engine's by ~1e-6 in qpos per step, which the chaotic contact dynamics
    amplify to ~1e-2 in the velocities within 3 steps: the termination still comes at the same step. The hopper
    starts falling (3 m/s down, tipping back at 8 rad/s: each mujoco-torch step costs about a CPU second here), so
    that the first step is in the air, the foot lands at the second and the torso tips past Hopper's health angle
    at the third, where gymnasium's reset state takes 7 steps to the same three phases."""
    env = torch_env("Hopper-v5", True, limit=50)
    env.reset()
    terminated = oracle(env, "Hopper-v5", 10, -0.8, 1e-6, atol_contact=0.1, kick={1: -3.0, 2: -8.0})
    assert terminated == [False, False, True]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["HalfCheetah-v5", "Walker2d-v5"])
def test_mujoco_torch_matches_gymnasium(name):
    env = torch_env(name, True, limit=50)
    env.reset()
    assert not any(oracle(env, name, 3, 0.0, 1e-6, atol_contact=1e-2))


# ------------------------------------------------------------------------------------------- the contract
def check_observation(obs: DictTensor, n: int, obs_dim: int, nu: int, device: str = "cpu") -> None:
    assert list(obs.keys()) == RESERVED and obs.n_elems() == n and obs.device() == torch.device(device)
    assert obs["frame"].shape == (n, obs_dim) and obs["frame"].dtype == torch.float32
    assert obs["reward"].shape == (n,) and obs["reward"].dtype == torch.float32
    for k in ("done", "terminated", "truncated", "initial_state"):
        assert obs[k].shape == (n,) and obs[k].dtype == torch.bool, k
    assert obs["last_action"].shape == (n, nu) and obs["last_action"].dtype == torch.float32
    assert torch.equal(obs["done"], obs["terminated"] | obs["truncated"])


def contract_autoreset(env, limit: int, steps: int) -> None:
    """Shapes, the terminal/fresh split of auto-reset rows, truncation at ``limit``, and step counters restarting
    with each episode, over ``steps`` steps of random actions (``steps >= limit``)."""
    n, nu, obs_dim = env.n_envs(), env.action_space.shape[0], env.observation_space.shape[0]
    obs, ids = env.reset()
    check_observation(obs, n, obs_dim, nu)
    assert ids.tolist() == list(range(n)) and obs["initial_state"].all() and not obs["done"].any()
    assert not obs["reward"].any() and not obs["last_action"].any()
    gen = torch.Generator().manual_seed(0)
    age = torch.zeros(n, dtype=torch.int64)
    n_truncated = 0
    for _ in range(steps):
        a = torch.rand(n, nu, generator=gen) * 2 - 1
        (nxt, ids_next), (running, ids_running) = env.step(act(a))
        age += 1
        check_observation(nxt, n, obs_dim, nu)
        check_observation(running, n, obs_dim, nu)
        assert ids_next.tolist() == ids_running.tolist() == list(range(n))
        done = nxt["done"]
        assert torch.equal(nxt["truncated"], age == limit)
        assert torch.equal(nxt["last_action"], a) and not nxt["initial_state"].any()
        assert torch.equal(running["initial_state"], done) and not running["done"].any()
        assert not running["reward"][done].any() and not running["last_action"][done].any()
        assert_same(running.index(~done), nxt.index(~done))
        assert all(not torch.equal(f, t) for f, t in zip(running["frame"][done], nxt["frame"][done]))
        n_truncated += int(nxt["truncated"].sum())
        age[done] = 0
    assert n_truncated >= 1


@pytest.mark.slow
def test_mjx_autoreset_contract(cheetah_mjx):
    """HalfCheetah never terminates: every env is truncated at the limit and restarts."""
    contract_autoreset(cheetah_mjx, LIMIT, LIMIT + 2)


@pytest.mark.slow
def test_mjx_episodic_stops_finished_envs_and_truncates(cheetah_mjx_episodic):
    env = cheetah_mjx_episodic
    obs, ids = env.reset()
    gen = torch.Generator().manual_seed(1)
    for t in range(LIMIT):
        (nxt, ids_next), (running, ids) = env.step(act(torch.rand(ids.shape[0], 6, generator=gen) * 2 - 1))
        check_observation(nxt, ids_next.shape[0], 17, 6)
        assert torch.equal(ids, ids_next[~nxt["done"]])
        assert nxt["truncated"].all() == (t == LIMIT - 1) and not nxt["terminated"].any()
    assert ids.shape == (0,) and running.n_elems() == 0
    with pytest.raises(EnvStateError, match="every one of the 4 episodic envs has finished"):
        env.step(act(torch.zeros(0, 6)))
    with pytest.raises(EnvStateError, match="needs an auto-reset env"):
        env.step_into(act(torch.zeros(N, 6)), obs.clone(), obs.clone())
    obs, ids = env.reset()
    assert ids.tolist() == [0, 1, 2, 3] and obs["initial_state"].all()


@pytest.mark.slow  # 2.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_mujoco_torch_autoreset_contract_and_truncation():
    env = torch_env("HalfCheetah-v5", True, limit=2)
    contract_autoreset(env, 2, 3)
    assert env.graph_state() is None


@pytest.mark.slow  # 4.5 CPU s on the reference CPU: slow is 1.5 s or more
def test_mujoco_torch_episodic_stops_finished_envs():
    env = torch_env("Hopper-v5", False, n=3, limit=2)
    obs, ids = env.reset()
    # Env 1 has finished: only the others act, in the order of the ids, and env 1's state stays as it was.
    env.set_state(DictTensor({**dict(env.get_state().items()), "running": torch.tensor([True, False, True])}))
    before = env.get_state()["qpos"][1].clone()
    (nxt, ids_next), (running, ids) = env.step(act(torch.ones(2, 3)))
    assert ids_next.tolist() == ids.tolist() == [0, 2] and not nxt["done"].any()
    check_observation(nxt, 2, 11, 3)
    assert torch.equal(env.get_state()["qpos"][1], before)
    assert env.get_state()["running"].tolist() == [True, False, True]
    (nxt, ids_next), (running, ids) = env.step(act(torch.zeros(2, 3)))
    assert nxt["truncated"].all() and ids.shape == (0,) and running.n_elems() == 0
    with pytest.raises(EnvStateError, match="every one of the 3 episodic envs has finished"):
        env.step(act(torch.zeros(0, 3)))
    assert env.reset()[1].tolist() == [0, 1, 2]


@pytest.mark.slow
def test_mjx_seeds_reproduce_and_differ(cheetah_mjx):
    """Same seed, same episodes (an env built with the same task and size reuses the compiled functions); other
    seeds and other envs, other episodes."""
    a, b, c = mjx_env("HalfCheetah-v5", True), mjx_env("HalfCheetah-v5", True), mjx_env("HalfCheetah-v5", True, seed=1)
    assert a._jit_step is cheetah_mjx._jit_step
    oa, ob, oc = a.reset()[0]["frame"], b.reset()[0]["frame"], c.reset()[0]["frame"]
    assert torch.equal(oa, ob) and not torch.equal(oa, oc) and not torch.equal(oa[0], oa[1])
    action = act(torch.full((N, 6), 0.5))
    (na, _), _ = a.step(action)
    (nb, _), _ = b.step(action)
    assert_same(na, nb)
    assert not torch.equal(a.reset()[0]["frame"], oa)  # a second reset starts new episodes


@pytest.mark.slow  # 1.6 CPU s on the reference CPU: slow is 1.5 s or more
def test_mujoco_torch_seeds_reproduce_and_differ():
    a, b, c = torch_env("Hopper-v5", True), torch_env("Hopper-v5", True), torch_env("Hopper-v5", True, seed=1)
    oa, ob, oc = a.reset()[0]["frame"], b.reset()[0]["frame"], c.reset()[0]["frame"]
    assert torch.equal(oa, ob) and not torch.equal(oa, oc) and not torch.equal(oa[0], oa[1])
    # Env k's episodes depend on (seed, k) only, not on n_envs.
    wide = torch_env("Hopper-v5", True, n=3).reset()[0]["frame"]
    assert torch.equal(wide[:2], oa)
    assert not torch.equal(a.reset()[0]["frame"], oa)
    # The reset noise is gymnasium's: qpos0 + U(-5e-3, 5e-3), qvel U(-5e-3, 5e-3).
    qpos0 = a.mj_model.qpos0
    assert np.abs(oa[:, :5].numpy() - qpos0[1:]).max() <= 5e-3 and oa[:, 5:].abs().max() <= 5e-3


@pytest.mark.slow
def test_mjx_get_set_state_round_trip(cheetah_mjx):
    env = cheetah_mjx
    env.reset()
    action = act(torch.rand(N, 6, generator=torch.Generator().manual_seed(2)))
    state = env.get_state()
    first = env.step(action)
    env.set_state(state)
    second = env.step(action)
    for (u, i), (v, j) in zip(first, second):
        assert_same(u, v) and torch.equal(i, j)


@pytest.mark.slow  # 2.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_mujoco_torch_get_set_state_round_trip():
    env = torch_env("HalfCheetah-v5", True, limit=2)
    env.reset()
    env.step(act(torch.zeros(2, 6)))
    state = env.get_state()
    action = act(torch.rand(2, 6, generator=torch.Generator().manual_seed(2)))
    first = env.step(action)  # truncates both envs: the fresh episodes come from the saved RNG state
    other = torch_env("HalfCheetah-v5", True, seed=5, limit=2)
    other.set_state(state)
    second = other.step(action)
    for (u, i), (v, j) in zip(first, second):
        assert_same(u, v) and torch.equal(i, j)
    with pytest.raises(TypeError, match="DictTensor from get_state"):
        other.set_state({"qpos": state["qpos"]})
    with pytest.raises(SpaceError, match=r"state lacks the keys \['qvel'"):
        other.set_state(DictTensor({"qpos": state["qpos"]}))
    with pytest.raises(SpaceError, match=r"state\['qpos'\] must have rows of shape \[9\]"):
        other.set_state(DictTensor({**dict(state.items()), "qpos": state["qpos"][:, :3]}))
    with pytest.raises(BatchSizeError, match="n_envs=3"):
        torch_env("HalfCheetah-v5", True, n=3).set_state(state)
    with pytest.raises(SpaceError, match="all true for an auto-reset env"):
        env.set_state(DictTensor({**dict(state.items()), "running": torch.tensor([True, False])}))


def check_wrong_actions(env) -> None:
    env.reset()
    n, nu = env.n_envs(), env.action_space.shape[0]
    with pytest.raises(SpaceError, match=r"action\['action'\] must"):
        env.step(act(torch.zeros(n, nu, 3)))
    with pytest.raises(SpaceError, match=r"action\['action'\] must"):
        env.step(DictTensor({"action": torch.zeros(n, nu, dtype=torch.int64)}))
    with pytest.raises(BatchSizeError, match="one row per running env"):
        env.step(act(torch.zeros(n - 1, nu)))
    nan = torch.zeros(n, nu)
    nan[1, 0] = float("nan")
    with pytest.raises(ActionRangeError, match=r"action\['action'\] must be in Box\(.*finite values.*got \[nan, 0.0"
                                               rf".* at env ids 1 \(1 of {n} rows\)"):
        env.step(act(nan))
    with pytest.raises(DeviceMismatchError, match="must be on cpu"):
        env.step(DictTensor({"action": torch.zeros(n, nu, device="meta")}))
    with pytest.raises(ValueError, match="env_info must be empty"):
        env.reset(DictTensor({"x": torch.zeros(n)}))


@pytest.mark.slow
def test_mjx_wrong_inputs_raise(cheetah_mjx):
    check_wrong_actions(cheetah_mjx)
    with pytest.raises(EnvStateError, match="before reset"):
        mjx_env("HalfCheetah-v5", True).step(act(torch.zeros(N, 6)))


def test_mujoco_torch_wrong_inputs_raise():
    env = torch_env("Hopper-v5", True)
    with pytest.raises(EnvStateError, match="before reset"):
        env.step(act(torch.zeros(2, 3)))
    check_wrong_actions(env)
    env.close()
    env.close()
    with pytest.raises(EnvStateError, match="closed"):
        env.reset()


@pytest.mark.parametrize("backend", ["mjx", "mujoco_torch"])
def test_make_env_refuses_unknown_ids_and_bad_limits(backend):
    with pytest.raises(ValueError, match=r"name must be a MuJoCo task of backend=.*'Ant-v5'.*HalfCheetah-v5"):
        make_env("Ant-v5", 1, backend=backend)
    with pytest.raises(ValueError, match="max_episode_steps must be a positive int"):
        make_env("Hopper-v5", 1, backend=backend, max_episode_steps=0)


@pytest.mark.parametrize("backend", ["mjx", "mujoco_torch"])
def test_missing_packages_name_the_extra(backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[mujoco\]'"):
        make_env("Hopper-v5", 1, backend=backend)


@pytest.mark.slow  # 2.4 CPU s, 4.8 where it imports JAX: slow is 1.5 s or more
def test_each_tasks_rules_agree_on_jax_and_torch():
    """Observation, reward, termination and reset of every task, from the same numbers through ``jax.numpy`` (MJX's
    step) and torch (mujoco-torch's), over states on both sides of each health bound: the rules a task adds to the
    physics, without compiling its MJX step."""
    jnp = pytest.importorskip("jax", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'").numpy
    import mujoco

    rng = np.random.default_rng(0)
    for name, task in LOCOMOTION_TASKS.items():
        model = mujoco.MjModel.from_xml_path(task.xml_path())
        nq, nv, nu, n = model.nq, model.nv, model.nu, 256
        qpos = rng.normal(0.0, 0.3, (n, nq)).astype(np.float32)
        qpos[:, 1] = rng.uniform(0.5, 2.2, n)  # the root height, across Hopper's and Walker2d's bounds
        qpos[:, 2] = rng.uniform(-1.2, 1.2, n)  # the root angle
        qvel = rng.normal(0.0, 60.0, (n, nv)).astype(np.float32)  # some beyond Hopper's state range
        action = rng.uniform(-1, 1, (n, nu)).astype(np.float32)
        x_before = rng.normal(0.0, 0.1, n).astype(np.float32)
        u_pos = rng.uniform(0, 1, (n, nq)).astype(np.float32)
        noise = rng.normal(0, 1, (n, nv)).astype(np.float32)
        dt = float(model.opt.timestep) * task.frame_skip

        def both(f, *arrays):
            return (f(jnp, *map(jnp.asarray, arrays)), f(torch, *map(torch.from_numpy, arrays)))

        (r_jax, t_jax), (r_torch, t_torch) = both(lambda xp, *a: task.reward_and_terminated(xp, *a, dt), x_before,
                                                  qpos, qvel, action)
        np.testing.assert_allclose(np.asarray(r_jax), r_torch.numpy(), rtol=1e-5, atol=1e-4, err_msg=name)
        assert np.array_equal(np.asarray(t_jax), t_torch.numpy()), name
        if task.terminate_when_unhealthy:
            assert 0 < t_torch.sum() < n, name  # both sides of the bounds were tried
        o_jax, o_torch = both(task.observation, qpos, qvel)
        np.testing.assert_allclose(np.asarray(o_jax), o_torch.numpy(), rtol=1e-6, err_msg=name)
        (p_jax, v_jax), (p_torch, v_torch) = both(task.initial_state, model.qpos0.astype(np.float32), u_pos, noise)
        np.testing.assert_allclose(np.asarray(p_jax), p_torch.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(np.asarray(v_jax), v_torch.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def test_tasks_are_gymnasiums_v5_tasks():
    """Each task's settings are those of gymnasium's env of the same id (its defaults, its time limit)."""
    for name, task in LOCOMOTION_TASKS.items():
        env = gym.make(name)
        u = env.unwrapped
        assert env.spec.max_episode_steps == task.max_episode_steps
        assert u.frame_skip == task.frame_skip and u.fullpath == task.xml_path()
        assert u._forward_reward_weight == task.forward_reward_weight
        assert u._ctrl_cost_weight == task.ctrl_cost_weight and u._reset_noise_scale == task.reset_noise_scale
        assert u.observation_space.shape == (u.model.nq - 1 + u.model.nv,)
        assert locomotion_task(name, "mjx") is task
        env.close()


# ----------------------------------------------------------------------------------------------- the CLI
def test_describe_env_gives_a_continuous_spec():
    pytest.importorskip("mujoco.mjx", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    from rlstruct.algos import describe_env

    spec = describe_env("Hopper-v5", "mjx", None)
    assert spec.n_actions is None and spec.action_shape == (3,) and spec.obs_shape == (11,)
    assert spec.action_low == (-1.0,) * 3 and spec.max_episode_steps == 1000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_ppo_on_mjx_half_cheetah(cheetah_mjx, cheetah_mjx_episodic, tmp_path, capsys):
    """Two tiny PPO iterations through the CLI, on the module's compiled sizes (4 envs, limit 25), each one pass over
    its collection (the ppo-mujoco preset's ten passes of 32 minibatches are 640 updates of one row each)."""
    from rlstruct.algos._train import cli

    rc = cli.main(["train", "ppo", "--env", "HalfCheetah-v5", "--backend", "mjx", "--n-envs", str(N),
                   "--n-evaluation-envs", str(N), "--max-episode-steps", str(LIMIT), "--n-steps", "8",
                   "--n-epochs", "1", "--max-env-steps", str(2 * 8 * N), "--time-limit", "300", "--eval-every", "1",
                   "--no-progress", "--logdir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt").exists()


# ---------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
def test_mujoco_torch_on_cuda_and_no_cuda_graph():
    """The mujoco-torch env steps on CUDA; ``cuda_graph=True`` is refused with the reason (the solver's
    convergence loop reads a flag on the host every iteration, so the step cannot be captured)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rlstruct.batchers import RL_Batcher
    from rlstruct.errors import BatcherWorkerError
    from tests.fakes import ConstantAgent

    pytest.importorskip("mujoco_torch", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    env = make_env("Hopper-v5", 2, backend="mujoco_torch", device="cuda:0", autoreset=True, max_episode_steps=2)
    obs, ids = env.reset()
    check_observation(obs, 2, 11, 3, "cuda:0")
    for _ in range(2):
        (nxt, _), (running, _) = env.step(act(torch.zeros(2, 3)).to("cuda:0"))
    assert nxt["truncated"].all() and running["initial_state"].all()
    assert env.graph_state() is None
    env_args = {"name": "Hopper-v5", "n_envs": 2, "backend": "mujoco_torch", "device": "cuda:0", "autoreset": True}
    with pytest.raises(BatcherWorkerError, match="graph_state"):
        RL_Batcher(2, ConstantAgent, {}, make_env, env_args, 0, [0], device="cuda:0", cuda_graph=True)
