"""A run's folder as a durable record: ``progress.csv`` grows by appends and is rewritten only through a file swapped
in whole, a checkpoint carries a digest of its content that every load checks, ``--resume`` of a finished run changes
nothing, a start refused before training leaves no folder claimed and removes only what it wrote, one process writes a
folder at a time, and a checkpoint's counters and the rows a ``--resume`` continues are checked.

Each fault is injected at a chosen moment (a kill inside the rewrite, a byte flipped in the checkpoint's weights),
never by timing.
"""

from __future__ import annotations

import builtins
import csv
import dataclasses
import io
import json
import os
import re
import signal
import socket
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rlstruct.algos import a2c, load
from rlstruct.algos._train import cli
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, content_digest, load_checkpoint
from rlstruct.algos._train.compare import load_group
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.folder_claim import RunFolderLock
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.run_folder import (
    CONFIG_NAME,
    CSV_NAME,
    CURVE_NAME,
    LOCK_NAME,
    SUMMARY_NAME,
    RunFolder,
    earlier_run_files,
)
from rlstruct.algos._train.session import validate
from rlstruct.errors import CheckpointError, RunFinishedError, RunFolderBusyError, RunRecordError
from tests.helpers import ForkedCommand

pytestmark = pytest.mark.timeout(120)

CONFIG = a2c.A2CConfig(n_envs=4, n_steps=8, hidden_sizes=(8,), progress=False, tensorboard=False,
                       n_evaluation_envs=2, eval_every=3, max_episode_steps=50, log_every=1,
                       stop_at_reward_threshold=False, time_limit=100.0, preset="none", max_env_steps=32 * 4)


def csv_rows(logdir) -> list[dict]:
    with open(os.path.join(logdir, CSV_NAME), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished a2c run's folder (4 iterations)."""
    logdir = tmp_path_factory.mktemp("a2c") / "run"
    a2c.train(dataclasses.replace(CONFIG, logdir=str(logdir)))
    return logdir


def training_rows(logdir) -> list[dict]:
    return [r for r in csv_rows(logdir) if r.get("eval/return", "") == ""]


def copy_run(source, target) -> None:
    target.mkdir()
    for name in (CHECKPOINT_NAME, CSV_NAME, SUMMARY_NAME, CONFIG_NAME):
        (target / name).write_bytes((source / name).read_bytes())


def flip_a_weight_byte(checkpoint, entry: str = "/data/") -> None:
    """Flips one byte in the middle of the checkpoint's largest tensor, or of its largest entry whose name holds
    ``entry`` (the zip stores them uncompressed)."""
    with zipfile.ZipFile(checkpoint) as z:
        info = max((i for i in z.infolist() if entry in i.filename), key=lambda i: i.file_size)
    with open(checkpoint, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


# --------------------------------------------------------------------------- checkpoint digests
def test_the_digest_covers_every_value_of_the_checkpoint(trained):
    data = torch.load(trained / CHECKPOINT_NAME, weights_only=True)
    assert data["digest"] == content_digest(data)
    data["iteration"] += 1
    assert data["digest"] != content_digest(data)


def test_a_checkpoint_damaged_on_disk_is_refused_by_every_load(trained, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    copy_run(trained, damaged)
    path = damaged / CHECKPOINT_NAME
    flip_a_weight_byte(path)
    torch.load(path, weights_only=True)  # torch reads it without a word: the zip's CRCs are not checked
    damaged_file = rf"='{path}' is damaged: its content does not match the digest written with it"
    with pytest.raises(CheckpointError, match=damaged_file):
        load_checkpoint(damaged, argument="checkpoint")
    with pytest.raises(CheckpointError, match=damaged_file):
        evaluate_checkpoint(str(path), episodes=1)
    with pytest.raises(CheckpointError, match=damaged_file):
        load(damaged)
    with pytest.raises(CheckpointError, match=damaged_file):
        a2c.train(dataclasses.replace(CONFIG, resume=str(damaged), max_env_steps=32 * 8))
    for argv in (["eval", str(path)], ["export", str(damaged), "--output", str(tmp_path / "p.pt")],
                 ["train", "a2c", "--resume", str(damaged), "--max-env-steps", "512"]):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and "is damaged" in err, (argv, err)
    assert not (tmp_path / "p.pt").exists()


def test_a_checkpoint_whose_pickle_is_damaged_is_named_damaged(trained, tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes((trained / CHECKPOINT_NAME).read_bytes())
    flip_a_weight_byte(path, entry="data.pkl")
    with pytest.raises(CheckpointError, match=rf"path='{path}' is damaged: its (entry \S+data.pkl does not match its "
                                              r"CRC|content does not match the digest)"):
        load_checkpoint(path)


def test_a_changed_byte_that_leaves_the_content_as_it_was_is_still_named_damaged(trained, tmp_path):
    """A pickle memo index that no later entry reads (``q\\x01``, BINPUT 1): the file loads whole and matches its
    digest, but it is not the file that was written, which the zip's CRC says."""
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes((trained / CHECKPOINT_NAME).read_bytes())
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
        at_in_pickle = z.read(info.filename).index(b"q\x01") + 1
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + name_len + extra_len + at_in_pickle
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    assert torch.load(path, weights_only=True)["digest"] == content_digest(torch.load(path, weights_only=True))
    with pytest.raises(CheckpointError, match=rf"path='{path}' is damaged: its entry \S+data.pkl does not match its "
                                              r"CRC"):
        load_checkpoint(path)


def test_a_checkpoint_written_before_digests_still_loads(trained, tmp_path):
    data = torch.load(trained / CHECKPOINT_NAME, weights_only=True)
    del data["digest"]
    torch.save(data, tmp_path / CHECKPOINT_NAME)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["iteration"] == data["iteration"]
    assert json.loads((trained / SUMMARY_NAME).read_text())["iterations"] == data["iteration"]


# --------------------------------------------------------------------------- progress.csv
def kill_at_writerows() -> None:
    """The seam of a run SIGKILLed as it writes its first rows of progress.csv (the rows of the rewrite that drops
    those past the checkpoint)."""
    real = csv.DictWriter.writerows

    def writerows(self, rows):
        rows = list(rows)
        if rows:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, rows)

    csv.DictWriter.writerows = writerows


def kill_at_replace() -> None:
    """The seam of a run SIGKILLed as it swaps the rewritten progress.csv onto its name."""
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith("progress.csv"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)

    os.replace = replace


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the killed run is a fork of this process")
@pytest.mark.parametrize("moment", ["writerows", "replace"])
def test_a_kill_while_progress_is_rewritten_loses_no_row(trained, tmp_path, moment):
    logdir = tmp_path / "run"
    copy_run(trained, logdir)
    before = training_rows(logdir)
    with open(logdir / CSV_NAME, "a") as f:  # a row past the checkpoint, as a run killed after it leaves
        f.write(",".join(["5"] + [""] * (len(before[0]) - 1)) + "\r\n")
    # A fork of this process: what is tested is the files a kill leaves, not a fresh interpreter's start.
    seam = {"writerows": kill_at_writerows, "replace": kill_at_replace}[moment]
    killed = ForkedCommand(["train", "a2c", "--resume", str(logdir), "--max-env-steps", str(32 * 8)],
                           tmp_path / "killed", seam=seam)
    assert killed.wait(timeout=100) == -9, killed.stderr
    assert training_rows(logdir)[:4] == before
    second = a2c.train(dataclasses.replace(CONFIG, resume=str(logdir), logdir=None, max_env_steps=32 * 8))
    rows = training_rows(logdir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, second.iterations + 1)) and second.iterations == 8
    assert rows[:4] == [{**r, **{k: "" for k in rows[0].keys() - r.keys()}} for r in before]
    assert not os.path.exists(logdir / f"{CSV_NAME}.partial")


def test_a_resumed_run_appends_to_its_progress_and_a_new_column_swaps_a_whole_file(trained, tmp_path,
                                                                                   monkeypatch):
    logdir = tmp_path / "run"
    copy_run(trained, logdir)
    before = (logdir / CSV_NAME).read_bytes()
    inode = os.stat(logdir / CSV_NAME).st_ino
    swapped = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (swapped.append(os.path.basename(dst)),
                                                         real_replace(src, dst))[1])
    a2c.train(dataclasses.replace(CONFIG, resume=str(logdir), logdir=None, max_env_steps=32 * 6))
    assert (logdir / CSV_NAME).read_bytes().startswith(before)
    assert os.stat(logdir / CSV_NAME).st_ino == inode and CSV_NAME not in swapped
    assert {CHECKPOINT_NAME, SUMMARY_NAME} <= set(swapped)
    swapped.clear()
    fresh = tmp_path / "fresh"  # the first evaluation's columns come after the first rows: one swap, whole
    a2c.train(dataclasses.replace(CONFIG, logdir=str(fresh)))
    assert CSV_NAME in swapped
    assert [int(r["iteration"]) for r in training_rows(fresh)] == [1, 2, 3, 4]


# --------------------------------------------------------------------------- a start refused before training
DQN_FLAGS = ["train", "dqn", "--env", "CartPole-v1", "--preset", "none", "--n-envs", "4", "--rollout-steps", "4",
             "--learning-starts", "32", "--batch-size", "16", "--hidden-sizes", "8", "--max-env-steps", "64",
             "--n-evaluation-envs", "2", "--max-episode-steps", "50", "--no-stop-at-reward-threshold",
             "--no-progress", "--no-tensorboard"]


def test_a_config_refused_at_setup_leaves_no_folder_and_the_corrected_command_gets_it(tmp_path, capsys):
    logdir = tmp_path / "runs" / "dqn"
    assert cli.main([*DQN_FLAGS, "--buffer-size", str(10**13), "--logdir", str(logdir)]) == 2
    assert "--buffer-size 10000000000000 needs" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert cli.main([*DQN_FLAGS, "--buffer-size", "1000", "--logdir", str(logdir)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.splitlines()[-1])["logdir"] == str(logdir) and "holds an earlier run" not in out.err
    assert not (tmp_path / "runs" / "dqn-2").exists()


def test_a_start_failing_before_training_leaves_the_folder_as_it_was(tmp_path, monkeypatch, trained):
    from rlstruct.algos._train import loops

    def unreachable(*args, **kwargs):
        raise ConnectionError("the batcher's workers did not start: 127.0.0.1:9 refused the connection")

    existing = tmp_path / "mine"  # a folder the user made, with a file of their own: both stay
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me")
    with monkeypatch.context() as patch:
        patch.setattr(loops, "open_batchers", unreachable)
        for logdir in (tmp_path / "new", existing):
            with pytest.raises(ConnectionError, match="refused"):
                a2c.train(dataclasses.replace(CONFIG, logdir=str(logdir)))
        before = {p.name: p.read_bytes() for p in trained.iterdir()}
        with pytest.raises(ConnectionError, match="refused"):  # a resumed run, into a folder of its own
            a2c.train(dataclasses.replace(CONFIG, resume=str(trained), logdir=str(tmp_path / "resumed"),
                                          max_env_steps=32 * 8))
    assert not (tmp_path / "new").exists() and os.listdir(existing) == ["notes.txt"]
    assert not (tmp_path / "resumed").exists() and {p.name: p.read_bytes() for p in trained.iterdir()} == before
    assert a2c.train(dataclasses.replace(CONFIG, logdir=str(existing))).logdir == str(existing)


def test_a_run_that_trained_keeps_its_folder_when_it_fails(tmp_path, monkeypatch, trained):
    def fail_after_an_iteration(run, *args):
        raise RuntimeError("the learner failed")

    monkeypatch.setattr(Run, "poll_checkpoint", fail_after_an_iteration)
    with pytest.raises(RuntimeError, match="the learner failed"):
        a2c.train(dataclasses.replace(CONFIG, logdir=str(tmp_path / "run")))
    assert [int(r["iteration"]) for r in training_rows(tmp_path / "run")] == [1]
    with pytest.raises(RuntimeError, match="the learner failed"):  # a resumed run: a row past its checkpoint's
        a2c.train(dataclasses.replace(CONFIG, resume=str(trained), logdir=str(tmp_path / "resumed"),
                                      max_env_steps=32 * 8))
    assert [int(r["iteration"]) for r in training_rows(tmp_path / "resumed")] == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------- --resume of a finished run
def record_bytes(logdir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(logdir.iterdir())}


def test_resuming_a_finished_run_changes_nothing_and_says_so(trained, tmp_path, capsys):
    run = tmp_path / "run"
    copy_run(trained, run)
    before = record_bytes(run)
    assert cli.main(["train", "a2c", "--resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "is a finished run (its budget of 128 env steps was spent, at 128 env steps): " \
        "nothing to do, the run is left as it is; to train it further, pass a --max-env-steps above 128" in err
    assert json.loads(out.splitlines()[-1]) == json.loads(before[SUMMARY_NAME])
    assert record_bytes(run) == before
    with pytest.raises(RunFinishedError, match="its budget of 128 env steps was spent"):
        a2c.train(dataclasses.replace(CONFIG, resume=str(run), logdir=str(tmp_path / "elsewhere")))
    assert record_bytes(run) == before and not (tmp_path / "elsewhere").exists()
    validate(a2c.ALGORITHM, dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 5))  # more to do


def test_a_run_that_reached_its_target_resumes_only_towards_a_higher_one(tmp_path):
    run = tmp_path / "run"
    result = a2c.train(dataclasses.replace(CONFIG, logdir=str(run), target_return=5.0, max_env_steps=32 * 50))
    assert result.stop_reason == "target"
    before = record_bytes(run)
    with pytest.raises(RunFinishedError, match=r"an evaluation reached its target return 5, .* pass a higher "
                                               r"--target-return \(or --no-stop-at-reward-threshold\)"):
        a2c.train(dataclasses.replace(CONFIG, resume=str(run), target_return=5.0, max_env_steps=32 * 50))
    assert record_bytes(run) == before
    validate(a2c.ALGORITHM, dataclasses.replace(CONFIG, resume=str(run), target_return=9.0, max_env_steps=32 * 50))


@pytest.mark.parametrize("reason, resumes", [("time_limit", False), ("signal", True), ("diverged", True),
                                             (None, True)])
def test_which_stops_a_resume_continues(trained, tmp_path, reason, resumes):
    """A run stopped by its time limit continues with a new --time-limit only; an interrupted, diverged or killed
    one (a periodic checkpoint: no stop reason, no summary of its iteration) continues as it is."""
    run = tmp_path / "run"
    copy_run(trained, run)
    data = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    data["stop_reason"] = reason
    data["digest"] = content_digest(data)
    torch.save(data, run / CHECKPOINT_NAME)
    if reason is None:
        (run / SUMMARY_NAME).unlink()
    config = dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 8)
    if resumes:
        validate(a2c.ALGORITHM, config)
    else:
        with pytest.raises(RunFinishedError, match=r"it reached its time limit of 100 s, .* pass --time-limit "
                                                   r"SECONDS for this session"):
            validate(a2c.ALGORITHM, config)
        validate(a2c.ALGORITHM, dataclasses.replace(config, time_limit=200.0))


def test_a_checkpoint_written_before_stop_reasons_were_recorded_is_judged_by_its_summary(trained, tmp_path):
    run = tmp_path / "run"
    copy_run(trained, run)
    data = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    del data["stop_reason"], data["digest"]
    torch.save(data, run / CHECKPOINT_NAME)
    with pytest.raises(RunFinishedError, match="its budget of 128 env steps was spent"):
        validate(a2c.ALGORITHM, dataclasses.replace(CONFIG, resume=str(run)))


def test_a_line_cut_by_a_kill_is_dropped_and_missing_rows_are_warned_about(trained, tmp_path, caplog):
    run = tmp_path / "run"
    copy_run(trained, run)
    before = training_rows(run)
    with open(run / CSV_NAME, "a") as f:  # a kill while appending row 5: its iteration cut to "5" or even "1"
        f.write("1")
    a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6))
    rows = training_rows(run)
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 4, 5, 6] and rows[:4] == before
    empty = tmp_path / "empty"
    copy_run(trained, empty)
    (empty / CSV_NAME).write_text("")
    a2c.train(dataclasses.replace(CONFIG, resume=str(empty), max_env_steps=32 * 5))
    assert "holds no row of iteration 4, the checkpoint's" in caplog.text


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names the synced files through /proc")
def test_each_checkpoint_flushes_the_rows_the_checkpoint_the_summary_and_the_folder_to_the_disk(tmp_path,
                                                                                              monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = tmp_path / "run"
    a2c.train(dataclasses.replace(CONFIG, logdir=str(run), checkpoint_every=2))
    checkpoints = [i for i, name in enumerate(synced) if name == f"{CHECKPOINT_NAME}.partial"]
    assert len(checkpoints) == 3  # iterations 2 and 4, and the final one
    for i in checkpoints:
        assert synced[i - 1] == CSV_NAME and synced[i + 1] == "run", synced
    assert synced[-2:] == [f"{SUMMARY_NAME}.partial", "run"], synced


# --------------------------------------------------------------------------- one writer per run folder
def test_a_resume_of_a_folder_another_process_writes_is_refused_naming_it(trained, tmp_path, capsys):
    run = tmp_path / "run"
    copy_run(trained, run)
    before = record_bytes(run)
    held = RunFolderLock.acquire(run)
    try:
        holder = rf"PID {os.getpid()} on {re.escape(socket.gethostname())}, started \d{{4}}-"
        with pytest.raises(RunFolderBusyError, match=rf"logdir='{re.escape(str(run))}' must be written by one run at "
                                                     rf"a time, got another run writing it: {holder}"):
            validate(a2c.ALGORITHM, dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6))
        assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 6)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(holder, err[0]) and "wait for that run to end" in err[0], err
    finally:
        held.release()
    assert record_bytes(run) == before  # the lock file went with the lock
    assert a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6)).iterations == 6
    assert not (run / LOCK_NAME).exists()


def test_a_resume_reads_again_a_checkpoint_written_after_the_caller_read_it(trained, tmp_path):
    """The command line reads the checkpoint before the folder's lock is taken: a run that wrote a later one and
    ended meanwhile has that one continued, not the copy read before."""
    run = tmp_path / "run"
    copy_run(trained, run)
    os.utime(run / CHECKPOINT_NAME, (1e9, 1e9))  # written long before this process started
    start = time.perf_counter()
    read = load_checkpoint(run)
    config = dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6)
    setup = validate(a2c.ALGORITHM, config, checkpoint=read, start=start)
    setup.lock.release()
    assert setup.resume.model is read["model"]  # unchanged: the caller's copy is used
    later = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    later["wall_time_s"] = 999.0
    later["digest"] = content_digest(later)
    torch.save(later, run / CHECKPOINT_NAME)
    setup = validate(a2c.ALGORITHM, config, checkpoint=read, start=start)
    setup.lock.release()
    assert setup.resume.wall_time_s == 999.0


def _stop_at_6() -> None:
    """The seam of a forked ``rlstruct train`` (:class:`~tests.helpers.ForkedCommand`): the run stops itself
    (SIGSTOP) once iteration 6's checkpoint is written: alive, holding its folder, at a known iteration."""
    real = Run.poll_checkpoint

    def poll_checkpoint(self, *args):
        real(self, *args)
        if self.iteration == 6:
            os.kill(os.getpid(), signal.SIGSTOP)

    Run.poll_checkpoint = poll_checkpoint


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the live run is a fork of this process")
def test_two_resumes_of_one_folder_never_both_write_and_a_killed_holder_frees_it(trained, tmp_path, capsys):
    """A requeued ``--resume`` beside a live one is refused; once the live one is SIGKILLed, the next resumes from
    its last checkpoint, and progress.csv holds each iteration once, in order. The live one is a fork of this
    process (what is tested is the folder's lock between two processes, not an interpreter's start)."""
    run = tmp_path / "run"
    copy_run(trained, run)
    first = ForkedCommand(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 1000),
                           "--checkpoint-every", "1"], tmp_path / "first", seam=_stop_at_6)
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it stopped itself (or ended)
        assert os.WIFSTOPPED(status), first.stderr
        assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 8)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another run writing it: PID {first.pid} on " in err[0], err
        assert [int(r["iteration"]) for r in training_rows(run)] == [1, 2, 3, 4, 5, 6]
    finally:
        first.kill()  # SIGKILL: the kernel releases its lock
    assert load_checkpoint(run)["iteration"] == 6
    result = a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 8))
    rows = training_rows(run)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9)) and result.iterations == 8
    assert [int(r["env_steps"]) for r in rows] == [32 * i for i in range(1, 9)]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_neither_releases_the_lock_nor_keeps_it(tmp_path):
    """The batchers' workers under RLSTRUCT_START_METHOD=fork: the child closes its copy of the lock file at once,
    so that it cannot release the parent's lock, and the lock ends with the parent even while the child lives."""
    lock = RunFolderLock.acquire(tmp_path)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: release() does nothing here; then it waits until the parent says
        try:
            lock.release()
            os.read(read, 1)
        finally:
            os._exit(0 if not lock.held else 1)
    try:
        with pytest.raises(RunFolderBusyError):  # the child's release left the parent's lock held
            RunFolderLock.acquire(tmp_path)
        lock.release()
        again = RunFolderLock.acquire(tmp_path)  # the child, alive, holds nothing
        again.release()
    finally:
        os.write(write, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --------------------------------------------------------------------------- what a failed start removes
def test_a_failed_start_removes_only_the_names_the_run_writes(tmp_path, monkeypatch):
    """Another program's files and folders, written into the folder while the start runs, stay; so does the folder
    the start created, which holds them."""
    from rlstruct.algos._train import loops

    def another_program_writes_then_the_workers_fail(stack, config, *args, **kwargs):
        folder = Path(config.logdir)
        (folder / "notes.txt").write_text("another program's")
        (folder / "data").mkdir()
        (folder / "data" / "x.bin").write_bytes(b"x")
        raise ConnectionError("the batcher's workers did not start: 127.0.0.1:9 refused the connection")

    existing = tmp_path / "mine"
    existing.mkdir()
    monkeypatch.setattr(loops, "open_batchers", another_program_writes_then_the_workers_fail)
    for logdir in (tmp_path / "new" / "run", existing):
        with pytest.raises(ConnectionError, match="refused"):
            a2c.train(dataclasses.replace(CONFIG, logdir=str(logdir), tensorboard=True))
        assert sorted(os.listdir(logdir)) == ["data", "notes.txt"] and (logdir / "data" / "x.bin").is_file()
        assert earlier_run_files(logdir) == []


# --------------------------------------------------------------------------- files written whole
@pytest.mark.learning_curve
def test_the_learning_curve_is_written_whole(tmp_path, monkeypatch):
    """Through a file renamed onto it, as the other files a run writes at once: a kill while the PNG is written
    leaves the previous curve (or none), never a cut one."""
    pytest.importorskip("matplotlib", reason="the curve needs matplotlib: pip install 'rlstruct[plot]'")
    swapped = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (swapped.append((Path(src).name, Path(dst).name)),
                                                         real_replace(src, dst))[1])
    folder = RunFolder(tmp_path / "run", rows=[])
    rows = [{"iteration": 1, "env_steps": 64, "wall_time_s": 0.5, "train/episode_return": 20.0},
            {"iteration": 1, "env_steps": 64, "wall_time_s": 0.6, "eval/return": 30.0}]
    assert folder.write_curve(rows, "A2C on CartPole-v1") == str(tmp_path / "run" / CURVE_NAME)
    folder.close()
    assert (f"{CURVE_NAME}.partial", CURVE_NAME) in swapped
    assert (tmp_path / "run" / CURVE_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path / "run")) == [CURVE_NAME, CSV_NAME]


@pytest.mark.parametrize("wanted", ["0", "1", ""])
def test_learning_curve_0_leaves_the_curve_out_and_says_so_in_the_result(tmp_path, monkeypatch, wanted):
    """``RLSTRUCT_LEARNING_CURVE=0`` (the suite's own setting): the run's files but the curve, and its result and
    summary say there is none, as without matplotlib; ``1`` or unset, the curve."""
    pytest.importorskip("matplotlib", reason="the curve needs matplotlib: pip install 'rlstruct[plot]'")
    monkeypatch.setenv("RLSTRUCT_LEARNING_CURVE", wanted)
    result = a2c.train(dataclasses.replace(CONFIG, logdir=str(tmp_path / "run"), max_env_steps=32))
    drawn = wanted != "0"
    assert (result.plot == str(tmp_path / "run" / CURVE_NAME)) == drawn and (result.plot is None) != drawn
    assert (tmp_path / "run" / CURVE_NAME).is_file() == drawn
    assert json.loads((tmp_path / "run" / SUMMARY_NAME).read_text())["plot"] == result.plot
    assert {CONFIG_NAME, CSV_NAME, SUMMARY_NAME, CHECKPOINT_NAME} <= set(os.listdir(tmp_path / "run"))


def test_a_curve_drawn_after_others_is_the_curve_a_new_figure_draws():
    """The process keeps one figure for the curves its runs draw: whatever was drawn before (a larger run, a run of
    evaluations only, a run with no row), the next curve's pixels are those of a figure made for it alone."""
    pytest.importorskip("matplotlib", reason="the curve needs matplotlib: pip install 'rlstruct[plot]'")
    from matplotlib.image import imread

    from rlstruct.algos._train import figures

    def history(n: int, scale: float, *, train: bool = True) -> list[dict]:
        rows = [{"env_steps": 64 * i, "wall_time_s": 0.1 * i, "train/episode_return": scale * (i % 7)}
                for i in range(n)] if train else []
        return rows + [{"env_steps": 640 * i, "wall_time_s": 1.0 * i, "eval/return": scale * i}
                       for i in range(max(n // 10, 1))]

    def pixels(png: bytes):
        return imread(io.BytesIO(png), format="png")

    runs = [history(200, 1e5), history(3, 0.01), history(30, 5.0, train=False), [], history(12, -300.0)]
    for before, after in zip(runs, runs[1:]):
        figures.learning_curve_png(before, "A2C on CartPole-v1")  # the kept figure holds this run's curve
        reused = figures.learning_curve_png(after, "PPO on MinAtar/Breakout-v1 ($5)")
        alone = figures._CurveFigure().draw(
            [r for r in after if "train/episode_return" in r], [r for r in after if "eval/return" in r],
            "PPO on MinAtar/Breakout-v1 ($5)")
        assert (pixels(reused) == pixels(alone)).all()


def kill_writing_config() -> None:
    """The seam of a run SIGKILLed once it opens config.json (or the file it writes whole through) for writing."""
    real_open = builtins.open

    def open_(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if os.path.basename(str(file)).startswith("config.json") and "w" in mode:
            os.kill(os.getpid(), signal.SIGKILL)
        return f

    builtins.open = open_


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the killed run is a fork of this process")
def test_a_resume_killed_while_it_writes_its_config_leaves_the_config_and_compare_reads_it(trained, tmp_path):
    run = tmp_path / "group" / "seed-0"
    run.parent.mkdir()
    copy_run(trained, run)
    before = (run / CONFIG_NAME).read_bytes()
    killed = ForkedCommand(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 6)], tmp_path / "killed",
                           seam=kill_writing_config)  # a fork of this process, as above
    assert killed.wait(timeout=100) == -9, killed.stderr
    assert (run / CONFIG_NAME).read_bytes() == before
    env = json.loads(before)["env"]
    assert load_group(str(run.parent)).scores == {env: [json.loads((run / SUMMARY_NAME).read_text())[
        "eval_return"]]}
    assert a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6)).iterations == 6


# --------------------------------------------------------------------------- counters and rows read at --resume
@pytest.mark.parametrize("field, value", [("iteration", -3), ("env_steps", -128), ("world_size", 0),
                                          ("wall_time_s", float("nan"))])
def test_a_checkpoint_with_counters_out_of_range_is_refused_in_one_line(trained, tmp_path, capsys, field, value):
    run = tmp_path / "run"
    copy_run(trained, run)
    data = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    data[field] = value
    data["digest"] = content_digest(data)
    torch.save(data, run / CHECKPOINT_NAME)
    before = record_bytes(run)
    with pytest.raises(CheckpointError, match=rf"run/checkpoint.pt' must hold {field} as .* >= \d, got {value!r}: a "
                                              "damaged or edited checkpoint"):
        load_checkpoint(run)
    assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 6)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"must hold {field} as" in err[0], err
    assert record_bytes(run) == before


def _cut_header(lines):
    return lines[1:]


def _a_word_in_a_cell(lines):
    cells = lines[2].split(",")
    cells[3] = "abc"
    return [*lines[:2], ",".join(cells), *lines[3:]]


def _row_twice(lines):  # line 4 is iteration 2's training row (line 3: an evaluation's, at iteration 1)
    return [*lines[:4], lines[3], *lines[4:]]


@pytest.mark.parametrize("edit, message", [
    (_cut_header, r"progress.csv must start with its header line \(iteration,env_steps,...\), got '1,32,[^']*'"),
    (_a_word_in_a_cell, r"progress.csv line 3 column '[^']+' must hold a number, got 'abc'"),
    (_row_twice, r"progress.csv line 5 must hold an iteration after line 4's 2, got iteration 2 \(two processes "
                 r"wrote the file, or it was edited\)"),
])
def test_a_hand_edited_progress_is_refused_at_resume_in_one_line_and_left_as_it_is(trained, tmp_path, capsys, edit,
                                                                                   message):
    run = tmp_path / "run"
    copy_run(trained, run)
    lines = (run / CSV_NAME).read_text().splitlines(keepends=True)
    (run / CSV_NAME).write_text("".join(edit(lines)))
    before = record_bytes(run)
    with pytest.raises(RunRecordError, match=message + r"; correct .* then resume again"):
        a2c.train(dataclasses.replace(CONFIG, resume=str(run), max_env_steps=32 * 6))
    assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(32 * 6)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert record_bytes(run) == before
