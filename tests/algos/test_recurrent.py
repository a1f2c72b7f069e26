"""Recurrent policies: the LSTM memory carried in the agent state, its replay, and recurrent A2C on a POMDP."""

from __future__ import annotations

import json

import pytest
import torch

from rlstruct import DictTensor, RL_Batcher
from rlstruct.agents import RL_Agent_CheckDevice, replay_agent
from rlstruct.algos import a2c, create_env, describe_env, ppo
from rlstruct.algos._train.session import validate
from rlstruct.algos.networks import RecurrentActorCritic
from rlstruct.algos.policies import RecurrentPolicyAgent, create_recurrent_agent, replay_window
from rlstruct.devices import cpu_state_dict
from rlstruct.errors import SpaceError
from tests.helpers import rlstruct_in_process

pytestmark = pytest.mark.timeout(120)
ENV = "CartPoleNoVel-v1"


def _batcher(spec, n_envs=6, n_timesteps=12, max_episode_steps=7, **kw):
    agent_args = {"spec": spec, "hidden_sizes": (16,), "device": "cpu"}
    env_args = {"name": ENV, "n_envs": n_envs, "autoreset": True, "backend": "torch",
                "max_episode_steps": max_episode_steps}
    return RL_Batcher(n_timesteps, create_recurrent_agent, agent_args, create_env, env_args, 0, [3],
                      agent_info=DictTensor({"stochastic": torch.tensor([True])}), agent_seeds=[4], **kw)


# The batcher steps the LSTM one step at a time in its worker process; the replay runs the same steps in this
# process, on other row counts and torch threads. Same arithmetic, but a CPU's kernels may block and vectorise a
# matrix product differently for other shapes, so the sums round differently: equal to the last bit on some CPUs,
# a few float32 ulps apart on others. A wrong stored state, a missed reset or a step off by one moves the log-probs by
# far more than this tolerance (1e-2 and beyond).
REPLAY_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def test_replaying_the_stored_windows_reproduces_the_batchers_outputs():
    spec = describe_env(ENV, "torch", None)
    torch.manual_seed(0)
    model = RecurrentActorCritic(spec.obs_shape, spec.n_actions, (16,))
    learner_agent = RecurrentPolicyAgent(model, "cpu")
    with _batcher(spec) as batcher:
        batcher.update(cpu_state_dict(model))
        batcher.reset()
        previous_end = None
        for _ in range(3):
            batcher.execute()
            traj, _ = batcher.get()
            tt = traj.trajectories
            # Episodes of 7 steps in windows of 12: the memory is reset in the middle of every window.
            assert tt["observation/initial_state"][:, 1:].any()
            out = replay_window(learner_agent, model, traj)
            torch.testing.assert_close(out["log_prob"], tt["action/log_prob"], **REPLAY_TOLERANCE)
            full = replay_agent(learner_agent, traj)
            if previous_end is not None:
                # The state stored at a window's start is the memory after the previous window's last step.
                torch.testing.assert_close(traj.info["agent_state/h"], previous_end[0], **REPLAY_TOLERANCE)
                torch.testing.assert_close(traj.info["agent_state/c"], previous_end[1], **REPLAY_TOLERANCE)
                assert traj.info["agent_state/h"].abs().sum() > 0
            previous_end = (full["h"][:, -1], full["c"][:, -1])


def test_the_replay_steps_through_the_resets_and_bootstraps_from_each_steps_memory():
    spec = describe_env(ENV, "torch", None)
    torch.manual_seed(1)
    model = RecurrentActorCritic(spec.obs_shape, spec.n_actions, (16,))
    agent = RecurrentPolicyAgent(model, "cpu")
    with _batcher(spec, n_envs=4, n_timesteps=10, max_episode_steps=4) as batcher:
        batcher.update(cpu_state_dict(model))
        batcher.reset()
        batcher.execute()
        batcher.get()
        batcher.execute()
        traj, _ = batcher.get()
    tt = traj.trajectories
    out = replay_window(agent, model, traj)
    # A plain loop over envs and steps, one row at a time.
    for b in range(4):
        h, c = traj.info["agent_state/h"][b:b + 1], traj.info["agent_state/c"][b:b + 1]
        for t in range(10):
            start = tt["observation/initial_state"][b:b + 1, t]
            h, c = model.core_step(tt["observation/frame"][b:b + 1, t], h, c, start)
            logits, value = model.heads(h)
            hn, _ = model.core_step(tt["_observation/frame"][b:b + 1, t], h, c, torch.zeros(1, dtype=torch.bool))
            log_pi = torch.log_softmax(logits[0], -1)[tt["action/action"][b, t]]
            assert torch.allclose(out["log_prob"][b, t], log_pi, atol=1e-6)
            assert torch.allclose(out["value"][b, t], value[0], atol=1e-6)
            assert torch.allclose(out["next_value"][b, t], model.heads(hn)[1][0], atol=1e-6)
    # Gradients reach the encoder, the core and both heads through the window.
    (out["log_prob"].sum() + out["value"].sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_the_memory_is_zeroed_where_an_episode_starts():
    model = RecurrentActorCritic((2,), 2, (8,))
    agent = RecurrentPolicyAgent(model, "cpu")
    frame = torch.randn(4, 2)
    state = DictTensor({"h": torch.randn(4, 8), "c": torch.randn(4, 8)})
    start = torch.tensor([True, False, True, False])
    _, new = agent(state, DictTensor({"frame": frame, "initial_state": start}), DictTensor({}))
    _, fresh = agent(agent.initial_state(DictTensor({}), 4), DictTensor({"frame": frame, "initial_state": start}),
                     DictTensor({}))
    assert torch.equal(new["h"][start], fresh["h"][start])
    assert not torch.equal(new["h"][~start], fresh["h"][~start])


def test_the_checked_replay_is_the_plain_one():
    spec = describe_env(ENV, "torch", None)
    model = RecurrentActorCritic(spec.obs_shape, spec.n_actions, (16,))
    agent = RecurrentPolicyAgent(model, "cpu")
    with _batcher(spec, n_envs=3, n_timesteps=5) as batcher:
        batcher.update(cpu_state_dict(model))
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    plain, checked = replay_window(agent, model, traj), replay_window(RL_Agent_CheckDevice(agent, "cpu"), model, traj)
    for k in ("log_prob", "entropy", "value", "next_value"):
        assert torch.equal(plain[k], checked[k])


def _a2c(tmp_path, **kw):
    return a2c.A2CConfig(env=ENV, recurrent=True, progress=False, tensorboard=False, logdir=str(tmp_path),
                         time_limit=300.0, **kw)


#: A memoryless policy's ceiling on CartPoleNoVel-v1: feed-forward A2C's best evaluations were 44-47 in 120k env steps
#: (seeds 0-3 and 47.1 again on seed 0, Intel Xeon; 45.7 on seed 0, AMD EPYC with AVX-512) and 45.5-50.1 in 30k-80k
#: (seeds 0-2, docs/benchmarks/gpu-seam.md).
FEED_FORWARD_BEST = 50.1


@pytest.mark.long(reason="a learning proof: recurrent A2C needs 120k env steps before its best evaluation leaves the "
                         "feed-forward policy's ceiling on every seed and CPU measured")
@pytest.mark.timeout(300)
def test_recurrent_a2c_learns_cartpole_without_velocities(tmp_path):
    """The LSTM's best evaluation in 120k env steps is well above what a memoryless policy reaches on this POMDP.

    Without an entropy bonus the policy first collapses towards one action, and when it escapes depends on the seed
    and on the last bits of the CPU's rounding, so one seed's best evaluation spreads widely. Measured (best
    evaluation in 120k env steps): seeds 0-9 with 1 torch thread on an Intel Xeon: 291, 360, 101, 500, 497, 494, 500,
    500, 500, 500; seeds 0-9 with 2 torch threads: 204, 500, 77, 500, 500, 283, 500, 411, 500, 500 (seed 0's
    evaluations leave the 1-thread run's after 70k env steps); seed 0 on an AMD EPYC with AVX-512: 85.5. Feed-forward
    A2C stays at 44-50 (``FEED_FORWARD_BEST``). The threshold, 1.2 times the best feed-forward result measured (60.1),
    is 22% under the lowest LSTM result measured (77.2, seed 2 with 2 threads).

    This run is tutorial 10's LSTM run at full size (``recurrent_against_feed_forward(120_000)``'s settings, seed 8 of
    the seeds measured): this test checks that tutorial's claim, the LSTM well above the MLP, whose own test runs it
    at a tenth of the budget.
    """
    # The claim is the best evaluation only: the run stops once an evaluation clears the threshold and its
    # confirmation on fresh episodes does too (a confirmation under it lets the run go on), so a run that passes
    # stops early and one that fails spends the whole budget, as it did without the target (seed 0 on an AMD EPYC:
    # 62.1 at 96,000 env steps, confirmed at 58.6, then 68.1 at 102,400, confirmed at 76.8). The test runs seed 8
    # (500 within the budget with either thread count on the Intel Xeon): on the AMD EPYC it stops at 45,312 env
    # steps with 1 torch thread and with 2 (69.3, confirmed at 66.3; benchmarks/thresholds.py recurrent-a2c), where
    # seeds 0, 3 and 6 took 103k, 71k and 52k.
    threshold = 1.2 * FEED_FORWARD_BEST
    result = a2c.train(_a2c(tmp_path, max_env_steps=120_000, seed=8, target_return=threshold, preset="none"))
    evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
    assert max(evals) >= threshold, evals


@pytest.mark.long(reason="a learning proof: up to 60k env steps of an LSTM policy, 24-27 CPU s on a 2-core machine "
                         "(seed 1 stops at its confirmed 200 after 35k: 19 CPU s at a load of 10)")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recurrent_ppo_learns_cartpole_without_velocities(tmp_path):
    """The LSTM's best evaluation in 60k env steps, far above the feed-forward ceiling (``FEED_FORWARD_BEST``).
    Seeds 0-9 (benchmarks/thresholds.py recurrent-ppo): with 1 torch thread best evaluations 322.9-500 (seed 1: 500),
    with 2 threads 315.2-500 (seed 1: 476.9). The threshold (200) is 37% under the lowest."""
    # As the A2C test: the run stops at a confirmed evaluation of 200 or more, else spends its 60k env steps (the
    # measurement above ran the whole budget, the same verdict). With 1 torch thread on an AMD EPYC, seeds 0-3 stopped
    # at 40,960, 34,816, 51,200 and 59,392 env steps: the test runs seed 1, the earliest (225.4 confirmed).
    cfg = ppo.PPOConfig(env=ENV, recurrent=True, progress=False, tensorboard=False, logdir=str(tmp_path),
                        time_limit=300.0, max_env_steps=60_000, seed=1, target_return=200.0)
    result = ppo.train(cfg)
    evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
    assert max(evals) >= 200, evals


def test_recurrent_configs_are_checked():
    with pytest.raises(ValueError, match=r"n_minibatches must be <= the envs per collection with recurrent=True.*"
                                         r"= 4\), got 8"):
        validate(ppo.ALGORITHM, ppo.PPOConfig(env=ENV, recurrent=True, n_envs=4, n_minibatches=8))
    with pytest.raises(SpaceError, match="recurrent PPO takes discrete actions, got env='Pendulum-v1'"):
        validate(ppo.ALGORITHM, ppo.PPOConfig(env="Pendulum-v1", recurrent=True))
    with pytest.raises(SpaceError, match="recurrent A2C takes discrete actions, got env='Pendulum-v1'"):
        validate(a2c.ALGORITHM, a2c.A2CConfig(env="Pendulum-v1", recurrent=True))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_recurrent_training_from_the_command_line_checkpoints_and_eval_reloads_it(algo, tmp_path, capsys):
    """The console script's code in this process (its flags, its checkpoint, ``rlstruct eval`` reading it back): a
    fresh interpreter would add its imports and nothing this test checks."""
    logdir = tmp_path / "run"
    out = rlstruct_in_process(capsys, "train", algo, "--env", ENV, "--recurrent", "--max-env-steps", "256",
                              "--n-envs", "4", "--n-evaluation-envs", "2", "--max-episode-steps", "50", "--no-progress",
                              "--no-tensorboard", "--logdir", str(logdir))
    assert out.returncode == 0, out.stderr
    ckpt = torch.load(logdir / "checkpoint.pt", weights_only=True)
    assert ckpt["config"]["recurrent"] is True and "core.weight_ih" in ckpt["model"]
    ev = rlstruct_in_process(capsys, "eval", str(logdir / "checkpoint.pt"), "--episodes", "3")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert result["algo"] == algo and result["episodes"] == 3 and 0 < result["eval_return"] <= 50
