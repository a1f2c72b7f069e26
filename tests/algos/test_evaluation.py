"""The evaluation of training runs (rlstruct.algos._train.evaluation): episodes in acquisitions of bounded length.

The oracle is the evaluation as one acquisition of a whole episode per env (``n_timesteps`` = the time limit), the
way the evaluator ran before it worked in chunks: chunked, the same weights and seeds give the same returns and
lengths, in process and with worker processes, while the batcher's buffer holds a chunk of steps only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any

import pytest
import torch

from rlstruct.algos import create_env, describe_env
from rlstruct.algos._train.checkpoints import load_checkpoint
from rlstruct.algos._train.config import RunConfig, validate_run_config
from rlstruct.algos._train.evaluation import EpisodeTally, Evaluator, run_episodes
from rlstruct.algos._train.session import open_batchers, seeded_model, validate
from rlstruct.algos.networks import build_actor_critic
from rlstruct.algos.policies import create_policy_agent
from rlstruct.algos.returns import episode_returns
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import cpu_state_dict
from rlstruct.structures import DictTensor

ENV = "CartPole-v1"
N_ENVS = 6


def _weights() -> dict[str, torch.Tensor]:
    return cpu_state_dict(seeded_model(3, build_actor_critic, describe_env(ENV, "torch", None), (8,)))


def _batcher(n_timesteps: int, *, n_processes: int = 0, max_episode_steps: int = 500, autoreset: bool = False,
             device: str = "cpu", cuda_graph: bool = False) -> RL_Batcher:
    spec = describe_env(ENV, "torch", max_episode_steps)
    n_workers = max(n_processes, 1)
    return RL_Batcher(
        n_timesteps, create_policy_agent, {"spec": spec, "hidden_sizes": (8,), "device": device},
        create_env, {"name": ENV, "n_envs": N_ENVS // n_workers, "backend": "torch",
                     "max_episode_steps": max_episode_steps, "autoreset": autoreset, "device": device},
        n_processes, [11 + k for k in range(n_workers)],
        agent_info=DictTensor({"stochastic": torch.tensor([True])}), agent_seeds=[7 + k for k in range(n_workers)],
        device=device, cuda_graph=cuda_graph,
    )


def _agent_info(stochastic: bool) -> DictTensor:
    return DictTensor({"stochastic": torch.full((N_ENVS,), stochastic)})


def _one_acquisition(stochastic: bool, *, n_processes: int = 0, max_steps: int = 500,
                     evaluations: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """The oracle: ``(returns, lengths, n_running)`` of ``evaluations`` consecutive evaluations, each one acquisition
    of ``max_steps`` steps, every episode a row of the buffer."""
    out = []
    with _batcher(max_steps, n_processes=n_processes) as b:
        b.update(_weights())
        for _ in range(evaluations):
            b.reset(agent_info=_agent_info(stochastic))
            b.execute()
            traj, n_running = b.get()
            out.append((*episode_returns(traj), torch.tensor(n_running)))
    return out


@pytest.mark.parametrize("stochastic", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 500])
def test_chunked_episodes_equal_one_acquisition_of_whole_episodes(stochastic, chunk):
    [(returns, lengths, _)] = _one_acquisition(stochastic)
    assert lengths.min() < lengths.max() < 500  # the episodes end in different chunks
    with _batcher(chunk) as b:
        b.update(_weights())
        tally = run_episodes(b, 500, _agent_info(stochastic))
    assert torch.equal(tally.returns, returns) and torch.equal(tally.lengths, lengths)
    assert not tally.running.any() and tally.finished


def test_a_step_cap_cuts_the_episodes_as_one_shorter_acquisition_does():
    [(returns, lengths, n_running)] = _one_acquisition(True, max_steps=15)
    assert 0 < n_running < N_ENVS  # some episodes end before the cap, some are cut
    with _batcher(4) as b:
        b.update(_weights())
        tally = run_episodes(b, 15, _agent_info(True))
    assert torch.equal(tally.returns, returns) and torch.equal(tally.lengths, lengths)
    assert int(tally.running.sum()) == int(n_running) and tally.steps == 16


@pytest.mark.parametrize("chunk, max_steps", [(7, 500), (500, 500), (4, 15)])
def test_auto_reset_envs_first_episodes_equal_the_episodic_evaluation(chunk, max_steps):
    # What a captured evaluation runs: every env's row in every chunk, the envs going on into new episodes.
    [(returns, lengths, n_running)] = _one_acquisition(False, max_steps=max_steps)
    with _batcher(chunk, autoreset=True) as b:
        b.update(_weights())
        tally = run_episodes(b, max_steps, _agent_info(False))
        assert b.n_timesteps == chunk
    assert torch.equal(tally.returns, returns) and torch.equal(tally.lengths, lengths)
    assert int(tally.running.sum()) == int(n_running) and tally.finished
    if max_steps == 500:  # every episode ended: the tally stops at the chunk where the last one did
        assert tally.steps < 500 or chunk == 500


@pytest.mark.cuda
@pytest.mark.parametrize("chunk", [7, 500])
def test_cuda_captured_evaluation_equals_the_episodic_one(chunk):
    with _batcher(500, device="cuda") as b:
        b.update(_weights())
        oracle = run_episodes(b, 500, _agent_info(False))
    # The second evaluation's episodes go on from the first's streams (the auto-reset envs' episodes counted on
    # through the chunks): the oracle of the captured replay is the same batcher uncaptured.
    with _batcher(chunk, autoreset=True, device="cuda") as b:
        b.update(_weights())
        eager = [run_episodes(b, 500, _agent_info(False)) for _ in range(2)]
    assert torch.equal(eager[0].returns, oracle.returns) and torch.equal(eager[0].lengths, oracle.lengths)
    with _batcher(chunk, autoreset=True, device="cuda", cuda_graph=True) as b:
        b.update(_weights())
        for expected in eager:  # eager, then captured and replayed after a reset
            tally = run_episodes(b, 500, _agent_info(False))
            assert torch.equal(tally.returns, expected.returns) and torch.equal(tally.lengths, expected.lengths)


def _summary(returns: torch.Tensor, lengths: torch.Tensor) -> dict[str, float]:
    return {"eval/return": float(returns.mean()), "eval/return_min": float(returns.min()),
            "eval/return_max": float(returns.max()), "eval/length": float(lengths.float().mean()),
            "eval/episodes": float(N_ENVS), "eval/launch_env_steps": 0.0, "eval/confirmation": 0.0}


def _without_time(result: dict[str, float] | None, *, at_most: float) -> dict[str, float] | None:
    """``result`` without ``eval/blocked_s``, after checking that it is a duration in ``[0, at_most]`` s."""
    if result is None:
        return None
    result = dict(result)
    blocked = result.pop("eval/blocked_s")
    assert 0.0 < blocked <= at_most
    return result


def test_the_evaluator_in_process_finishes_at_launch_and_reports_the_oracle(caplog):
    first, second = _one_acquisition(False, evaluations=2)
    with contextlib.closing(Evaluator(_batcher(5), _agent_info(False), every=3, max_steps=500)) as ev:
        assert ev.batcher.n_timesteps == 5
        t0 = time.perf_counter()
        ev.schedule(_weights, 0, 0)  # launches; in process the evaluation runs inside the launch
        launch_s = time.perf_counter() - t0
        # In process, the whole evaluation held the caller up: its time is the launch's (the collect adds ~0).
        result = ev.collect()
        assert ev.pending is False and _without_time(result, at_most=time.perf_counter() - t0) == _summary(*first[:2])
        assert result["eval/blocked_s"] >= 0.5 * launch_s
        assert not ev.pending and ev.collect() is None
        t0 = time.perf_counter()
        previous, final = ev.final(_weights(), 10, 0)  # fresh episodes: the envs' next resets
        assert previous == [] and _without_time(final, at_most=time.perf_counter() - t0) == _summary(*second[:2])
    with caplog.at_level(logging.WARNING, logger="rlstruct.algos._train.evaluation"):
        with contextlib.closing(Evaluator(_batcher(5), _agent_info(False), every=3, max_steps=6)) as ev:
            ev.final(_weights(), 0, 0)
    assert "did not finish within 6 steps; their returns are partial" in caplog.text


@pytest.mark.parametrize("episodes", [4, N_ENVS, 2 * N_ENVS + 1])
def test_the_final_evaluation_runs_its_episodes_in_rounds_of_fresh_resets(episodes):
    """Rounds of one episode per env, each from the envs' next reset: the oracle's consecutive evaluations, the
    first ``episodes`` in round and env order."""
    rounds = _one_acquisition(False, evaluations=-(-episodes // N_ENVS) + 1)
    with contextlib.closing(Evaluator(_batcher(5), _agent_info(False), every=3, max_steps=500,
                                      final_episodes=episodes)) as ev:
        ev.schedule(_weights, 0, 0)  # a scheduled evaluation takes the first round, as in a run
        previous, final = ev.final(_weights(), 10, 0)
    returns = torch.cat([r[0] for r in rounds[1:]])[:episodes]
    lengths = torch.cat([r[1] for r in rounds[1:]])[:episodes]
    expected = {**_summary(returns, lengths), "eval/episodes": float(episodes)}
    assert len(previous) == 1 and previous[0]["eval/episodes"] == N_ENVS
    assert _without_time(final, at_most=math.inf) == expected


def test_final_episodes_below_one_is_a_value_error():
    with pytest.raises(ValueError, match="final_episodes must be >= 1 episode or None"):
        Evaluator(_batcher(5), _agent_info(False), every=3, final_episodes=0)
    with pytest.raises(ValueError, match="final_evaluation_episodes must be >= 1, got 0"):
        validate_run_config(RunConfig(env=ENV, final_evaluation_episodes=0))


def test_a_run_reports_its_final_evaluation_over_the_episodes_asked(tmp_path):
    from rlstruct.algos import a2c
    from tests.helpers import bare_run

    result = a2c.train(a2c.A2CConfig(**bare_run(tmp_path, env=ENV, n_envs=4, n_steps=8, max_env_steps=256,
                                                hidden_sizes=(8,), n_evaluation_envs=2,
                                                final_evaluation_episodes=5)))
    rows = [r for r in result.history if "eval/return" in r]
    assert [r["eval/episodes"] for r in rows[:-1]] == [2.0] * (len(rows) - 1)  # the scheduled ones
    assert rows[-1]["eval/episodes"] == 5.0 and result.eval_return == rows[-1]["eval/return"]


def test_a_sigterm_between_the_final_evaluations_rounds_still_ends_with_the_episodes_asked_and_a_record(
        tmp_path, monkeypatch):
    """The final evaluation's rounds run on after a first SIGTERM (a second one aborts, as anywhere in a run): the
    run reports all its episodes, and its checkpoint and summary reach the disk."""
    import json
    import os
    import signal

    from rlstruct.algos import a2c
    from rlstruct.algos._train.run_folder import SUMMARY_NAME
    from tests.helpers import bare_run

    launches = []
    launch = Evaluator.launch

    def launch_then_sigterm_in_the_finals_second_round(self, weights, iteration, env_steps, **kwargs):
        launches.append(iteration)
        if iteration == 8 and launches.count(8) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return launch(self, weights, iteration, env_steps, **kwargs)

    monkeypatch.setattr(Evaluator, "launch", launch_then_sigterm_in_the_finals_second_round)
    result = a2c.train(a2c.A2CConfig(**bare_run(tmp_path, env=ENV, n_envs=4, n_steps=8, max_env_steps=256,
                                                eval_every=100, hidden_sizes=(8,), n_evaluation_envs=2,
                                                final_evaluation_episodes=5)))
    assert launches.count(8) == 3  # three rounds of two envs for five episodes, the signal in the second
    assert result.stop_signal == "SIGTERM"
    final = [r for r in result.history if "eval/return" in r][-1]
    assert final["eval/episodes"] == 5.0 and result.eval_return == final["eval/return"]
    summary = json.loads((tmp_path / SUMMARY_NAME).read_text())
    assert summary["eval_return"] == result.eval_return and (tmp_path / "checkpoint.pt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_evaluator_with_workers_collects_without_blocking_and_reports_the_oracle():
    first, second = _one_acquisition(True, n_processes=2, evaluations=2)
    weights = _weights()
    with contextlib.closing(Evaluator(_batcher(3, n_processes=2), _agent_info(True), every=1, max_steps=500)) as ev:
        t0 = time.perf_counter()
        ev.launch(weights, 0, 0)
        calls, result = 0, None
        while result is None:
            # collect never waits: it returns the result once every episode ended
            result = ev.collect()
            calls += 1
            time.sleep(0.01)  # this process's own work, which the evaluation's time must not count
        wall = time.perf_counter() - t0
        # The caller was held up only by its own calls: launching and collecting, not the workers' acquisitions.
        assert _without_time(result, at_most=wall - 0.01 * calls) == _summary(*first[:2])
        assert calls > 1  # the acquisitions ran while this process went on
        t0 = time.perf_counter()
        previous, final = ev.final(weights, 2, 0)
        assert previous == [] and _without_time(final, at_most=time.perf_counter() - t0) == _summary(*second[:2])
        ev.launch(weights, 3, 0)  # closing with an acquisition under way collects it first


def test_the_tally_ignores_steps_past_the_cap_of_a_longer_chunk():
    with _batcher(8) as b:
        b.update(_weights())
        b.reset(agent_info=_agent_info(False))
        b.execute()
        traj, n_running = b.get()
    tally = EpisodeTally(N_ENVS, 3, "cpu")
    assert tally.add(traj, n_running)
    assert (tally.lengths == 3).all() and torch.equal(tally.returns, torch.full((N_ENVS,), 3.0))


def _open_batchers(stack: contextlib.ExitStack, tmp_path, **settings):
    """The training batcher and the evaluator of a small CartPole run with ``settings``."""
    cfg = RunConfig(env=ENV, n_envs=2, n_evaluation_envs=2, logdir=str(tmp_path), **settings)
    return open_batchers(stack, cfg, describe_env(ENV, "torch", None), create_policy_agent, n_timesteps=4,
                         autoreset=True, explore={"stochastic": True}, evaluate={"stochastic": False})


def test_open_batchers_bounds_the_evaluation_buffer_by_the_chunk(tmp_path):
    with contextlib.ExitStack() as stack:
        _, ev = _open_batchers(stack, tmp_path, evaluation_chunk_steps=32)
        assert (ev.batcher.n_timesteps, ev.max_steps) == (32, 500)
    with contextlib.ExitStack() as stack:
        _, ev = _open_batchers(stack, tmp_path, evaluation_max_steps=20)
        assert (ev.batcher.n_timesteps, ev.max_steps) == (20, 20)


def test_bad_evaluation_settings_are_errors():
    with pytest.raises(ValueError, match="evaluation_chunk_steps must be >= 1, got 0"):
        validate_run_config(RunConfig(evaluation_chunk_steps=0))
    with pytest.raises(ValueError, match="evaluation_max_steps must be >= 1 or None, got -1"):
        validate_run_config(RunConfig(evaluation_max_steps=-1))
    with _batcher(4) as b, pytest.raises(ValueError, match="max_steps must be >= 1 step or None.*got 0"):
        Evaluator(b, _agent_info(False), every=1, max_steps=0)


def test_an_env_without_a_time_limit_needs_max_episode_steps():
    import gymnasium as gym

    gym.register("NoLimitCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        with pytest.raises(ValueError, match="max_episode_steps must be set for env='NoLimitCartPole-v0'"):
            describe_env("NoLimitCartPole-v0", "gymnasium", None)
        assert describe_env("NoLimitCartPole-v0", "gymnasium", 30).max_episode_steps == 30
    finally:
        del gym.registry["NoLimitCartPole-v0"]


def test_open_batchers_gives_both_batchers_the_configs_timeout(tmp_path):
    with contextlib.ExitStack() as stack:
        batcher, ev = _open_batchers(stack, tmp_path, batcher_timeout=900.0)
        assert batcher.timeout == ev.batcher.timeout == 900.0
    with pytest.raises(ValueError, match="batcher_timeout must be > 0 seconds, got 0"):
        validate_run_config(RunConfig(batcher_timeout=0))


@pytest.mark.slow  # 2.7 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_start_timeout_bounds_the_start_of_both_batchers_from_the_command_line(tmp_path, capsys):
    """``--start-timeout``: a run whose workers cannot start in time fails naming the bound; a bad value is one line
    and status 2; the flag shows where it came from."""
    from rlstruct.algos import a2c
    from rlstruct.algos._train import cli
    from rlstruct.errors import BatcherWorkerTimeout

    # Spawning a worker process takes far longer than a millisecond.
    config = a2c.A2CConfig(n_processes=1, n_envs=2, start_timeout=1e-3, logdir=str(tmp_path / "run"), progress=False,
                           tensorboard=False)
    with pytest.raises(BatcherWorkerTimeout, match=r"within 0.001 s, the batcher's `start_timeout`; raise "):
        a2c.train(config)
    # The command line says it in one line (status 1: the run failed, its settings were fine).
    assert cli.main(["train", "a2c", "--n-processes", "1", "--n-envs", "2", "--start-timeout", "0.001", "--logdir",
                     str(tmp_path / "cli"), "--no-progress", "--no-tensorboard"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlstruct train a2c: error: worker 0 did not answer within 0.001 s")
    assert cli.main(["train", "a2c", "--start-timeout", "0", "--logdir", str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err.strip() == "rlstruct train a2c: error: start_timeout must be > 0 seconds, got 0.0"
    assert cli.main(["train", "a2c", "--start-timeout", "300", "--show-config"]) == 0
    shown = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("--start-timeout ")]
    assert shown == [["--start-timeout", "300.0", "flag"]]


# --------------------------------------------------------------------------- the envs' constructor arguments
@pytest.mark.slow  # 1.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_env_kwargs_reach_the_training_envs_and_the_evaluations_unless_these_have_their_own(tmp_path):
    """gymnasium's CartPole-v1 with sutton_barto_reward scores 0 a step and -1 at the end: the returns say which envs
    got the argument."""
    from rlstruct.algos import a2c

    common = dict(env="CartPole-v1", backend="gymnasium", n_envs=4, n_steps=16, max_env_steps=512, eval_every=4,
                  n_evaluation_envs=2, progress=False, tensorboard=False, stop_at_reward_threshold=False,
                  preset="none", env_kwargs={"sutton_barto_reward": True})
    both = a2c.train(a2c.A2CConfig(**common, logdir=str(tmp_path / "a")))
    train_returns = [r["train/episode_return"] for r in both.history
                     if not math.isnan(r.get("train/episode_return", math.nan))]
    evals = [r["eval/return"] for r in both.history if "eval/return" in r]
    assert train_returns and all(-1 <= x <= 0 for x in train_returns), train_returns
    assert evals and all(-1 <= x <= 0 for x in evals), evals
    own = a2c.train(a2c.A2CConfig(**common, logdir=str(tmp_path / "b"),
                                  evaluation_env_kwargs={"sutton_barto_reward": False}))
    evals = [r["eval/return"] for r in own.history if "eval/return" in r]
    assert evals and all(x >= 8 for x in evals), evals  # gymnasium's reward of 1 a step: no episode is shorter


def test_env_kwargs_must_be_a_dict_of_json_values():
    with pytest.raises(ValueError, match=r"env_kwargs must be a dict of keyword arguments or None, got str "
                                         r"'episodic_life'; pass e.g. --env-kwargs"):
        validate_run_config(RunConfig(env_kwargs="episodic_life"))
    with pytest.raises(ValueError, match=r"evaluation_env_kwargs must hold JSON values .* got \{'x': nan\}"):
        validate_run_config(RunConfig(evaluation_env_kwargs={"x": float("nan")}))


def test_evaluation_env_kwargs_are_checked_before_anything_runs():
    from rlstruct.algos import a2c

    with pytest.raises(ValueError, match=r"evaluation_env_kwargs must be keyword arguments that the torch backend's "
                                         r"constructor of 'CartPole-v1' takes, got \{'no_such_argument': 1\}"):
        validate(a2c.ALGORITHM, a2c.A2CConfig(evaluation_env_kwargs={"no_such_argument": 1}, progress=False))


@contextlib.contextmanager
def _cpu_burner(n: int = 2):
    """``n`` processes spinning on the CPU for the duration of the block."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


#: the training iterations of :func:`_evaluation_rows`'s run: the burners spin as long as it runs, on the CPUs that
#: the suite's other tests share
BURNED_ITERATIONS = 5


def _evaluation_rows(tmp_path, name: str, n_evaluation_processes: int) -> list[tuple[float, ...]]:
    """The evaluation rows of a small A2C run on CartPole: (launch step, confirmation, return, length)."""
    from rlstruct.algos import a2c

    # One evaluation due every iteration, each taking several acquisitions of 8 steps: with worker processes an
    # evaluation spans several iterations, so a schedule that followed the evaluations' speed would launch others.
    config = a2c.A2CConfig(env=ENV, n_envs=4, n_steps=8, max_env_steps=4 * 8 * BURNED_ITERATIONS, eval_every=1,
                           n_evaluation_envs=3, evaluation_chunk_steps=8, n_evaluation_processes=n_evaluation_processes,
                           preset="none", stop_at_reward_threshold=False, time_limit=600.0, logdir=str(tmp_path / name),
                           progress=False, tensorboard=False)
    result = a2c.train(config)
    keys = ("eval/launch_env_steps", "eval/confirmation", "eval/return", "eval/length")
    return [tuple(row.get(k, 0.0) for k in keys) for row in result.history if "eval/return" in row]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n_evaluation_processes", [0, 1])
def test_evaluations_are_the_same_idle_and_beside_a_cpu_burner(tmp_path, n_evaluation_processes):
    """Each evaluation is a function of the weights, the seed and its launch step: the same rows (launch steps and
    returns) on an idle machine and on one whose cores another process keeps busy, in process and with a worker."""
    idle = _evaluation_rows(tmp_path, "idle", n_evaluation_processes)
    with _cpu_burner():
        loaded = _evaluation_rows(tmp_path, "loaded", n_evaluation_processes)
    every_iterations = [32.0 * k for k in range(BURNED_ITERATIONS + 1)]
    assert [row[0] for row in idle] == every_iterations + every_iterations[-1:]  # then the final evaluation's
    assert loaded == idle


class _LaggingBatcher:
    """An evaluation worker slower than training, without a clock: each evaluation's acquisitions are ready only at
    the ``polls``-th ``get`` that does not block after its launch (the learner's ``polls``-th poll; ``None``: never),
    or when the learner waits for them (a full queue, the end of training)."""

    def __init__(self, batcher: RL_Batcher, polls: int | None):
        self.batcher, self.polls, self.left = batcher, polls, polls

    def reset(self, *args, **kwargs):  # an evaluation's launch
        self.left = self.polls
        return self.batcher.reset(*args, **kwargs)

    def get(self, blocking: bool = True):
        if not blocking and (self.left is None or self.left > 1):
            self.left = None if self.left is None else self.left - 1
            return None, 0
        self.left = 0
        return self.batcher.get()

    def __getattr__(self, name: str):
        return getattr(self.batcher, name)


def _run_with_evaluations(tmp_path, name: str, target: float, iterations: int, n_evaluation_processes: int,
                          polls: int | None, monkeypatch) -> tuple[list[dict[str, float]], Any]:
    """A small A2C run on CartPole of ``iterations`` iterations, an evaluation due every other one, and ``target``
    (``n_evaluation_processes`` > 0: with :class:`_LaggingBatcher` of ``polls``): its evaluation rows
    (every ``eval/`` column but the caller's time), in order, and its result."""
    from rlstruct.algos import a2c
    from rlstruct.algos._train import loops

    opened = loops.open_batchers

    def lagging(*args, **kwargs):
        batcher, evaluator = opened(*args, **kwargs)
        evaluator.batcher = _LaggingBatcher(evaluator.batcher, polls)
        return batcher, evaluator

    with monkeypatch.context() as patch:
        if n_evaluation_processes:
            patch.setattr(loops, "open_batchers", lagging)
        config = a2c.A2CConfig(env=ENV, n_envs=4, n_steps=8, max_env_steps=4 * 8 * iterations, eval_every=2,
                               n_evaluation_envs=3, evaluation_chunk_steps=8, evaluation_max_steps=100,
                               n_evaluation_processes=n_evaluation_processes, preset="none", target_return=target,
                               seed=1, torch_threads=1, time_limit=600.0, logdir=str(tmp_path / name), progress=False,
                               tensorboard=False)
        result = a2c.train(config)
    return [{k: v for k, v in row.items() if k.startswith("eval/") and k != "eval/blocked_s"}
            for row in result.history if "eval/return" in row], result


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("target", "iterations", "stop_reason", "confirmations"), [
    (50.0, 60, "target", 1), (60.0, 24, "budget", 2), (50.0, 14, "target", 2)],
    ids=["confirmed", "confirmations-fail", "decided-after-training"])
def test_an_evaluation_worker_however_slow_gives_the_in_process_evaluations_return_and_kept_weights(
        tmp_path, monkeypatch, target, iterations, stop_reason, confirmations):
    """With ``--eval-every 2`` and an evaluation worker that lags (each evaluation takes three of the learner's
    polls, or its results are held until the learner waits for them), the run launches its evaluations at the
    iterations the schedule names, with those iterations' weights, records them in launch order, confirms the same
    candidates, and so reports the same return and keeps the same weights as the run that evaluates in process.

    At 50 the first candidate's confirmation stops the run; at 60 both confirmations fail (the candidates of the
    twelfth and eighteenth iterations) and the run spends its budget of 24; in 14 iterations, the in-process run
    confirms its second candidate at its twelfth, while the held worker's evaluations, candidates and confirmations,
    all come back after training stopped and decide there, under the same rule."""
    rows, reference = _run_with_evaluations(tmp_path, "in-process", target, iterations, 0, None, monkeypatch)
    launches = [row["eval/launch_env_steps"] for row in rows]
    assert launches[:4] == [0.0, 64.0, 128.0, 192.0]  # every other iteration of 32 env steps
    assert reference.stop_reason == stop_reason
    assert sum(row["eval/confirmation"] for row in rows) == confirmations
    kept = load_checkpoint(reference.checkpoint)["model"]
    for name, polls in (("three-polls", 3), ("held", None)):
        worker_rows, result = _run_with_evaluations(tmp_path, name, target, iterations, 1, polls, monkeypatch)
        assert worker_rows == rows, name
        assert (result.eval_return, result.eval_env_steps, result.stop_reason) == (
            reference.eval_return, reference.eval_env_steps, reference.stop_reason), name
        model = load_checkpoint(result.checkpoint)["model"]
        assert all(torch.equal(model[k], kept[k]) for k in kept), name


def test_a_launch_due_while_one_is_pending_is_queued_and_a_confirmation_goes_first():
    weights = _weights()
    with contextlib.closing(Evaluator(_batcher(50), _agent_info(False), every=3, max_steps=500)) as ev:
        ev.schedule(lambda: weights, 0, 0)
        assert ev.pending and ev.queued == 0
        ev.schedule(lambda: weights, 2, 64)  # not due
        ev.schedule(lambda: weights, 3, 96)  # due while the first is not collected: queued, not skipped
        assert ev.queued == 1
        ev.confirm(weights, 3, 0)
        first = ev.collect()
        ev.schedule(lambda: weights, 4, 128)  # starts the next queued: the confirmation
        confirmation = ev.collect()
        ev.schedule(lambda: weights, 5, 160)
        rest = ev.drain()
        launched = [(r["eval/launch_env_steps"], r["eval/confirmation"]) for r in (first, confirmation, *rest)]
        assert launched == [(0.0, 0.0), (0.0, 1.0), (96.0, 0.0)]
        assert not ev.pending and ev.queued == 0 and ev.evaluated_weights is weights
    with _batcher(4) as b, pytest.raises(ValueError, match="max_queued must be >= 1 evaluation, got 0"):
        Evaluator(b, _agent_info(False), every=1, max_queued=0)


def test_a_checkpoints_evaluation_runs_at_the_runs_torch_threads_and_restores_the_processs(tiny_cartpole_run,
                                                                                           monkeypatch):
    """``rlstruct eval`` (``evaluate_checkpoint``) steps its episodes with torch at the run's ``torch_threads`` (1,
    the default the tiny run was trained with), as training did, whatever the process had; the count is restored
    after, also when the evaluation fails."""
    from rlstruct.algos._train import evaluation

    seen = []

    def counting(batcher, max_steps):
        seen.append(torch.get_num_threads())
        return run_episodes(batcher, max_steps)

    monkeypatch.setattr(evaluation, "run_episodes", counting)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = evaluation.evaluate_checkpoint(str(tiny_cartpole_run / "checkpoint.pt"), episodes=2, max_steps=20)
        assert seen == [1] and torch.get_num_threads() == 2 and result["episodes"] == 2

        def failing(batcher, max_steps):
            seen.append(torch.get_num_threads())
            raise RuntimeError("an env failed")

        monkeypatch.setattr(evaluation, "run_episodes", failing)
        with pytest.raises(RuntimeError, match="an env failed"):
            evaluation.evaluate_checkpoint(str(tiny_cartpole_run / "checkpoint.pt"), episodes=2, max_steps=20)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
