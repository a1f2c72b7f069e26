"""The profile report: PhaseTimer, the phase split, profile_training and its command."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import time

import pytest
import torch

import rlstruct.algos._train.actor_critic as actor_critic
import rlstruct.algos._train.loops as loops
from rlstruct.algos import a2c, ppo, profile_training
from rlstruct.algos.policies import create_policy_agent
from rlstruct.batchers import PhaseTimer
from rlstruct.batchers.profile import COLLECT, LEARNER_PHASES, WORKER_PHASES, LoopTimer, split_collection
from rlstruct.errors import ConfigError, MissingDependencyError

#: whether the plot extra (matplotlib) is installed: without it, writing a PNG is a one-line error naming the extra
PLOT = importlib.util.find_spec("matplotlib") is not None

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


def test_loop_timer_counts_the_iterations_after_the_warm_up():
    class Batcher:
        steps = 0.0

        def timings(self):
            return {"env_steps": self.steps, "gather": self.steps / 100}

    batcher, timer = Batcher(), LoopTimer(warmup=2)
    timer.watch(batcher)
    for _ in range(5):
        with timer(COLLECT):
            batcher.steps += 10
            time.sleep(0.001)
        with timer("learn"):
            pass
    assert timer.iterations == 3 and timer.counts == {COLLECT: 3, "learn": 3}
    assert timer.batcher_timings == {"env_steps": 30, "gather": 0.3}
    report = timer.report(1, {"algo": "a2c"})
    assert report.env_steps == 30 and report.iterations == 3 and report.config == {"algo": "a2c"}
    assert report.seconds["gather"] == 0.3 and report.seconds["learn"] == timer.seconds["learn"]
    assert report.wall_s == timer.span >= timer.seconds[COLLECT]


def test_split_collection_scales_overlapping_workers_to_the_collection_time():
    t = {"env_step": 6.0, "agent_forward": 2.0, "buffer_write": 0.0, "copy": 0.0}
    out = split_collection(t, 2.0, 2)  # 4 s of work per worker, 2 s of driver time
    assert out == {"env_step": 1.5, "agent_forward": 0.5, "buffer_write": 0.0, "copy": 0.0, "graph_replay": 0.0,
                   "wait": 0.0}
    assert split_collection({}, 1.0, 1)["wait"] == 1.0


def test_phase_timer_measures_a_known_sleep():
    timer = PhaseTimer()
    for _ in range(3):
        with timer("sleep"):
            time.sleep(0.02)
        with timer("nothing"):
            pass
    assert 0.06 <= timer.seconds["sleep"] < 0.06 + 0.05
    assert timer.seconds["nothing"] < 0.01


def _counting(monkeypatch, module, name):
    """Replaces ``module.name`` by a wrapper that counts its calls."""
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("n_processes", [0, 1])
def test_profile_training_times_the_training_loop(n_processes, overlap, monkeypatch):
    """The profile is the on-policy loop's run: each iteration (the warm-up's too) goes through it and calls the
    algorithm's own learn step once, and the env steps are its collections'."""
    losses = _counting(monkeypatch, a2c, "a2c_loss")
    iterations = _counting(monkeypatch, loops, "record_iteration")
    report = profile_training("CartPole-v1", n_envs=8, n_processes=n_processes, n_timesteps=4, iterations=3,
                              overlap=overlap)
    assert report.config["overlap"] is overlap and report.config["algo"] == "a2c"
    assert list(report.seconds) == PHASES
    assert len(losses) == len(iterations) == 1 + 3
    assert report.env_steps == 3 * 8 * 4 == report.batcher_timings["env_steps"] and report.iterations == 3
    assert all(v >= 0 for v in report.seconds.values())
    for k in ("agent_forward", "env_step", "to_learner", "normalize", "learn", "update_weights", "record"):
        assert report.seconds[k] > 0, k
    if n_processes:
        assert report.batcher_timings["wait"] > 0
    text = report.table()
    assert all(k in text for k in PHASES) and "steps/s" in text


def test_profile_training_runs_the_chosen_algorithm(monkeypatch):
    losses = _counting(monkeypatch, ppo, "ppo_loss")
    report = profile_training("CartPole-v1", algo="ppo", n_envs=8, n_timesteps=4, iterations=2)
    config = ppo.PPOConfig()
    assert len(losses) == (1 + 2) * config.n_epochs * config.n_minibatches
    assert report.env_steps == 2 * 8 * 4 and report.config["algo"] == "ppo" and report.seconds["learn"] > 0


def test_more_iterations_report_more_env_steps_and_time():
    short = profile_training("CartPole-v1", n_envs=8, n_timesteps=4, iterations=1)
    long = profile_training("CartPole-v1", n_envs=8, n_timesteps=4, iterations=4)
    assert (short.env_steps, long.env_steps) == (32, 128)
    assert long.batcher_timings["env_steps"] == 128


class _SlowAgent:
    """Wraps the policy agent; sleeps a known time per step (module level: the batcher may pickle it)."""

    def __init__(self, agent, pause):
        self.agent, self.pause = agent, pause

    def __call__(self, *args, **kwargs):
        time.sleep(self.pause)
        return self.agent(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.agent, name)


def _slow_policy_agent(*args, pause, **kwargs):
    return _SlowAgent(create_policy_agent(*args, **kwargs), pause)


@pytest.mark.slow
def test_profile_training_charges_known_sleeps_to_their_phases(monkeypatch):
    """A sleep in the agent shows as agent_forward, a sleep in the loss as learn, and nowhere else."""
    # Sleeps long against scheduling noise on a loaded machine (a CI run beside other jobs once charged 0.6 s more
    # than its 0.3 s of sleeps to the agent): 0.75 s per phase in all.
    pause_step, pause_loss, iterations, T = 0.05, 0.25, 3, 5
    monkeypatch.setattr(actor_critic, "create_policy_agent", functools.partial(_slow_policy_agent, pause=pause_step))
    a2c_loss = a2c.a2c_loss

    def slow_loss(*args, **kwargs):
        time.sleep(pause_loss)
        return a2c_loss(*args, **kwargs)

    monkeypatch.setattr(a2c, "a2c_loss", slow_loss)
    report = profile_training("CartPole-v1", n_envs=4, n_timesteps=T, iterations=iterations)
    s = report.seconds
    slept_step, slept_loss = iterations * T * pause_step, iterations * pause_loss
    assert slept_step <= s["agent_forward"] < 2 * slept_step, s
    assert slept_loss <= s["learn"] < 2 * slept_loss, s
    for k in ("env_step", "buffer_write", "to_learner", "normalize", "update_weights", "record", "other"):
        assert s[k] < 0.5 * min(slept_step, slept_loss), (k, s)
    assert report.wall_s >= slept_step + slept_loss


def test_profile_plot_writes_a_png(tmp_path):
    report = profile_training("CartPole-v1", n_envs=4, n_timesteps=2, iterations=1)
    if not PLOT:
        with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[plot\]'"):
            report.plot(tmp_path / "p.png")
        return
    path = report.plot(tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_errors_are_named(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="iterations must be an int >= 1, got 0"):
        profile_training(iterations=0)
    with pytest.raises(ValueError, match=r"algo must collect a fixed number of steps per iteration .* got 'reinforce', "
                                         r"which collects whole episodes"):
        profile_training(algo="reinforce")
    with pytest.raises(ValueError, match=r"overlap is not a setting of DQN, got overlap=True; profile DQN without it"):
        profile_training(algo="dqn", overlap=True)
    with pytest.raises(ValueError, match="n_processes must be >= 0"):
        profile_training(n_processes=-1)
    with pytest.raises(ValueError, match="n_envs must be >= 1"):
        profile_training(n_envs=0)
    with pytest.raises(ValueError, match=r"autocast must be one of \['none', 'bfloat16'\], got 'fp16'; pass"):
        profile_training(autocast="fp16")
    report = profile_training("CartPole-v1", n_envs=4, n_timesteps=2, iterations=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[plot\]'"):
        report.plot(tmp_path / "p.png")


@pytest.mark.slow  # three profiled runs, one over two worker processes: 5-6 s
def test_profile_training_takes_a_preset_and_the_algorithms_own_settings():
    """A preset fills what the profile is not given (IMPALA's CartPole preset: 64 envs of 16 steps), the arguments
    win over it (2 processes over its 0), and ``settings`` sets the algorithm's own fields (lag 0)."""
    report = profile_training("CartPole-v1", algo="impala", preset="impala-cartpole", n_processes=2, iterations=1,
                              settings={"max_lag": 0})
    config = report.config
    assert (config["preset"], config["n_envs"], config["n_timesteps"], config["n_processes"]) == (
        "impala-cartpole", 64, 16, 2)
    assert config["settings"] == {"max_lag": 0}
    assert report.env_steps == 64 * 16 == report.batcher_timings["env_steps"]  # 64 envs in all, over both workers
    assert config["hidden"] == [64, 64]  # the config's default, as the preset's run has it
    sac = profile_training("Pendulum-v1", algo="sac", preset="auto", n_envs=2, n_timesteps=4, iterations=1)
    assert (sac.config["preset"], sac.config["hidden"]) == ("sac-pendulum", [128, 128])  # SAC's own default
    plain = profile_training("CartPole-v1", algo="impala", n_envs=4, n_timesteps=2, iterations=1)
    assert (plain.config["preset"], plain.config["hidden"], plain.config["settings"]) == ("none", [64, 64], {})


def test_profile_settings_are_the_configs_fields_not_the_profiles_own():
    with pytest.raises(ValueError, match=r"settings must name fields of IMPALAConfig, got \['max_lagg'\]; the "
                                         r"settings page lists IMPALA's"):
        profile_training(algo="impala", settings={"max_lagg": 2})
    with pytest.raises(ValueError, match=r"settings must not set \['logdir', 'n_envs', 'n_steps'\], which the "
                                         r"profile sets itself; give them as its own arguments \(n_timesteps"):
        profile_training(algo="impala", settings={"logdir": "x", "n_envs": 8, "n_steps": 4})
    with pytest.raises(ConfigError, match="dqn-acrobot"):  # a preset of another algorithm
        profile_training(algo="impala", preset="dqn-acrobot")


@pytest.mark.slow  # the command end to end, with matplotlib's import
def test_profile_command(tmp_path, capsys):
    from rlstruct.algos._train.cli import main

    png = tmp_path / "profile.png"
    if not PLOT:
        assert main(["profile", "--n-envs", "4", "--n-timesteps", "2", "--iterations", "2", "--png", str(png)]) == 2
        assert "pip install 'rlstruct[plot]'" in capsys.readouterr().err
        png = ""
    assert main(["profile", "--n-envs", "4", "--n-timesteps", "2", "--iterations", "2", "--png", str(png)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert set(result["seconds"]) == set(PHASES) and result["env_steps"] == 16
    assert result["png"] == (str(png) if PLOT else None) and (not PLOT or png.exists())
    assert any(line.startswith("env_step") for line in out)
    argv = ["profile", "--n-envs", "4", "--n-timesteps", "2", "--iterations", "2"]
    assert main([*argv, "--overlap", "--algo", "ppo", "--png", ""]) == 0
    config = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]
    assert config["overlap"] is True and config["algo"] == "ppo"
    assert main([*argv, "--autocast", "bfloat16", "--compile-policy", "--png", ""]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["config"]["autocast"] == "bfloat16" and result["config"]["compile_policy"] is True
    assert result["seconds"]["agent_forward"] > 0 and result["seconds"]["learn"] > 0
    assert main(["profile", "--n-envs", "0", "--png", ""]) == 2
    assert "error: n_envs must be >= 1, got 0" in capsys.readouterr().err
    # the algorithm's own flags, as `rlstruct train impala` takes them
    assert main([*argv, "--algo", "impala", "--max-lag", "0", "--rho-bar", "2", "--hidden-sizes", "32", "32",
                 "--png", ""]) == 0
    config = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]
    assert config["settings"] == {"max_lag": 0, "rho_bar": 2.0, "hidden_sizes": [32, 32]}
    assert config["hidden"] == [32, 32]
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--algo", "impala", "--max-lagg", "0"])
    assert ended.value.code == 2 and "unrecognized arguments: --max-lagg 0" in capsys.readouterr().err


@pytest.mark.cuda
def test_profile_training_with_a_cuda_graph_charges_the_replays():
    report = profile_training("CartPole-v1", n_envs=64, n_timesteps=8, iterations=2, device="cuda", cuda_graph=True)
    assert list(report.seconds) == PHASES and report.env_steps == 2 * 64 * 8
    assert report.seconds["graph_replay"] > 0
    assert report.seconds["env_step"] == report.seconds["agent_forward"] == 0
    assert report.config["cuda_graph"] is True
