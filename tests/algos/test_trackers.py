"""``--track mlflow,wandb,trackio``: a tiny PPO run logs into each library for real, offline (an MLflow file store
and an SQLite one, W&B in offline mode, trackio's local database), and what was logged is read back with the
library's own client; a resumed run appends to the same tracked run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import struct
import sys
import time

import pytest

from rlstruct.algos import describe_env, ppo
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.trackers import (
    MLFLOW_HTTP_BOUNDS,
    TRACKERS,
    TRACKERS_FILE,
    Tracker,
    _bounded_http,
    check_trackers,
    open_trackers,
)
from rlstruct.errors import ConfigError, MissingDependencyError
from tests.helpers import ForkedCommand

pytestmark = pytest.mark.timeout(240)

TINY = ppo.PPOConfig(n_envs=4, n_steps=8, n_epochs=1, n_minibatches=1, hidden_sizes=(8,), max_env_steps=32 * 4,
                     progress=False, tensorboard=False, n_evaluation_envs=2, eval_every=2, max_episode_steps=30,
                     log_every=1, stop_at_reward_threshold=False, time_limit=100.0, preset="none")


@pytest.fixture(autouse=True)
def _libraries_stay_in_tmp_path(tmp_path, monkeypatch):
    """No telemetry, and the libraries' caches and settings in the test's folder rather than the home folder."""
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))


def _train_twice(tmp_path, track: str):
    """A run of 4 iterations, then the same run resumed to 8; returns both results."""
    logdir = str(tmp_path / "run")
    first = ppo.train(dataclasses.replace(TINY, track=track, logdir=logdir))
    second = ppo.train(dataclasses.replace(TINY, track=track, logdir=logdir, resume=logdir, max_env_steps=32 * 8))
    return first, second


@pytest.mark.learning_curve
@pytest.mark.slow  # 4.1 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_mlflow_records_params_rows_summary_and_artifacts_and_a_resume_continues_the_run(tmp_path, monkeypatch,
                                                                                        store):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri() if store == "file" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to its file store
    monkeypatch.chdir(tmp_path)  # an SQLite store keeps its artifacts in ./mlruns
    first, second = _train_twice(tmp_path, "mlflow")
    run_id = json.loads((tmp_path / "run" / TRACKERS_FILE).read_text())["mlflow"]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["algo"] == "ppo" and run.data.params["n_envs"] == "4"
    history = client.get_metric_history(run_id, "eval/return")
    steps = sorted({m.step for m in client.get_metric_history(run_id, "loss/value")})
    # Both sessions' rows, each at its env-step count, in one run.
    assert steps == [r["env_steps"] for r in second.history if "loss/value" in r]
    assert steps[-1] == 32 * 8 and 32 * 4 in steps
    assert [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))][-1] == second.eval_return
    assert run.data.metrics["summary/env_steps"] == 32 * 8
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"checkpoint.pt", "summary.json"} <= artifacts
    assert second.plot is None or "learning_curve.png" in artifacts
    assert len(client.search_runs([run.info.experiment_id])) == 1


def _wandb_records(path):
    """The records of a W&B ``.wandb`` file: W&B's header, then LevelDB's log format (32 KiB blocks of chunks,
    each a 7-byte header: checksum, length, type: 1 full, 2 first, 3 middle, 4 last), each record a protobuf
    ``Record`` of wandb's own schema."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


@pytest.mark.slow  # 5.6 CPU s on the reference CPU: slow is 1.5 s or more
def test_wandb_offline_records_rows_at_their_env_steps_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs the wandb extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "rlstruct-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first, second = _train_twice(tmp_path, "wandb")
    import wandb

    wandb.teardown()  # W&B's service writes the run's file after finish() returns: wait for it to be done
    run_id = json.loads((tmp_path / "run" / TRACKERS_FILE).read_text())["wandb"]
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2  # one folder per session, of the same run id
    steps, summary, config = [], {}, {}
    for folder in runs:
        for record in _wandb_records(folder / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                if "loss/value" in items:
                    steps.append(items["_step"])
            elif kind == "summary":
                summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                for i in record.summary.update})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    assert steps == [r["env_steps"] for r in second.history if "loss/value" in r]
    assert summary["summary/env_steps"] == 32 * 8 and summary["summary/eval_return"] == second.eval_return
    assert config["algo"] == "ppo"
    assert (runs[-1] / "files" / "checkpoint.pt").is_file()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the sessions run in a fork of this process")
def test_trackio_records_rows_and_a_resume_continues_the_run(tmp_path):
    """In a child forked from this process, since trackio reads TRACKIO_DIR when it is imported: the child sets it
    and imports trackio afresh (forgetting any import of it this process made), then runs the run and its resume
    (the command's code, called twice) and reads what they logged with trackio's own storage. Forked rather than a
    fresh interpreter, which would spend seconds importing torch first."""
    pytest.importorskip("trackio", reason="needs the trackio extra")
    from rlstruct.algos._train import cli

    flags = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "8", "--n-epochs", "1", "--n-minibatches", "1",
             "--hidden-sizes", "8", "--no-progress", "--no-tensorboard", "--n-evaluation-envs", "2",
             "--max-episode-steps", "30", "--log-every", "1", "--preset", "none", "--track", "trackio"]
    logdir = tmp_path / "run"
    sessions = [["train", "ppo", *flags, *more] for more in (["--logdir", str(logdir), "--max-env-steps", "128"],
                                                              ["--resume", str(logdir), "--max-env-steps", "256"])]
    logged = tmp_path / "logged.json"

    def sessions_then_read_back() -> int:
        os.environ["TRACKIO_DIR"] = str(tmp_path / "trackio")
        for name in [name for name in sys.modules if name == "trackio" or name.startswith("trackio.")]:
            del sys.modules[name]
        os.chdir(tmp_path)
        for argv in sessions:
            assert cli.main(argv) == 0, argv
        from trackio.sqlite_storage import SQLiteStorage

        name = json.loads((logdir / TRACKERS_FILE).read_text())["trackio"]
        steps = [r["step"] for r in SQLiteStorage.get_logs("rlstruct", name) if "loss/value" in r]
        logged.write_text(json.dumps([steps, SQLiteStorage.get_run_config("rlstruct", name)["algo"]]))
        return 0

    child = ForkedCommand([], tmp_path / "child", call=sessions_then_read_back)
    assert child.wait(300) == 0, child.stderr[-2000:]
    assert json.loads(logged.read_text()) == [list(range(32, 257, 32)), "ppo"]


def test_an_unknown_or_missing_tracker_fails_before_the_run_starts(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="track must name trackers among mlflow, wandb, trackio"):
        ppo.train(dataclasses.replace(TINY, track="neptune", logdir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[wandb\]'"):
        check_trackers("wandb")


def test_only_the_logging_rank_opens_trackers(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    config = dataclasses.replace(TINY, track="mlflow", logdir=str(tmp_path / "run"))
    run = Run("ppo", config, describe_env("CartPole-v1", "auto", 30, None), logger=False, world_size=2)
    run.record(32, {"loss/value": 1.0})
    run.close()
    run.trackers.close()
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run" / TRACKERS_FILE).exists()


@pytest.mark.slow
def test_a_run_that_raises_ends_its_tracked_run_as_failed(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    from mlflow import MlflowClient

    # A file store: the run's end is the tracker's, whatever the store (an SQLite one's creation, MLflow's schema
    # migrations, took 4-6 s of this test's wall time; the records test runs on both stores)
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)

    def fail(*args, **kwargs):
        raise RuntimeError("the learner failed")

    monkeypatch.setattr(Run, "poll_checkpoint", fail)
    with pytest.raises(RuntimeError, match="the learner failed"):
        ppo.train(dataclasses.replace(TINY, track="mlflow", logdir=str(tmp_path / "run")))
    run_id = json.loads((tmp_path / "run" / TRACKERS_FILE).read_text())["mlflow"]
    assert MlflowClient(uri).get_run(run_id).info.status == "FAILED"


# Trackers are best effort: a tracker that fails is one warning and is dropped; training and the run folder go on.

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "rlstruct.algos._train.trackers" and r.levelno >= logging.WARNING]


def _free_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound by the system, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_an_unreachable_mlflow_server_is_one_warning_and_the_run_trains_to_its_end(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    result = ppo.train(dataclasses.replace(TINY, track="mlflow", logdir=str(tmp_path / "run")))
    # MLflow's own retries of a refused connection take minutes; bounded, a few seconds (any load allowed for).
    assert time.monotonic() - start < 90
    assert result.env_steps == TINY.max_env_steps and (tmp_path / "run" / "checkpoint.pt").is_file()
    [warning] = _warnings(caplog)
    assert warning.startswith("track=mlflow failed in its start (MlflowException: ") and "127.0.0.1" in warning
    assert not (tmp_path / "run" / TRACKERS_FILE).exists()
    assert not any(r.name.startswith("urllib3") for r in caplog.records)  # no line per retry


@pytest.mark.slow
def test_an_mlflow_server_that_never_answers_is_given_up_within_its_timeout(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    with socket.socket() as server:  # accepts connections (the kernel's backlog) and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.getsockname()[1]}")
        # The user's own settings are kept: a 1 s timeout, and no wait between tries (the bounds' backoff and
        # MLflow's jitter would add 2-5 s of sleep to this test).
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
        caplog.set_level(logging.WARNING)
        start = time.monotonic()
        assert open_trackers("mlflow", tmp_path, {"algo": "ppo"}) == []
        assert time.monotonic() - start < 60  # 3 tries of 1 s; unbounded: 8 tries, minutes apart
        # The tries, counted by the server rather than the clock: its backlog holds one connection a try, the bound's
        # two retries after the first (MLflow's own default: seven).
        server.setblocking(False)
        tries = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                server.accept()[0].close()
                tries += 1
        assert tries == 1 + int(MLFLOW_HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    [warning] = _warnings(caplog)
    assert warning.startswith("track=mlflow failed in its start") and "timed out" in warning.lower()


def test_mlflow_calls_bound_http_where_the_environment_does_not(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    with _bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == MLFLOW_HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"


class _FailingTracker(Tracker):
    """A tracker whose store fails at the chosen call (``fail_at``: a method name, or ``"start"``)."""

    module = "json"
    fail_at = "log_rows"
    calls: list[str] = []

    def __init__(self, run_name, run_id, *args):
        if self.fail_at == "start":
            raise ConnectionError("the store refused the connection")
        self.run_id = "fake-1"

    def _called(self, what):
        type(self).calls.append(what)
        if what == self.fail_at and type(self).calls.count(what) == 2:  # the second call: mid-run
            raise OSError("the store's disk is full")

    def log_params(self, params):
        self._called("log_params")

    def log_rows(self, rows):
        self._called("log_rows")

    def log_summary(self, summary):
        self._called("log_summary")

    def log_artifact(self, path):
        self._called("log_artifact")

    def close(self, *, failed=False):
        self._called("close")


@pytest.mark.learning_curve  # the curve is the artifact a tracker's log_artifact gets in this run
@pytest.mark.parametrize("fail_at", ["start", "log_rows", "log_artifact"])
def test_a_tracker_that_fails_at_start_or_mid_run_is_dropped_and_the_run_keeps_its_weights(tmp_path, monkeypatch,
                                                                                          caplog, fail_at):
    """One run tracks into the three, each a fake that fails at ``fail_at``: each is dropped with its own warning,
    and the run trains to its end and writes its folder."""
    names = ["mlflow", "wandb", "trackio"]
    fakes = {name: type("Fake", (_FailingTracker,), {"name": name, "fail_at": fail_at, "calls": []})
             for name in names}
    for name, fake in fakes.items():
        monkeypatch.setitem(TRACKERS, name, fake)
    caplog.set_level(logging.WARNING)
    result = ppo.train(dataclasses.replace(TINY, track=",".join(names), logdir=str(tmp_path / "run")))
    assert result.env_steps == TINY.max_env_steps
    assert {"checkpoint.pt", "summary.json", "progress.csv"} <= {p.name for p in (tmp_path / "run").iterdir()}
    assert len([r for r in result.history if "loss/value" in r]) == 4
    warnings = _warnings(caplog)
    if fail_at == "start":
        assert sorted(warnings) == sorted(f"track={name} failed in its start (ConnectionError: the store refused the "
                                          "connection) and is dropped; the run goes on without it" for name in names)
        assert all(fake.calls == [] for fake in fakes.values())
    else:
        assert sorted(warnings) == sorted(f"track={name} failed in {fail_at} (OSError: the store's disk is full) and "
                                          "is dropped; the run goes on without it" for name in names)
        for fake in fakes.values():  # nothing called once it failed
            assert fake.calls[-1] == fail_at and fake.calls.count(fail_at) == 2, fake.calls


def test_mlflow_file_store_is_refused_before_the_run_in_one_line_naming_sqlite(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"^track='mlflow' needs a database store, got MLFLOW_TRACKING_URI='file:"
                                          r".*', a file store that MLflow 3 no longer opens; set "
                                          r"MLFLOW_TRACKING_URI=sqlite:///mlflow\.db \(or "
                                          r"MLFLOW_ALLOW_FILE_STORE=true to keep the file store\)$"):
        ppo.train(dataclasses.replace(TINY, track="mlflow", logdir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


# No credential reaches the console or a file: the URLs a warning quotes lose their user:password and tokens.

_SECRETS = ("s3cret", "tok123", "key456")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_mlflow_failure_warning_shows_the_server_without_its_credentials(tmp_path, monkeypatch, caplog, scheme):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    port = _free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{scheme}://alice:s3cret@127.0.0.1:{port}/?token=tok123&api_key=key456")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    caplog.set_level(logging.WARNING)
    assert open_trackers("mlflow", tmp_path, {"algo": "ppo"}) == []
    [warning] = _warnings(caplog)
    assert f"{scheme}://***@127.0.0.1:{port}" in warning and "token=***" in warning
    assert not [s for s in _SECRETS if s in caplog.text]
    assert not [s for s in _SECRETS for p in tmp_path.rglob("*") if p.is_file() and s in p.read_text(errors="ignore")]


@pytest.mark.parametrize("name", ["mlflow", "wandb", "trackio"])
@pytest.mark.parametrize("fail_at", ["start", "log_rows"])
def test_a_tracker_failure_quoting_a_url_with_credentials_warns_without_them(tmp_path, monkeypatch, caplog, name,
                                                                             fail_at):
    url = "https://alice:s3cret@tracker.example:8443/api?access_token=tok123&project=p"

    class Leaky(_FailingTracker):
        def __init__(self, run_name, run_id, *args):
            if fail_at == "start":
                raise ConnectionError(f"cannot reach {url}")
            self.run_id = "fake-1"

        def log_rows(self, rows):
            raise ConnectionError(f"POST {url} failed")

    monkeypatch.setitem(TRACKERS, name, type("Leaky", (Leaky,), {"name": name, "calls": []}))
    caplog.set_level(logging.WARNING)
    trackers = open_trackers(name, tmp_path, {"algo": "ppo"})
    for tracker in trackers:
        tracker.log_rows([{"env_steps": 1, "loss": 0.5}])
    [warning] = _warnings(caplog)
    assert "https://***@tracker.example:8443/api?access_token=***&project=p" in warning
    assert not [s for s in _SECRETS if s in caplog.text]


@pytest.mark.parametrize("store", ["a folder", "under a file", "read-only folder"])
def test_an_unwritable_sqlite_store_is_one_warning_without_mlflow_retrying(tmp_path, monkeypatch, caplog, store):
    # Unchecked, MLflow retries a store it cannot open ten times over 102 s before the tracker is dropped.
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    if store == "a folder":
        (tmp_path / "mlflow.db").mkdir()
        path, why = tmp_path / "mlflow.db", "it is a folder, not a file"
    elif store == "under a file":
        (tmp_path / "file").write_text("")
        path, why = tmp_path / "file" / "mlflow.db", f"{str(tmp_path / 'file')!r} is a file, not a folder"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder; the other stores test this as root")
        (tmp_path / "ro").mkdir(mode=0o500)
        path, why = tmp_path / "ro" / "mlflow.db", "Permission denied (errno EACCES)"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    assert open_trackers("mlflow", tmp_path / "run", {"algo": "ppo"}) == []
    assert time.monotonic() - start < 30
    [warning] = _warnings(caplog)
    assert warning == (f"track=mlflow failed in its start (ConfigError: track='mlflow' needs an SQLite store it can "
                       f"write, got MLFLOW_TRACKING_URI='sqlite:///{path}': {why}; set MLFLOW_TRACKING_URI to a file "
                       "in a writable folder, e.g. sqlite:///mlflow.db) and is dropped; the run goes on without it")
