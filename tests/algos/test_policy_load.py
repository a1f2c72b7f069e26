"""``rlstruct.algos.load``: a run read back as a policy that acts on numpy or torch observations, one or a batch,
drives gymnasium's own env, feeds a batcher and evaluates; and the errors of its first mistakes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import RL_Batcher
from rlstruct.algos import a2c, create_env, dqn, load, ppo, pqn, sac, td3
from rlstruct.algos._train.checkpoints import content_digest
from rlstruct.errors import CheckpointError, SpaceError
from tests.algos.shared_runs import WIDE_SOLVE, ppo_cartpole_wide_solve  # noqa: F401 (a fixture)
from tests.algos.test_learning import _common

#: evaluated untrained and at the end only: what is read back is the weights, not how well they did
TINY = {"n_envs": 4, "n_evaluation_envs": 2, "eval_every": 1_000, "hidden_sizes": (16,)}


def _run(root, name, module, cfg_cls, **settings) -> str:
    folder = root / name
    module.train(cfg_cls(**_common(folder, **{**TINY, **settings})))
    return str(folder)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Short runs (untrained or nearly) of each kind of policy. Nothing here reads a run's returns: Pendulum's
    evaluations stop at 20 of their 200 steps, and SAC's and TD3's runs learn in their last two iterations only (64
    gradient steps, where 128 cost 0.6 CPU s more a run)."""
    root = tmp_path_factory.mktemp("runs")
    pendulum = {"env": "Pendulum-v1", "evaluation_max_steps": 20}
    return {
        "ppo": _run(root, "ppo", ppo, ppo.PPOConfig, max_env_steps=512, n_steps=64, normalize_observations=True),
        "pendulum": _run(root, "pendulum", ppo, ppo.PPOConfig, **pendulum, max_env_steps=400, n_steps=100),
        "sac": _run(root, "sac", sac, sac.SACConfig, **pendulum, max_env_steps=200, learning_starts=168),
        "td3": _run(root, "td3", td3, td3.TD3Config, **pendulum, max_env_steps=200, learning_starts=168),
        "dqn": _run(root, "dqn", dqn, dqn.DQNConfig, max_env_steps=200, learning_starts=32, gradient_steps=2,
                    rollout_steps=4),
        "pqn": _run(root, "pqn", pqn, pqn.PQNConfig, max_env_steps=512, n_steps=32),
        "lstm": _run(root, "lstm", a2c, a2c.A2CConfig, env="CartPoleNoVel-v1", recurrent=True, max_env_steps=256,
                     n_steps=16),
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group(WIDE_SOLVE)
def test_a_trained_ppo_run_drives_gymnasiums_own_cartpole_to_475(ppo_cartpole_wide_solve):  # noqa: F811 (a fixture)
    """test_ppo.py's solve run (2,048 envs x 16 steps, lr 0.02 annealed over 100 iterations), trained once a session
    (tests/algos/shared_runs.py) and stopped where an evaluation of 475 and its confirmation on fresh episodes
    agree, then the loaded policy alone in gymnasium's CartPole-v1, no rlstruct wrapper in the loop. Seeds 0-2 with 1
    and 2 torch threads stopped after 8 (seed 0), 16 or 30-32 iterations; the loaded policies' means over the five
    episodes (one predict an observation) were 500, but seed 2 with 1 thread's 484 (one episode of 420). So the run
    stops at its confirmed target (seed 0: 8 iterations with either thread count) instead of spending the whole
    budget (100 iterations, 36 CPU s)."""
    result, logdir = ppo_cartpole_wide_solve
    assert result.reached_target, (result.iterations, result.eval_return)
    policy = load(logdir)
    # Five episodes side by side, seeds 0-4, one env each: one predict a step for the batch of those still running
    # (a batch's row may round otherwise than the row alone: seed 0's measured mean, 500, is 25 over the threshold).
    envs = [gym.make("CartPole-v1") for _ in range(5)]
    observations = [env.reset(seed=seed)[0] for seed, env in enumerate(envs)]
    returns, running = [0.0] * 5, list(range(5))
    while running:
        actions = policy.predict(np.stack([observations[i] for i in running]))
        for i, action in zip(list(running), actions):
            observations[i], reward, terminated, truncated, _ = envs[i].step(int(action))
            returns[i] += reward
            if terminated or truncated:
                running.remove(i)
    for env in envs:
        env.close()
    assert np.mean(returns) >= 475, returns


@pytest.mark.slow  # 10.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("name", ["ppo", "dqn", "pqn", "pendulum", "sac", "td3"])
def test_numpy_and_torch_one_or_a_batch_give_the_same_actions_of_the_same_kind(runs, name):
    policy = load(runs[name], device="cpu")
    shape = policy.spec.obs_shape
    batch = np.random.default_rng(0).uniform(-1, 1, (5, *shape)).astype(np.float32)
    actions = policy.predict(batch)
    assert isinstance(actions, np.ndarray) and actions.shape[0] == 5
    one = policy.predict(batch[2])
    assert isinstance(one, np.ndarray) and one.shape == actions.shape[1:]
    np.testing.assert_allclose(one, actions[2], rtol=1e-5)  # a row alone may round otherwise than in a batch
    as_torch = policy.predict(torch.from_numpy(batch))
    assert isinstance(as_torch, torch.Tensor)
    np.testing.assert_array_equal(as_torch.numpy(), actions)
    np.testing.assert_array_equal(policy.predict(batch.astype(np.float64)), actions)  # a float64 array converts
    one_torch = policy.predict(torch.from_numpy(batch[2]))
    assert isinstance(one_torch, torch.Tensor) and one_torch.shape == tuple(actions.shape[1:])


@pytest.mark.parametrize("name", ["pendulum", "sac", "td3"])
def test_continuous_actions_stay_within_the_bounds(runs, name):
    policy = load(runs[name])
    batch = np.random.default_rng(1).uniform(-1, 1, (64, 3)).astype(np.float32)
    for deterministic in (True, False):
        actions = policy.predict(batch, deterministic, seed=0)
        assert actions.shape == (64, 1) and actions.dtype == np.float32
        assert (actions >= -2.0).all() and (actions <= 2.0).all()


@pytest.mark.parametrize("name", ["ppo", "dqn", "pqn", "sac", "td3"])
def test_sampling_is_seeded_and_deterministic_is_greedy(runs, name):
    policy = load(runs[name])
    batch = torch.rand(256, *policy.spec.obs_shape)
    first = policy.predict(batch, deterministic=False, seed=3)
    assert torch.equal(first, policy.predict(batch, deterministic=False, seed=3))
    assert torch.equal(policy.predict(batch), policy.predict(batch))
    if name in ("dqn", "pqn"):  # epsilon-greedy at the run's final epsilon: greedy unless that is 0
        assert policy.agent_info(deterministic=False)["epsilon"].item() == pytest.approx(policy.config["epsilon_end"])
    else:
        assert not torch.equal(first, policy.predict(batch))


def test_a_recurrent_policy_takes_and_returns_its_state(runs):
    policy = load(runs["lstm"])
    assert policy.recurrent
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=0)
    action, state = policy.predict(observation[[0, 2]])  # CartPoleNoVel: positions only
    assert isinstance(action, np.ndarray) and action.shape == () and set(state.keys()) == {"h", "c"}
    batch = np.stack([observation[[0, 2]]] * 3)
    actions, batch_state = policy.predict(batch)
    assert actions.shape == (3,) and batch_state["h"].shape[0] == 3
    again, later = policy.predict(batch, state=batch_state)
    assert not torch.equal(later["h"], batch_state["h"])  # the memory moves on
    torch.testing.assert_close(state["h"][0], batch_state["h"][0])  # one or a batch: the same memory
    _, restarted = policy.predict(batch, state=later, episode_start=np.array([False, True, False]))
    _, continued = policy.predict(batch, state=later)
    torch.testing.assert_close(restarted["h"][1], batch_state["h"][1])  # row 1 starts afresh
    torch.testing.assert_close(restarted["h"][[0, 2]], continued["h"][[0, 2]])
    with pytest.raises(ValueError, match=r"episode_start must hold one bool per observation \(3\), got 2 values"):
        policy.predict(batch, state=later, episode_start=[True, False])
    env.close()


def test_a_stateless_policy_refuses_a_state(runs):
    policy = load(runs["ppo"])
    with pytest.raises(ValueError, match="state is for recurrent policies.*call predict.observation. without state"):
        policy.predict(np.zeros(4, np.float32), state=policy.initial_state(1))


def test_the_agent_factory_feeds_a_batcher_with_the_runs_weights_and_evaluate_reuses_rlstruct_eval(runs):
    policy = load(runs["ppo"])
    create_agent, agent_args = policy.agent_factory()
    env_args = {"name": "CartPole-v1", "n_envs": 3, "backend": "torch", "autoreset": True}
    with RL_Batcher(8, create_agent, agent_args, create_env, env_args, 0, [0],
                    agent_info=policy.agent_info(3)) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    tt = traj.trajectories
    frames, actions = tt["observation/frame"], tt["action/action"]
    expected = policy.predict(frames.flatten(0, 1)).unflatten(0, actions.shape)
    assert torch.equal(actions, expected)
    result = policy.evaluate(episodes=2, seed=0)
    assert result["algo"] == "ppo" and result["episodes"] == 2 and result["policy"] == "greedy"


# --------------------------------------------------------------------------- errors
def test_a_path_that_is_no_run_is_a_checkpoint_error_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match=r"run_or_checkpoint='.*nowhere' does not exist; pass the checkpoint.pt "
                                              r"of an earlier run, or its log folder"):
        load(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=r"is a folder without a checkpoint.pt; pass the checkpoint file"):
        load(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"notes.txt' is not an rlstruct checkpoint.*pass a checkpoint.pt"):
        load(tmp_path / "notes.txt")


def test_weights_that_do_not_fit_are_a_checkpoint_error(runs, tmp_path):
    data = torch.load(f"{runs['ppo']}/checkpoint.pt", weights_only=True)
    data["model"] = {k: v[:1] if v.dim() else v for k, v in data["model"].items()}
    data["digest"] = content_digest(data)  # written whole, by code whose weights do not fit its config
    torch.save(data, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="holds weights that do not fit the network its config describes"):
        load(tmp_path)


@pytest.mark.parametrize("observation, match", [
    (np.zeros(3, np.float32), r"shape \(4,\) \(one observation\) or \(N, 4\) \(a batch\) for CartPole-v1, got \(3,\)"),
    (np.zeros((2, 2, 4), np.float32), r"shape \(4,\) .* got \(2, 2, 4\); pass the env's observation"),
    (torch.zeros(4, dtype=torch.bool), r"dtype float32 for CartPole-v1, got bool; pass the env's observation"),
    (np.array(["a", "b", "c", "d"]), r"observation must be an array of shape \(4,\) .* and dtype float32, got"),
])
def test_an_observation_that_does_not_fit_is_a_space_error_naming_the_expected_shape(runs, observation, match):
    with pytest.raises(SpaceError, match=match):
        load(runs["ppo"]).predict(observation)


# --------------------------------------------------------------------------- torch threads
class _ThreadsSpy:
    """The policy's agent, noting torch's thread count at each forward pass."""

    def __init__(self, agent, seen: list[int]):
        self.agent, self.seen = agent, seen

    def __call__(self, *args):
        self.seen.append(torch.get_num_threads())
        return self.agent(*args)

    def __getattr__(self, name):
        return getattr(self.agent, name)


def test_predict_runs_at_the_runs_torch_threads_and_leaves_the_callers_count(tmp_path):
    run = _run(tmp_path, "a2c", a2c, a2c.A2CConfig, max_env_steps=64, n_steps=16, torch_threads=2)
    callers = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        seen: list[int] = []
        for torch_threads, during in [(None, 2), (1, 1), (0, 3)]:  # the run's (what train used), given, the process's
            policy = load(run, torch_threads=torch_threads)
            policy.agent = _ThreadsSpy(policy.agent, seen)
            policy.predict(np.zeros(4, np.float32))
            assert seen[-1] == during and torch.get_num_threads() == 3
        with pytest.raises(SpaceError):
            load(run).predict(np.zeros(3, np.float32))
        assert torch.get_num_threads() == 3  # restored after a call that raised too
    finally:
        torch.set_num_threads(callers)
    assert load(run).torch_threads == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_torch_threads_of_load_is_checked(bad):
    with pytest.raises(ValueError, match=rf"torch_threads must be an int >= 0 or None \(the run's\), got {bad!r}; "):
        load("no/such/run", torch_threads=bad)
