import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="rlstruct sweep needs Optuna: pip install 'rlstruct[sweep]'")

from rlstruct._processes import pid_namespace, process_alive, process_identity  # noqa: E402
from rlstruct.algos._train import cli  # noqa: E402
from rlstruct.algos._train.registry import ALGORITHMS, algorithm  # noqa: E402
from rlstruct.algos._train.search_space import check_space, covering, load_space  # noqa: E402
from rlstruct.algos._train.sweep import run_sweep  # noqa: E402
from rlstruct.algos._train.sweep_study import trial_seeded_sampler  # noqa: E402
from rlstruct.errors import AlgorithmSourceError, ConfigError  # noqa: E402
from tests.helpers import ForkedCommand, wall_limit  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: two iterations of 4 envs x 8 steps a trial, an evaluation (two short episodes) after each
TINY = ["--max-env-steps", "64", "--n-envs", "4", "--n-steps", "8", "--eval-every", "1", "--n-evaluation-envs", "2",
        "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard", "--time-limit", "120"]
LR_ONLY = {"lr": {"low": 1e-4, "high": 1e-2, "log": True}}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_has_a_space_that_holds_its_defaults(algo):
    config_cls = algorithm(algo).config_cls
    space = check_space(algorithm(algo).search_space, config_cls)
    assert covering(space, dataclasses.asdict(config_cls())) == space


@pytest.mark.slow
def test_the_preset_is_trial_0_and_a_second_call_adds_trials(tmp_path, capsys, caplog):
    storage = f"sqlite:///{tmp_path}/db/sweeps.db"
    kwargs = {"storage": storage, "study_name": "s", "logdir": str(tmp_path / "trials"), "flags": TINY,
              "space": {**LR_ONLY, "gae_lambda": {"low": 0.8, "high": 1.0}}, "pruner": "none"}
    study = run_sweep("a2c", "CartPole-v1", trials=2, **kwargs)
    first = study.trials[0]
    # a2c-cartpole's settings; A2C's defaults where the preset says nothing
    assert first.params == {"lr": 5e-3, "gae_lambda": 0.95} and first.user_attrs["preset"] == "a2c-cartpole"
    assert first.user_attrs["settings"]["entropy_coef"] == 0.01 and first.user_attrs["settings"]["n_envs"] == 4
    assert study.trials[1].params != first.params
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for t in study.trials:
        summary = json.loads((tmp_path / "trials" / f"trial-{t.number}" / "summary.json").read_text())
        assert summary["eval_return"] == t.value and summary["env_steps"] >= 64
    assert run_sweep("a2c", "CartPole-v1", trials=1, **kwargs).trials[2].state.name == "COMPLETE"
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == 3
    assert "trial 2: complete" in capsys.readouterr().out
    # the sweep's folder holds the trials' folders only; a second call warns of no other folder and makes none
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "trials"]
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == ["trial-0", "trial-1", "trial-2"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_trials_are_pruned_on_their_evaluations(tmp_path):
    # a threshold no return reaches: the first evaluation of trained weights prunes each trial
    study = run_sweep("ppo", "CartPole-v1", trials=2, storage=f"sqlite:///{tmp_path}/s.db", space=LR_ONLY,
                      flags=[*TINY, "--max-env-steps", "2048"], logdir=str(tmp_path / "trials"),
                      pruner=optuna.pruners.ThresholdPruner(lower=1e9))
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    for t in study.trials:
        assert list(t.intermediate_values) == [0]  # reported at the first tenth of the budget, then stopped
        folder = tmp_path / "trials" / f"trial-{t.number}"
        assert (folder / "progress.csv").is_file() and not (folder / "summary.json").exists()


@pytest.mark.slow
def test_the_command_runs_parallel_trials_and_prints_a_preset_to_paste(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("lr:\n  low: 0.0001\n  high: 0.01\n  log: true\n")
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--trials", "2", "--n-jobs", "2", "--space",
                     "space.yaml", "--", *TINY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["study"] == "ppo-CartPole-v1" and out["storage"] == "sqlite:///runs/sweeps.db"
    assert out["trials"] == out["complete"] == 2 and (tmp_path / "runs" / "sweeps.db").is_file()
    assert set(out["best_params"]) == {"lr"} and out["best_settings"]["lr"] == out["best_params"]["lr"]
    assert any(line.startswith("rlstruct train ppo --env CartPole-v1 ") for line in lines)
    assert any(line.strip().startswith('Preset("ppo-cartpole-v1-sweep", "ppo"') for line in lines)
    assert (tmp_path / "runs" / "sweeps" / "ppo-CartPole-v1" / f"trial-{out['best_trial']}" / "summary.json").is_file()


def test_bad_sweeps_fail_with_one_line_before_any_trial(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.json").write_text(json.dumps({"learning_rate": {"low": 0.1, "high": 1.0}}))
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--space", "space.json"]) == 2
    assert "names 'learning_rate', which PPOConfig does not have" in capsys.readouterr().err
    assert cli.main(["sweep", "ppo", "--env", "NoSuchEnv-v0", "--", *TINY]) == 2
    assert "NoSuchEnv-v0" in capsys.readouterr().err
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--trials", "0"]) == 2
    assert "trials and n_jobs must be >= 1, got 0 and 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="must be a JSON or YAML mapping"):
        (tmp_path / "bad.json").write_text("{")
        load_space(tmp_path / "bad.json", algorithm("ppo").config_cls)
    assert not (tmp_path / "runs").exists()


def test_run_sweep_refuses_what_no_trial_could_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(AlgorithmSourceError, match=r"unknown algorithm 'ppo2'; expected one of \['reinforce'"):
        run_sweep("ppo2", "CartPole-v1", trials=1, storage=storage)
    with pytest.raises(ConfigError, match="reports evaluations at tenths of the step budget, got max_env_steps=None"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, flags=["--max-env-steps", "none", "--no-anneal-lr"])
    with pytest.raises(ConfigError, match=r"the flags given fix every field of the search space \(\['lr'\]\)"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, space=LR_ONLY, flags=["--lr", "1e-3"])
    with pytest.raises(ValueError, match="pruner must be one of"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, pruner="hyperband")
    assert not (tmp_path / "s.db").exists()  # refused before the study was created


def test_a_sweep_draws_by_trial_number_reproducibly():
    def draws(seed, first=0):
        study = optuna.create_study(sampler=trial_seeded_sampler(seed), direction="maximize")
        for _ in range(first):  # trials another process took
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
        study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=4)
        return {t.number: t.params["x"] for t in study.trials if t.params}

    assert draws(0) == draws(0) != draws(1)  # a sweep is reproducible given its seed
    assert set(draws(0).values()).isdisjoint(draws(0, first=4).values())  # other trial numbers draw other settings


@pytest.mark.parametrize("reason", ["diverged", "worker_failed"])
def test_a_diverged_trial_or_one_a_worker_failure_stopped_fails_instead_of_scoring(tmp_path, monkeypatch, capsys,
                                                                                    reason):
    # A run a worker's failure stopped ends with its record and its last evaluation, not a score of the settings.
    from rlstruct.algos._train import sweep

    run = sweep.run
    monkeypatch.setattr(sweep, "run", lambda setup: dataclasses.replace(run(setup), stop_reason=reason))
    study = run_sweep("a2c", "CartPole-v1", trials=1, storage=f"sqlite:///{tmp_path}/s.db", space=LR_ONLY, flags=TINY,
                      logdir=str(tmp_path / "trials"), pruner="none")
    assert [t.state.name for t in study.trials] == ["FAIL"] and study.trials[0].user_attrs["stop_reason"] == reason
    assert f"trial 0: fail ({reason.replace('_', ' ')})" in capsys.readouterr().out


def test_a_sigterm_while_a_trials_run_starts_fails_the_trial_as_an_interruption(tmp_path, monkeypatch):
    """A SIGTERM during a run's start ends it at once with SystemExit(143) (what a killed sweep's worker meets when
    its parent dies as a trial starts): the trial fails, as an interrupted run's does, instead of staying RUNNING."""
    from rlstruct.algos._train import sweep

    def stopped_at_start(setup):
        raise SystemExit(143)

    monkeypatch.setattr(sweep, "run", stopped_at_start)
    with pytest.raises(KeyboardInterrupt):
        run_sweep("a2c", "CartPole-v1", trials=1, storage=f"sqlite:///{tmp_path}/s.db", space=LR_ONLY, flags=TINY,
                  logdir=str(tmp_path / "trials"), pruner="none")
    storage = f"sqlite:///{tmp_path}/s.db"
    [name] = optuna.study.get_all_study_names(storage)
    assert [t.state.name for t in optuna.load_study(study_name=name, storage=storage).trials] == ["FAIL"]


@pytest.mark.parametrize("url, found", [
    ("runs/sweeps.db", "storage must be an SQLAlchemy URL, got 'runs/sweeps.db'"),
    ("sqlit:///runs/sweeps.db", "names the database 'sqlit', which SQLAlchemy does not know"),
    ("sqlite://runs/sweeps.db", "three slashes before a relative path"),
])
def test_a_bad_storage_url_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys, url, found):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "a2c", "--env", "CartPole-v1", "--storage", url, "--", *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and found in err[0] and "e.g. sqlite:///runs/sweeps.db" in err[0]
    assert list(tmp_path.iterdir()) == []


#: a trial that runs until it is killed
ENDLESS = [*TINY[:-2], "--time-limit", "600", "--max-env-steps", "100000000"]


def _sweep_argv(tmp_path, *args):
    """``rlstruct``'s arguments for a sweep of A2C's learning rate into ``tmp_path``, then ``args``."""
    (tmp_path / "space.json").write_text(json.dumps(LR_ONLY))
    return ["sweep", "a2c", "--env", "CartPole-v1", "--storage",
            f"sqlite:///{tmp_path}/s.db", "--study-name", "s", "--logdir", str(tmp_path / "trials"), "--space",
            str(tmp_path / "space.json"), "--pruner", "none", *args]


def _running(tmp_path, n, timeout=120.0):
    """Waits until trials 0 to ``n - 1`` train (their runs have written rows); the study is not read meanwhile, so
    that this process does not race the sweep to create the database's tables."""
    deadline = time.monotonic() + timeout
    while not all((tmp_path / "trials" / f"trial-{i}" / "progress.csv").is_file() for i in range(n)):
        assert time.monotonic() < deadline, f"{n} trials did not start within {timeout} s"
        time.sleep(0.2)


def _workers(pid):
    """The pids of the worker processes that ``multiprocessing`` spawned from the process ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_two_sweeps_started_together_on_a_new_study_draw_distinct_trials(tmp_path):
    # Two forks of this process, which has imported everything, wait for the word: the two open the new database at
    # once. One trial each: both reach for the preset's trial, which only one may run, and the other draws its own.
    command = _sweep_argv(tmp_path, "--trials", "1", "--", *TINY)
    procs = [ForkedCommand(command, tmp_path / f"sweep-{i}", seam=_seam("together", tmp_path)) for i in range(2)]
    try:
        (tmp_path / "go").touch()
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [p.stderr[-2000:] for p in procs]
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    assert sum("preset" in t.user_attrs for t in trials) == 1  # the preset's trial, enqueued once and run once
    assert len({t.params["lr"] for t in trials}) == 2
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == [f"trial-{n}" for n in range(2)]


@pytest.mark.slow
def test_a_killed_trial_is_failed_at_the_next_call_and_counted(tmp_path, capsys, caplog):
    # the sweep process dies (SIGKILL) as its trial's run starts: trial 0, the preset's, is left running. That process
    # is a fork of this one: what is tested is what the next call makes of the trial, not an interpreter's start.
    proc = ForkedCommand(_sweep_argv(tmp_path, "--trials", "1", "--", *TINY), tmp_path / "killed",
                         seam=_seam("die", tmp_path))
    assert proc.wait(timeout=120) == -signal.SIGKILL, proc.stderr
    assert cli.main(_sweep_argv(tmp_path, "--trials", "1", "--", *TINY)) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"trial 0: failed, its process ({proc.pid} on {socket.gethostname()}) ended before it did"
    assert lines[1] == "the preset's trial was killed before it ended: it runs again"
    report = json.loads(lines[-1])
    assert report["trials"] == 2 and report["fail"] == 1 and report["complete"] == 1 and report["running"] == 0
    # the killed trial was the preset's (trial 0): the next call ran it again, as trial 1
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
    assert [t.user_attrs.get("preset") for t in trials] == ["a2c-cartpole"] * 2 and trials[1].params == trials[0].params
    # the second call writes its trial beside the first's, and warns of no other folder
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == ["trial-0", "trial-1"]
    assert not [r for r in caplog.records if "holds an earlier run" in r.getMessage()]


@pytest.mark.slow  # two spawned workers import torch: seconds the guard does not see (orphaned, never waited for)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker processes in /proc")
def test_the_workers_of_a_killed_sweep_end(tmp_path):
    """The sweep is a fork of this process; its workers, spawned processes, are its children."""
    proc = ForkedCommand(_sweep_argv(tmp_path, "--trials", "2", "--n-jobs", "2", "--", *ENDLESS),
                         tmp_path / "sweep")
    workers = []
    try:
        _running(tmp_path, 2)
        workers = _workers(proc.pid)
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)  # the sweep alone, not its process group
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(process_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if process_alive(pid)]
    finally:
        proc.kill()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # each ended as a Ctrl-C would end it: its trial failed
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]


@pytest.mark.parametrize("url", ["sqlit://bob:s3cret@db.example/optuna?token=tok123",
                                 "mysql+nosuchdriver://bob:s3cret@db.example/optuna"])
def test_a_storage_url_with_credentials_is_refused_without_them(tmp_path, monkeypatch, capsys, url):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "a2c", "--env", "CartPole-v1", "--storage", url, "--", *TINY]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert "://***@db.example/optuna" in line and "s3cret" not in captured.out + line and "tok123" not in line


@pytest.mark.slow  # 2.4 CPU s on the reference CPU: slow is 1.5 s or more
def test_a_second_call_with_other_train_flags_is_refused_naming_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    command = _sweep_argv(tmp_path, "--trials", "1", "--", *TINY)
    assert cli.main(command) == 0
    capsys.readouterr()
    # the same settings in another order join the study
    assert cli.main([*command[:-len(TINY)], *TINY[2:], *TINY[:2]]) == 0
    capsys.readouterr()
    other = [*command[:-len(TINY)], *TINY, "--max-env-steps", "2048", "--gamma", "0.98"]
    assert cli.main(other) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == ("rlstruct sweep: error: study 's' runs its trials with other train flags than this call: "
                    "--gamma 0.98 (this call's only); --max-env-steps 64 (the study's) vs 2048 (this call's); "
                    "pass the study's flags after --, or another --study-name")
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials) == 2


def _seam(mode: str, folder: Path):
    """The seam of a forked sweep (:class:`~tests.helpers.ForkedCommand`): ``"die"``: it kills itself (SIGKILL) as
    its trial's run starts; ``"wait"``: its trial's run waits for the file ``folder/go`` after writing
    ``folder/waiting``; ``"together"``: the sweep waits for ``folder/go`` before it starts."""

    def seam() -> None:
        from rlstruct.algos._train import sweep

        if mode == "together":
            while not (folder / "go").exists():
                time.sleep(0.01)
            return
        run = sweep.run

        def waiting(setup):
            (folder / "waiting").touch()
            while not (folder / "go").exists():
                time.sleep(0.05)
            return run(setup)

        sweep.run = (lambda setup: os.kill(os.getpid(), signal.SIGKILL)) if mode == "die" else waiting

    return seam


@pytest.mark.slow
def test_a_sweep_in_another_container_keeps_its_live_trial(tmp_path, capsys):
    """The other sweep is a fork of this process (its own pid, its trial held at the start of its run)."""
    proc = ForkedCommand(_sweep_argv(tmp_path, "--trials", "1", "--", *TINY), tmp_path / "other",
                         seam=_seam("wait", tmp_path))
    try:
        deadline = time.monotonic() + wall_limit(120)
        while not (tmp_path / "waiting").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        # Its trial's owner as a sweep in a container beside this one records it: the same hostname, another PID
        # namespace, and a pid that runs no process here (a reaped child's).
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
        [trial] = optuna.load_study(study_name="s", storage=storage).trials
        owner = {**process_identity(proc.pid), "pid_ns": (pid_namespace() or 0) + 1, "pid": dead.pid}
        storage.set_trial_user_attr(trial._trial_id, "process", owner)
        # this sweep, in this namespace, sees a running trial whose pid runs nothing here: not provably dead
        assert cli.main(_sweep_argv(tmp_path, "--trials", "1", "--", *TINY)) == 0
        out = capsys.readouterr().out
        trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
        assert [t.state.name for t in trials] == ["RUNNING", "COMPLETE"] and "failed" not in out
        (tmp_path / "go").touch()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    # the other sweep's trial ran to its end and was told, where it was failed and the sweep exited 2
    assert proc.returncode == 0 and "Cannot tell" not in proc.stderr, proc.stderr[-2000:]
    assert "trial 0: complete" in proc.stdout
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]


def test_a_trial_another_sweep_failed_while_it_ran_is_one_line_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    from rlstruct.algos._train import sweep

    storage = f"sqlite:///{tmp_path}/s.db"
    run = sweep.run
    failed = []

    def failed_meanwhile(setup):
        # another sweep finds no heartbeat of this trial within the grace period (a stalled disk, say) and fails it
        if not failed:
            study = optuna.load_study(study_name="s", storage=storage)
            [trial] = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            failed.append(trial.number)
        return run(setup)

    monkeypatch.setattr(sweep, "run", failed_meanwhile)
    study = run_sweep("a2c", "CartPole-v1", trials=2, storage=storage, study_name="s", space=LR_ONLY, flags=TINY,
                      logdir=str(tmp_path / "trials"), pruner="none")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    out = capsys.readouterr().out
    assert ("trial 0: failed by another sweep while it ran (no heartbeat of it within the grace period); its result "
            "is not counted") in out and "trial 1: complete" in out


def test_the_report_shows_the_storage_without_its_credentials(capsys):
    from rlstruct.algos._train.sweep import _report

    study = optuna.create_study(study_name="s", direction="maximize")
    assert _report("a2c", "CartPole-v1", study, "postgresql://bob:s3cret@db.example:5432/optuna?sslkey=k") == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["storage"] == "postgresql://***@db.example:5432/optuna?sslkey=k"
