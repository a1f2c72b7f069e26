"""A run folder is untrusted input: its files are never written through a symbolic link planted in it, the commands
that read runs never write over a run's own files, a failed start says why it failed (not that its folder was
deleted), a full or read-only disk and a damaged ``progress.csv`` are one line each, ``config.json`` is never left
empty, and TensorBoard hides what a resumed run dropped."""

from __future__ import annotations

import dataclasses
import errno
import json
import multiprocessing
import os
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.classic_control import CartPoleEnv

from rlstruct.algos import a2c, load
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._replay_storage import Allocator
from rlstruct.algos._train import durable, folder_claim, loops, memory
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, save_checkpoint
from rlstruct.algos._train.durable import make_folder, open_appending, open_unlinked, write_whole
from rlstruct.algos._train.folder_claim import claim_logdir, folder_identity, folder_moved
from rlstruct.algos._train.run_folder import (
    CONFIG_NAME,
    CSV_NAME,
    CURVE_NAME,
    LOCK_NAME,
    SUMMARY_NAME,
    RunFolder,
    check_output,
)
from rlstruct.algos.dqn import DQNConfig
from rlstruct.algos.sac import SACConfig
from rlstruct.errors import BatcherWorkerError, ConfigError, RunFileLinkError, RunRecordError
from tests.algos.test_one_line_faults import run_cli
from tests.algos.test_run_record import CONFIG

pytestmark = pytest.mark.timeout(120)

#: the budget of a resume that continues the fixture's run (CONFIG's 4 iterations) by one iteration
MORE = CONFIG.max_env_steps + 32
PRECIOUS = b"another user's file\n"
#: a time in the past, so that a write (which sets the clock's time) shows in st_mtime_ns
PAST = 1_000_000_000


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished a2c run's folder (4 iterations): read it, or copy it (:func:`copy_run`) before writing."""
    logdir = tmp_path_factory.mktemp("a2c") / "run"
    a2c.train(dataclasses.replace(CONFIG, logdir=str(logdir)))
    return logdir


def copy_run(trained: Path, target: Path) -> Path:
    shutil.copytree(trained, target)
    return target


def files(folder: Path) -> dict[str, bytes]:
    """The run's regular files, by name (links left out)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def victim(path: Path, data: bytes = PRECIOUS) -> tuple[bytes, int]:
    """Writes ``path`` (a file outside the run that a link will point at) with ``data`` and an old mtime."""
    path.write_bytes(data)
    os.utime(path, ns=(PAST, PAST))
    return data, path.stat().st_mtime_ns


def untouched(path: Path, before: tuple[bytes, int]) -> bool:
    return (path.read_bytes(), path.stat().st_mtime_ns) == before


# --------------------------------------------------------------------------- no write through a link
@pytest.mark.parametrize("name", [LOCK_NAME, f"{SUMMARY_NAME}.partial", CSV_NAME, CONFIG_NAME, CHECKPOINT_NAME,
                                  f"{CHECKPOINT_NAME}.partial", f"{CSV_NAME}.partial", "videos"])
def test_a_resume_refuses_a_run_folder_with_a_link_planted_in_it(trained, tmp_path, name):
    run = copy_run(trained, tmp_path / "run")
    target = tmp_path / "elsewhere"
    planted = run / name
    if name == "videos":  # a folder the run writes into
        target.mkdir()
        before = victim(target / "step_000000128.gif")
        target, checked = target / "step_000000128.gif", target
    else:  # the checkpoint's target must load: the link is what is refused, after the checkpoint is read
        before = victim(target, planted.read_bytes() if name == CHECKPOINT_NAME else PRECIOUS)
        checked = target
    if planted.exists():
        planted.unlink()
    planted.symlink_to(checked)
    record = files(run)
    with pytest.raises(RunFileLinkError, match=rf"'{run / name}' must be a file or folder of its own, not a symbolic "
                                                rf"link: got a link to '{checked}', .* remove the link"):
        a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=MORE))
    assert untouched(target, before)
    assert files(run) == record and planted.is_symlink()


def test_the_command_line_refuses_a_planted_link_in_one_line(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    before = victim(tmp_path / "elsewhere", (run / CSV_NAME).read_bytes())
    (run / CSV_NAME).unlink()
    (run / CSV_NAME).symlink_to(tmp_path / "elsewhere")
    code, lines = run_cli(["train", "a2c", "--resume", str(run), "--max-env-steps", str(MORE)], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"rlstruct train a2c: error: '{run / CSV_NAME}' must be a file or folder of its own")
    assert lines[0].endswith(f"remove the link (rm '{run / CSV_NAME}'), then run the command again")
    assert untouched(tmp_path / "elsewhere", before)


def test_a_new_run_refuses_a_folder_with_a_planted_link(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    before = victim(tmp_path / "elsewhere")
    (run / f"{SUMMARY_NAME}.partial").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunFileLinkError, match=r"summary\.json\.partial' must be a file or folder of its own"):
        a2c.train(dataclasses.replace(CONFIG, logdir=str(run)))
    assert untouched(tmp_path / "elsewhere", before)
    assert sorted(os.listdir(run)) == [f"{SUMMARY_NAME}.partial"], "the failed start gave its folder back"


def test_each_write_refuses_a_link_itself(tmp_path):
    """Past the folder's check at the start, each write refuses a link of its own (one planted during the run)."""
    run = tmp_path / "run"
    run.mkdir()
    before = victim(tmp_path / "elsewhere")
    link = run / "file"
    link.symlink_to(tmp_path / "elsewhere")
    (run / "other.partial").symlink_to(tmp_path / "elsewhere")  # the file a whole write goes through
    for write in (lambda: write_whole(link, "x"), lambda: write_whole(run / "other", "x"),
                  lambda: open_appending(link), lambda: open_unlinked(link, os.O_RDWR | os.O_CREAT),
                  lambda: make_folder(link)):
        with pytest.raises(RunFileLinkError, match="must be a file or folder of its own, not a symbolic link"):
            write()
    assert untouched(tmp_path / "elsewhere", before)
    assert not (run / "other").exists()


def test_the_run_folders_writers_refuse_links(trained, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    before = victim(tmp_path / "elsewhere")
    (run / CSV_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunFileLinkError, match="progress.csv' must be a file or folder of its own"):
        RunFolder(run, rows=[{"iteration": 1, "env_steps": 32}], header=["iteration", "env_steps"])
    (run / f"{CHECKPOINT_NAME}.partial").symlink_to(tmp_path / "elsewhere")
    spec = EnvSpec((4,), "float32", 2, 50)
    with pytest.raises(RunFileLinkError, match=r"checkpoint\.pt\.partial' must be a file or folder of its own"):
        save_checkpoint(run / CHECKPOINT_NAME, "a2c", CONFIG, spec, load(trained).agent.model)
    (run / "replay").symlink_to(tmp_path)
    with pytest.raises(RunFileLinkError, match="replay' must be a file or folder of its own"):
        Allocator("cpu", storage="disk", folder=run / "replay")
    assert untouched(tmp_path / "elsewhere", before) and not (run / CHECKPOINT_NAME).exists()


# --------------------------------------------------------------------------- commands never write over a run
def test_export_refuses_an_output_in_the_run_folder(trained, tmp_path, capsys):
    before = files(trained)
    code, lines = run_cli(["export", str(trained), "--output", str(trained / CHECKPOINT_NAME)], capsys)
    assert code == 2 and lines == [f"rlstruct export: error: --output must be a path outside every run folder, got "
                                   f"'{trained / CHECKPOINT_NAME}', which is in the run folder '{trained}' (the run's "
                                   f"own {CHECKPOINT_NAME}, which it would replace); pass a path outside the run's "
                                   "folder, or a new file name beside its files"]
    check_output(trained / "policy.onnx", argument="--output")  # a new file beside the run's own ones passes
    (tmp_path / "policy.pt").symlink_to(trained / CHECKPOINT_NAME)
    code, lines = run_cli(["export", str(trained), "--output", str(tmp_path / "policy.pt")], capsys)
    assert code == 2 and len(lines) == 1 and "which leads through a symbolic link into the run folder" in lines[0]
    with pytest.raises(ConfigError, match=r"output must be a path outside every run folder, .*progress\.csv"):
        load(trained).export(trained / CSV_NAME)
    assert files(trained) == before


@pytest.mark.parametrize("argv", [["compare", "{run}", "--curves", "{run}/" + CURVE_NAME],
                                  ["compare", "{run}", "--plot", "{run}/" + CURVE_NAME],
                                  ["report", "{run}", "--output", "{run}/" + SUMMARY_NAME]])
def test_compare_and_report_refuse_an_output_in_a_run_folder(trained, capsys, argv):
    before = files(trained)
    code, lines = run_cli([a.format(run=trained) for a in argv], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"rlstruct {argv[0]}: error: {argv[2]} must be a path outside every run folder")
    assert files(trained) == before


def test_an_output_outside_the_runs_passes(trained, tmp_path):
    check_output(tmp_path / "policy.onnx", argument="--output")
    check_output(trained.parent / "report.html", argument="--output")  # beside a run, not in it
    (tmp_path / CONFIG_NAME).write_text('{"name": "a web app"}')  # a config.json that is no run's
    check_output(tmp_path / "curves.png", argument="--curves")
    check_output(None, argument="--plot")


# --------------------------------------------------------------------------- a failed start says why
def test_a_worker_that_fails_at_the_start_is_reported_not_a_deleted_folder(tmp_path, monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise BatcherWorkerError("worker 0 raised ValueError: the simulator's license server is unreachable\n"
                                 "--- traceback in worker 0 ---\n...", worker_id=0)

    monkeypatch.setattr(loops, "open_batchers", failing)
    code, lines = run_cli(["train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "64", "--no-progress",
                           "--no-tensorboard", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 1 and lines == ["rlstruct train a2c: error: worker 0 raised ValueError: the simulator's license "
                                   "server is unreachable"]
    assert not (tmp_path / "run").exists(), "the failed start gave its folder back"


class RaisesInWorker(CartPoleEnv):
    """CartPole that cannot be built in a worker process (its license server is unreachable from there)."""

    def __init__(self, **kwargs):
        if multiprocessing.parent_process() is not None:
            raise ValueError("the simulator's license server is unreachable")
        super().__init__(**kwargs)


gym.register("RaisesInWorker-v0", entry_point=f"{__name__}:RaisesInWorker", max_episode_steps=50)


@pytest.mark.slow
def test_an_env_that_raises_in_a_worker_at_the_start_is_reported(tmp_path, capsys):
    code, lines = run_cli(["train", "a2c", "--env", f"{__name__}:RaisesInWorker-v0", "--max-env-steps", "64",
                           "--n-processes", "1", "--n-envs", "2", "--n-evaluation-envs", "2", "--no-progress",
                           "--no-tensorboard", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 1 and lines == ["rlstruct train a2c: error: worker 0 raised ValueError: the simulator's license "
                                   "server is unreachable"], lines
    assert not (tmp_path / "run").exists()


def test_a_folder_is_known_by_its_identity(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    identity = folder_identity(folder)
    assert not folder_moved(folder, identity)
    folder.rename(tmp_path / "moved")
    folder.mkdir()  # another folder of the same name: not the run's
    assert folder_moved(folder, identity) and folder_moved(tmp_path / "gone", identity)
    claim = folder_claim.claim_run_folder(tmp_path / "new")
    assert claim.identity == folder_identity(tmp_path / "new") and not claim.released
    assert claim.release() and claim.released and not (tmp_path / "new").exists()


@pytest.mark.parametrize("algo, config, flag", [("dqn", DQNConfig, "--rollout-steps"), ("sac", SACConfig,
                                                                                         "--rollout-steps")])
def test_an_off_policy_runs_envs_are_checked_against_memory_per_acquisition(tmp_path, monkeypatch, capsys, algo,
                                                                          config, flag):
    """Ten million CartPole envs need 1.4 GB for one step each, but ``rollout_steps`` an acquisition (DQN's 16, SAC's
    8) and the transitions pushed: tens of GB, refused on a 2 GB machine before anything is allocated."""
    spec = EnvSpec((4,), "float32", 2, 500)
    steps = config().rollout_steps
    assert memory.collection_nbytes(config(n_envs=10**6), spec) == 3 * 10**6 * steps * (2 * 16 + 8 + 32)
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 10**9)
    code, lines = run_cli(["train", algo, "--env", "CartPole-v1" if algo == "dqn" else "Pendulum-v1", "--n-envs",
                           "10000000", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"rlstruct train {algo}: error: --n-envs 10000000 needs at least ")
    assert "this machine has 2.0 GB available; pass a smaller --n-envs (at most " in lines[0]
    assert lines[0].endswith(f" fits) or {flag}")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- the disk, the rows, the config
def _refuse_checkpoint(monkeypatch, error) -> None:
    """The checkpoint's write fails with ``error(path)`` (its other files are written as ever)."""
    real = durable.open_unlinked

    def open_(path, flags, mode=0o644):
        if str(path).endswith(f"{CHECKPOINT_NAME}.partial"):
            return error(path, flags)
        return real(path, flags, mode)

    monkeypatch.setattr(durable, "open_unlinked", open_)


def _full(path, flags):  # the partial file is made; its bytes find no room
    if flags & os.O_EXCL:
        return os.open(path, flags, 0o644)
    return os.open("/dev/full", os.O_WRONLY)


def _read_only(path, flags):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="a full disk is /dev/full")
@pytest.mark.parametrize("error, name, reason, fix", [
    (_full, CHECKPOINT_NAME, "No space left on device (ENOSPC)", "free space on its disk"),
    (_read_only, f"{CHECKPOINT_NAME}.partial", "Read-only file system (EROFS)",
     "the run folder became read-only: make it writable"),
])
def test_a_checkpoint_onto_a_full_or_read_only_disk_is_one_line(trained, tmp_path, monkeypatch, capsys, error, name,
                                                                reason, fix):
    run = copy_run(trained, tmp_path / "run")
    checkpoint = (run / CHECKPOINT_NAME).read_bytes()
    _refuse_checkpoint(monkeypatch, error)
    code, lines = run_cli(["train", "a2c", "--resume", str(run), "--max-env-steps", str(MORE)], capsys)
    assert code == 1 and lines == [f"rlstruct train a2c: error: cannot write '{run / name}': {reason}; "
                                   f"{fix}, then rlstruct train a2c --resume {run} continues the run from its last "
                                   "checkpoint"], lines
    assert (run / CHECKPOINT_NAME).read_bytes() == checkpoint
    assert not (run / f"{CHECKPOINT_NAME}.partial").exists()


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes a read-only folder")
def test_a_read_only_run_folder_is_refused_before_the_run(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    run.chmod(0o555)
    try:
        code, lines = run_cli(["train", "a2c", "--resume", str(run), "--max-env-steps", str(MORE)], capsys)
    finally:
        run.chmod(0o755)
    assert code == 2 and len(lines) == 1 and "pass --logdir a writable folder" in lines[0], lines


def test_a_progress_csv_that_is_not_utf8_is_one_line(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    text = (run / CSV_NAME).read_bytes()
    second = text.index(b"\n") + 1
    (run / CSV_NAME).write_bytes(text[:second + 4] + b"\xff" + text[second + 5:])
    record = files(run)
    with pytest.raises(RunRecordError, match=rf"progress\.csv must be UTF-8 text \(a run's progress\.csv\), got byte "
                                             rf"0xff at offset {second + 4} \(line 2\), which is not; correct .* "
                                             r"then resume again"):
        a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=MORE))
    code, lines = run_cli(["train", "a2c", "--resume", str(run), "--max-env-steps", str(MORE)], capsys)
    assert code == 2 and len(lines) == 1 and "got byte 0xff at offset" in lines[0], lines
    assert files(run) == record


def test_a_claimed_config_is_never_empty(tmp_path, monkeypatch):
    path = claim_logdir(tmp_path / "run")
    assert json.loads((path / CONFIG_NAME).read_text()) == {}
    # A start stopped at any step of its claim leaves no config.json (nor its temporary file), never an empty one.
    for step in ("link", "sync_file"):
        with monkeypatch.context() as m:
            target = folder_claim.os if step == "link" else folder_claim
            m.setattr(target, step, lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
            with pytest.raises(KeyboardInterrupt):
                claim_logdir(tmp_path / step)
        assert os.listdir(tmp_path / step) == []


def test_a_config_whose_rename_fails_keeps_the_previous_one(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path / "run", rows=[])
    folder.write_config({"env": "CartPole-v1"})

    def refused(src, dst):
        raise OSError(errno.EIO, "Input/output error", str(dst))

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(OSError, match="Input/output error"):
        folder.write_config({"env": "Acrobot-v1"})
    folder.close()
    assert json.loads((tmp_path / "run" / CONFIG_NAME).read_text()) == {"env": "CartPole-v1"}
    assert sorted(os.listdir(tmp_path / "run")) == [CONFIG_NAME, CSV_NAME]


def test_a_resume_that_finds_an_empty_config_says_so_and_rewrites_it(trained, tmp_path, caplog):
    run = copy_run(trained, tmp_path / "run")
    (run / CONFIG_NAME).write_bytes(b"")
    a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=MORE))
    said = [r.getMessage() for r in caplog.records if CONFIG_NAME in r.getMessage()]
    assert said == [f"{run / CONFIG_NAME} is empty: replaced by the settings of this run (its checkpoint's, for a "
                    "resumed run)"]
    assert json.loads((run / CONFIG_NAME).read_text())["max_env_steps"] == MORE


def test_tensorboard_hides_the_steps_past_the_resumed_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="needs the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    first = RunFolder(run, rows=[], tensorboard=True)
    for step in (32, 64, 96, 128):  # a session killed after its checkpoint at 64 env steps had logged up to 128
        first.write_rows([{"iteration": step // 32, "env_steps": step, "loss": float(step)}])
    first.close()
    (events,) = run.glob("events.out.tfevents.*")
    events.rename(run / "events.out.tfevents.0000000001.host.1.0")  # the earlier session's file sorts first
    second = RunFolder(run, rows=[], tensorboard=True, resumed_env_steps=64)
    second.write_rows([{"iteration": 3, "env_steps": 96, "loss": -96.0}])
    second.close()
    board = EventAccumulator(str(run))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("loss")] == [(32, 32.0), (64, 64.0), (96, -96.0)]
