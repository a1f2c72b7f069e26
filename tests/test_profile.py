"""The profile report: PhaseTimer, the loss numerics, the phase split, profile_training and its command."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from rlstruct.batchers import PhaseTimer, profile_training
from rlstruct.batchers.profile import (
    LEARNER_PHASES,
    WORKER_PHASES,
    MLPAgent,
    discounted_returns,
    mlp_policy,
    policy_gradient_loss,
    split_collection,
)
from rlstruct.errors import MissingDependencyError, SpaceError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

pytestmark = pytest.mark.timeout(120)

PHASES = [*WORKER_PHASES, "wait", "gather", *LEARNER_PHASES, "other"]


def test_phase_timer_accumulates_and_syncs_only_at_boundaries(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timer = PhaseTimer("cuda:0")  # no CUDA needed: synchronize is replaced
    with timer("loss"):
        assert len(calls) == 1
    with timer("loss"):
        pass
    with timer("backward"):
        pass
    assert len(calls) == 6 and all(d == torch.device("cuda:0") for d in calls)
    assert timer.counts == {"loss": 2, "backward": 1} and all(v >= 0 for v in timer.seconds.values())
    calls.clear()
    with PhaseTimer("cuda:0", sync=False)("x"), PhaseTimer("cpu")("y"):
        pass
    assert calls == []
    timer.reset()
    assert timer.seconds == {} and timer.counts == {}


def test_phase_timer_charges_a_phase_that_raises():
    timer = PhaseTimer()
    with pytest.raises(KeyError):
        with timer("loss"):
            raise KeyError("boom")
    assert timer.counts == {"loss": 1}


def test_discounted_returns_match_a_python_loop():
    g = torch.Generator().manual_seed(0)
    B, T, gamma = 5, 7, 0.9
    reward = torch.randn(B, T, generator=g)
    done = torch.rand(B, T, generator=g) < 0.3
    lengths = torch.tensor([7, 3, 1, 6, 7])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    got = discounted_returns(reward, done, mask, gamma)
    want = torch.zeros(B, T)
    for b in range(B):
        G = 0.0
        for t in reversed(range(int(lengths[b]))):
            G = float(reward[b, t]) + gamma * (0.0 if done[b, t] else G)
            want[b, t] = G
    torch.testing.assert_close(got, want)


def test_policy_gradient_loss_pushes_up_the_rewarded_action():
    model = mlp_policy(4, 2, hidden=8, seed=0)
    B, T = 16, 3
    action = torch.randint(0, 2, (B, T), generator=torch.Generator().manual_seed(1))
    traj = Trajectories(DictTensor({}), TemporalDictTensor({
        "observation/frame": torch.zeros(B, T, 4),
        "action/action": action,
        "_observation/reward": (action == 1).float(),
        "_observation/done": torch.zeros(B, T, dtype=torch.bool),
    }, torch.full((B,), T)))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    p0 = torch.softmax(model(torch.zeros(1, 4)), -1)[0, 1]
    for _ in range(5):
        opt.zero_grad()
        policy_gradient_loss(model, traj).backward()
        opt.step()
    assert torch.softmax(model(torch.zeros(1, 4)), -1)[0, 1] > p0


def test_split_collection_scales_overlapping_workers_to_the_collection_time():
    t = {"env_step": 6.0, "agent_forward": 2.0, "buffer_write": 0.0, "copy": 0.0}
    out = split_collection(t, 2.0, 2)  # 4 s of work per worker, 2 s of driver time
    assert out == {"env_step": 1.5, "agent_forward": 0.5, "buffer_write": 0.0, "copy": 0.0, "graph_replay": 0.0,
                   "wait": 0.0}
    assert split_collection({}, 1.0, 1)["wait"] == 1.0


def test_mlp_agent_is_seeded():
    obs = DictTensor({"frame": torch.randn(64, 4)})
    a, b = MLPAgent(4, 2, seed=3), MLPAgent(4, 2, seed=3)
    a.seed(7), b.seed(7)
    assert torch.equal(a(None, obs, None)[0]["action"], b(None, obs, None)[0]["action"])


@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize("n_processes", [0, 1])
def test_profile_training_accounts_for_the_wall_time(n_processes, zero_copy):
    report = profile_training("CartPole-v1", n_envs=8, n_processes=n_processes, n_timesteps=4, iterations=3,
                              zero_copy=zero_copy)
    assert report.config["zero_copy"] is zero_copy
    assert list(report.seconds) == PHASES
    assert report.env_steps == 3 * 8 * 4 and report.iterations == 3
    assert all(v >= 0 for v in report.seconds.values())
    assert sum(report.seconds.values()) == pytest.approx(report.wall_s, rel=0.05)
    assert sum(report.shares().values()) == pytest.approx(1.0)
    for k in ("agent_forward", "env_step", "loss", "backward", "optimizer"):
        assert report.seconds[k] > 0, k
    if n_processes:
        assert report.batcher_timings["wait"] > 0
    text = report.table()
    assert all(k in text for k in PHASES) and "steps/s" in text


def test_profile_plot_writes_a_png(tmp_path):
    report = profile_training("CartPole-v1", n_envs=4, n_timesteps=2, iterations=1)
    path = report.plot(tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_errors_are_named(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="iterations must be an int >= 1, got 0"):
        profile_training(iterations=0)
    with pytest.raises(ValueError, match="n_processes must be an int >= 0"):
        profile_training(n_processes=-1)
    with pytest.raises(SpaceError, match="discrete actions.*Pendulum-v1.*use CartPole-v1"):
        profile_training("Pendulum-v1")
    report = profile_training("CartPole-v1", n_envs=4, n_timesteps=2, iterations=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[plot\]'"):
        report.plot(tmp_path / "p.png")


def test_profile_command(tmp_path, capsys):
    from rlstruct.algos.cli import main

    png = tmp_path / "profile.png"
    assert main(["profile", "--n-envs", "4", "--n-timesteps", "2", "--iterations", "2", "--png", str(png)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert set(result["seconds"]) == set(PHASES) and result["env_steps"] == 16 and result["png"] == str(png)
    assert any(line.startswith("env_step") for line in out) and png.exists()
    assert main(["profile", "--n-envs", "4", "--n-timesteps", "2", "--iterations", "2", "--zero-copy", "--png", ""]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]["zero_copy"] is True
    assert main(["profile", "--env", "Pendulum-v1", "--png", ""]) == 2
    assert "rlstruct profile: error: env must have discrete actions" in capsys.readouterr().err
    assert main(["profile", "--cuda-graph", "--png", ""]) == 2
    assert "error: cuda_graph=True needs every worker on a CUDA device, but worker 0 runs on cpu" in capsys.readouterr().err


@pytest.mark.cuda
def test_profile_training_with_a_cuda_graph_charges_the_replays():
    report = profile_training("CartPole-v1", n_envs=64, n_timesteps=8, iterations=2, device="cuda", cuda_graph=True)
    assert list(report.seconds) == PHASES and report.env_steps == 2 * 64 * 8
    assert report.seconds["graph_replay"] > 0
    assert report.seconds["env_step"] == report.seconds["agent_forward"] == 0
    assert report.config["cuda_graph"] is True
