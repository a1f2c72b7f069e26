"""A population of seeds trained in one process (``--seeds``): member k is the solo run of seed k (the same rows,
evaluations and stop, bitwise: each member's learner is the family's own and its envs and agent draws are seeded as
the solo run's), each member a run folder every command reads; a member that diverges ends alone; bad seeds are one
line; Ctrl-C checkpoints every member and ``--resume ROOT`` continues them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from rlstruct.algos import a2c, dqn, impala, ppo, reinforce, sac
from rlstruct.algos._train import cli, train_command
from rlstruct.algos._train.loops import OnPolicyLearning
from rlstruct.algos._train.population_loop import member_folder, population_seeds
from rlstruct.algos.harness import trainer
from rlstruct.algos.population import PopulationAgent, member_runs
from rlstruct.errors import BatchSizeError, ConfigError, SeedError
from tests.algos.test_family_contract import KL_PPO, KL_SMALL, KLPPOConfig
from tests.helpers import ForkedCommand, wall_limit

SMALL = {"progress": False, "tensorboard": False, "n_evaluation_envs": 2, "evaluation_max_steps": 50, "eval_every": 3,
         "log_every": 1, "stop_at_reward_threshold": False, "preset": "none", "hidden_sizes": (16,)}


def training_rows(history: list[dict]) -> list[dict]:
    """The rows without what the wall clock decides (nan as None: comparable)."""
    return [{k: None if v != v else v for k, v in row.items()
             if "time" not in k and not k.endswith(("per_s", "_s"))} for row in history]


def assert_members_are_solo_runs(train, config, seeds, tmp_path: Path) -> list:
    members = train(dataclasses.replace(config, logdir=str(tmp_path / "pop")), seeds=seeds)
    assert [Path(m.logdir) for m in members] == [member_folder(tmp_path / "pop", s) for s in seeds]
    for seed, member in zip(seeds, members):
        solo = train(dataclasses.replace(config, seed=seed, logdir=str(tmp_path / f"solo-{seed}")))
        assert training_rows(member.history) == training_rows(solo.history), seed
        assert (member.eval_return, member.env_steps, member.stop_reason) == (
            solo.eval_return, solo.env_steps, solo.stop_reason)
        saved = json.loads((Path(member.logdir) / "config.json").read_text())
        assert (saved["seed"], saved["seeds"]) == (seed, list(seeds))
    return members


@pytest.mark.slow  # a population of two and their two solo runs, 4 iterations each
@pytest.mark.parametrize("n_processes", [0, 2])
def test_ppo_members_are_the_solo_runs_of_their_seeds(n_processes, tmp_path):
    """Four iterations: the untrained evaluation, one after the third update and the final one are compared too."""
    config = ppo.PPOConfig(env="CartPole-v1", n_envs=4, n_steps=16, n_minibatches=2, n_epochs=2,
                           max_env_steps=4 * 64, n_processes=n_processes, **SMALL)
    members = assert_members_are_solo_runs(ppo.train, config, [3, 1], tmp_path)
    assert population_seeds(tmp_path / "pop") == (3, 1)
    assert [(m.iterations, m.env_steps) for m in members] == [(4, 256), (4, 256)]


@pytest.mark.slow  # a population of two over two workers and its two solo runs in one worker each, 4 iterations
def test_a_populations_workers_split_its_members_envs_together(tmp_path, capsys):
    """A member of one env over two workers (the population's 2 x 1 envs split evenly, as SAC on MuJoCo's one env a
    run over five workers): each member is its solo run in one worker; 3 x 1 envs over 2 workers is one line."""
    config = ppo.PPOConfig(env="CartPole-v1", n_envs=1, n_steps=16, n_minibatches=2, n_epochs=1,
                           max_env_steps=4 * 16, n_processes=2, **SMALL)
    members = ppo.train(dataclasses.replace(config, logdir=str(tmp_path / "pop")), seeds=[3, 1])
    for seed, member in zip([3, 1], members):
        solo = ppo.train(dataclasses.replace(config, seed=seed, n_processes=1, logdir=str(tmp_path / f"solo-{seed}")))
        assert training_rows(member.history) == training_rows(solo.history), seed
    with pytest.raises(ConfigError, match=r"a population's 3 x n_envs training envs are split evenly over its 2 "
                                          r"training workers .* got --n-envs 1 \(3 envs\); pass --n-envs 1 with "
                                          r"--n-processes 1"):
        ppo.train(dataclasses.replace(config, logdir=str(tmp_path / "odd")), seeds=[0, 1, 2])


DQN_SMALL = {"env": "CartPole-v1", "n_envs": 4, "rollout_steps": 4, "learning_starts": 64, "batch_size": 16,
             "gradient_steps": 4, "target_update_interval": 8, "max_env_steps": 10 * 16, **SMALL}


@pytest.mark.slow
def test_dqn_members_stepping_on_their_own_are_the_solo_runs_of_their_seeds(tmp_path):
    config = dqn.DQNConfig(**DQN_SMALL, population_batched=False)
    assert_members_are_solo_runs(dqn.train, config, [0, 1], tmp_path)


def close_rows(a: list[dict], b: list[dict], rtol: float) -> bool:
    """Row for row the same keys, and values equal or within ``rtol`` of each other."""
    if len(a) != len(b) or any(x.keys() != y.keys() for x, y in zip(a, b)):
        return False
    return all(u == v or (isinstance(u, float) and isinstance(v, float) and abs(u - v) <= rtol * max(abs(v), 1e-6))
               for x, y in zip(a, b) for u, v in ((x[k], y[k]) for k in x))


@pytest.mark.slow
def test_dqns_batched_step_is_each_members_solo_step_to_float32_rounding_and_checkpoints_its_state(tmp_path):
    """One batched gradient step of every member (stacked networks, one fused Adam): each member's rows are its
    solo run's to float32 rounding over 10 iterations (40 gradient steps, 5 target copies); its checkpoint holds
    its own Adam state and target, from which --resume goes on."""
    config = dqn.DQNConfig(**DQN_SMALL)
    members = dqn.train(dataclasses.replace(config, logdir=str(tmp_path / "pop")), seeds=[0, 1])
    for seed, member in zip((0, 1), members):
        solo = dqn.train(dataclasses.replace(config, seed=seed, logdir=str(tmp_path / f"solo-{seed}")))
        assert close_rows(training_rows(member.history), training_rows(solo.history), 1e-4), seed
        assert training_rows(member.history) != training_rows(solo.history) or seed  # the kernels differ
        saved = torch.load(Path(member.logdir) / "checkpoint.pt", weights_only=True)
        alone = torch.load(Path(solo.logdir) / "checkpoint.pt", weights_only=True)
        steps = [float(s["step"]) for s in saved["learner"]["optimizer"]["state"].values()]
        assert steps == [float(s["step"]) for s in alone["learner"]["optimizer"]["state"].values()] and steps[0] > 0
        for name, value in alone["learner"]["target"].items():
            assert torch.allclose(saved["learner"]["target"][name], value, rtol=1e-4, atol=1e-6), name
    more = dqn.train(dataclasses.replace(config, resume=str(tmp_path / "pop"), logdir=None,
                                         max_env_steps=12 * 16), seeds=[0, 1])
    assert [m.env_steps for m in more] == [12 * 16] * 2


@pytest.mark.slow
def test_sac_members_are_the_solo_runs_of_their_seeds(tmp_path):
    """6 iterations of 8 env steps: 4 of warm-up, then 2 that learn (16 gradient steps), an evaluation after the
    third and the final one."""
    config = sac.SACConfig(env="Pendulum-v1", n_envs=2, rollout_steps=4, learning_starts=32, batch_size=16,
                           max_env_steps=6 * 8, **SMALL)
    assert_members_are_solo_runs(sac.train, config, [0, 1], tmp_path)


@pytest.mark.slow
def test_reinforce_members_collect_their_own_episodes_as_their_solo_runs(tmp_path):
    """Whole episodes: each member steps its own episodic batcher (the shared one calls the agent on running envs
    only), in the one process."""
    config = reinforce.ReinforceConfig(env="CartPole-v1", n_envs=4, max_env_steps=300, **SMALL)
    assert_members_are_solo_runs(reinforce.train, config, [0, 1], tmp_path)


@pytest.mark.slow
def test_an_algorithm_from_outside_gets_populations_with_its_own_learn_state(tmp_path):
    """The adaptive-KL PPO written outside on the public face: each member keeps its own coefficient, as its solo
    run does."""
    config = KLPPOConfig(**{**KL_SMALL, "max_env_steps": 6 * 32})
    members = assert_members_are_solo_runs(trainer(KL_PPO), config, [0, 2], tmp_path)
    coefs = [[row["kl_coef"] for row in m.history if "kl_coef" in row] for m in members]
    assert coefs[0] != coefs[1]


@pytest.mark.slow
def test_a_member_that_diverges_ends_alone(tmp_path, monkeypatch):
    """Seed 1's weights turn NaN at its third update: it ends as diverged, its NaN weights never reach the shared
    batcher's agent, and seed 0 runs to its budget as its solo run does."""
    real = OnPolicyLearning.learn_from

    def learn_from(self, traj, stats, phase):
        out = real(self, traj, stats, phase)
        if self.run.config.seed == 1 and self.run.iteration == 2:
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)
        return out

    monkeypatch.setattr(OnPolicyLearning, "learn_from", learn_from)
    config = a2c.A2CConfig(env="CartPole-v1", n_envs=4, n_steps=8, max_env_steps=5 * 32, **SMALL)
    first, second = a2c.train(dataclasses.replace(config, logdir=str(tmp_path / "pop")), seeds=[0, 1])
    assert second.stop_reason == "diverged" and second.env_steps < config.max_env_steps
    assert json.loads((Path(second.logdir) / "summary.json").read_text())["stop_reason"] == "diverged"
    monkeypatch.setattr(OnPolicyLearning, "learn_from", real)
    solo = a2c.train(dataclasses.replace(config, seed=0, logdir=str(tmp_path / "solo")))
    assert first.stop_reason == "budget" and training_rows(first.history) == training_rows(solo.history)


class _Recording:
    """A member's agent that records the weights it was given."""

    def __init__(self, **kwargs):
        self.given = []

    def update(self, state_dict):
        self.given.append(state_dict)


def test_the_population_agent_splits_rows_by_member_and_keeps_a_members_last_finite_weights():
    agent = PopulationAgent(create_member=_Recording, member_args={}, rows=[(5, 0), (5, 1), (9, 0)],
                            members=[5, 9], n_rows=3)
    assert member_runs(agent.rows, 1, 2, [5, 9]) == [(0, 0, 1, 1), (1, 1, 2, 0)]
    agent.update({"0.w": torch.ones(2), "1.w": torch.zeros(2)})
    agent.update({"0.w": torch.full((2,), math.nan), "1.w": torch.ones(2)})
    assert [len(a.given) for a in agent.agents] == [1, 2]  # member 0 kept its finite weights
    assert torch.equal(agent.agents[1].given[-1]["w"], torch.ones(2))
    with pytest.raises(BatchSizeError, match="auto-reset"):
        agent._runs(2)


@pytest.mark.parametrize("seeds, match", [(["--seeds", "0,0"], "0 repeated"), (["--seeds", "3"], "two or more"),
                                          (["--seeds=-1,2"], r"seeds\[0\]"), (["--seeds", "0,x"], "seeds")])
def test_bad_seeds_are_one_line_and_status_2(seeds, match, capsys):
    try:
        status = train_command.main("a2c", ["--env", "CartPole-v1", "--no-progress", *seeds])
    except SystemExit as e:  # the parser's own refusal
        status = e.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and re.search(match, err), err


def test_a_family_without_a_population_loop_is_refused_in_one_line(tmp_path):
    config = impala.IMPALAConfig(env="CartPole-v1", logdir=str(tmp_path / "i"), **SMALL)
    with pytest.raises(ConfigError, match="no population_loop.*--seed S"):
        impala.train(config, seeds=[0, 1])
    assert not (tmp_path / "i").exists()
    with pytest.raises(SeedError):
        a2c.train(a2c.A2CConfig(env="CartPole-v1", **SMALL), seeds=[0, 2**31])


@pytest.mark.slow
def test_ctrl_c_checkpoints_every_member_and_resume_root_continues_them(tmp_path, capsys):
    """The population's command runs in a fork of this process (what is tested is what a SIGINT leaves in every
    member's folder, not an interpreter's start); ``--resume ROOT`` is the command, in this process."""
    root = tmp_path / "pop"
    proc = ForkedCommand(["train", "a2c", "--env", "CartPole-v1", "--seeds", "0,1", "--n-envs", "4", "--n-steps", "8",
                          "--max-env-steps", "100000000", "--checkpoint-every", "1", "--no-progress",
                          "--no-tensorboard", "--preset", "none", "--no-stop-at-reward-threshold", "--logdir",
                          str(root)], tmp_path / "pop-command")
    try:
        deadline = time.monotonic() + wall_limit(120)
        while not all((member_folder(root, s) / "checkpoint.pt").exists() for s in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, proc.stderr
    summaries = [json.loads((member_folder(root, s) / "summary.json").read_text()) for s in (0, 1)]
    assert all(s["interrupted"] and s["checkpoint"] for s in summaries)
    reached = [s["env_steps"] for s in summaries]
    capsys.readouterr()
    assert cli.main(["train", "a2c", "--resume", str(root), "--max-env-steps", str(max(reached) + 64),
                     "--no-progress"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [m["env_steps"] for m in last["members"]] == [max(reached) + 64] * 2
    assert [m["logdir"] for m in last["members"]] == [str(member_folder(root, s)) for s in (0, 1)]


@pytest.mark.slow
def test_a_population_on_the_accelerator_path_is_its_solo_runs(tmp_path):
    """The GPU path through the recording accelerator (its streams and events standing in for a GPU's): the shared
    batcher in process on the learner's device, the collection overlapping the update on a stream of its own (the
    weights copied on the device, read by the population's agent), PPO's rows those of the solo runs under the same
    fake."""
    from rlstruct import _accel
    from tests.fakes_accel import RecordingAccelerator

    config = ppo.PPOConfig(env="CartPole-v1", n_envs=4, n_steps=8, n_minibatches=2, n_epochs=1, overlap=True,
                           max_env_steps=6 * 32, **SMALL)
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        members = ppo.train(dataclasses.replace(config, logdir=str(tmp_path / "pop")), seeds=[0, 1])
        streams = len(fake.streams)
        solos = [ppo.train(dataclasses.replace(config, seed=s, logdir=str(tmp_path / f"solo-{s}"))) for s in (0, 1)]
    assert streams >= 2, "the population's collection ran on a stream of its own"
    for member, solo in zip(members, solos):
        assert training_rows(member.history) == training_rows(solo.history)
