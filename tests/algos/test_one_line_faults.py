"""Faults a cluster user meets, each one line (a typed error; from the command line one stderr line, a nonzero exit
status and no traceback) that names what failed and the fix: a bad ``RLSTRUCT_START_METHOD`` or
``RLSTRUCT_LEARNING_CURVE``, a checkpoint whose
zip directory was damaged, a resumed run given another env, a full or read-only disk, a ``/dev/shm`` too small for
the batchers' shared memory, and more envs than memory holds."""

from __future__ import annotations

import errno
import os
import re
import shutil
import struct
from pathlib import Path

import psutil
import pytest
import torch

from rlstruct.algos import load
from rlstruct.algos._train import log, memory, run_folder
from rlstruct.algos._train.cli import main
from rlstruct.errors import CheckpointError


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``rlstruct ARGV`` in this process: its exit status and its stderr lines."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own exits
        code = e.code
    return code, capsys.readouterr().err.splitlines()


def test_a_bad_start_method_is_one_line_naming_the_variable_value_and_choices(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLSTRUCT_START_METHOD", "Fork")
    code, lines = run_cli(["train", "a2c", "--n-processes", "1", "--max-env-steps", "64", "--logdir",
                           str(tmp_path / "run")], capsys)
    assert code == 2 and lines == ["rlstruct train a2c: error: RLSTRUCT_START_METHOD must be 'forkserver' or 'spawn' "
                                   "(how batcher workers start), got 'Fork'; unset it for the fork server where the "
                                   "platform has one"]
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_a_bad_learning_curve_switch_is_one_line_naming_the_variable_value_and_choices(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLSTRUCT_LEARNING_CURVE", "no")
    code, lines = run_cli(["train", "a2c", "--max-env-steps", "64", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 2 and lines == ["rlstruct train a2c: error: RLSTRUCT_LEARNING_CURVE must be 1 (draw "
                                   "learning_curve.png at a run's end) or 0 (do not), got 'no'; unset it for 1"]
    assert not (tmp_path / "run").exists()  # refused before the run folder was made, not at the run's end


def _central_directory(path: Path) -> int:
    """The offset of a zip file's first central directory record."""
    data = path.read_bytes()
    end = data.rfind(b"PK\x05\x06")
    return struct.unpack("<I", data[end + 16:end + 20])[0]


@pytest.mark.parametrize(("field", "offset", "bit", "error"), [
    ("compression method", 10, 0, "NotImplementedError: That compression method is not supported"),
    ("encryption flag", 8, 0, "RuntimeError: File "),
    ("version needed", 6, 7, "NotImplementedError: zip file version"),
])
def test_a_flipped_bit_in_the_zip_directory_is_a_damaged_checkpoint(tiny_cartpole_run, tmp_path, capsys, field,
                                                                    offset, bit, error):
    path = tmp_path / "checkpoint.pt"
    shutil.copy(tiny_cartpole_run / "checkpoint.pt", path)
    data = bytearray(path.read_bytes())
    data[_central_directory(path) + offset] ^= 1 << bit
    path.write_bytes(data)
    damaged = (f"is damaged: its zip directory cannot be read ({error}")
    with pytest.raises(CheckpointError, match=re.escape(f"run_or_checkpoint={str(path)!r} {damaged}")):
        load(path)
    code, lines = run_cli(["eval", str(path)], capsys)
    assert code == 2 and len(lines) == 1 and f"checkpoint={str(path)!r} {damaged}" in lines[0]
    assert lines[0].endswith("(the file changed on disk or in a copy after it was written); restore it from a copy, "
                             "or resume from another checkpoint")


def test_resuming_a_run_on_another_env_says_the_env_cannot_change(tiny_cartpole_run, tmp_path, capsys):
    code, lines = run_cli(["train", "a2c", "--resume", str(tiny_cartpole_run), "--env", "Acrobot-v1",
                           "--max-env-steps", "600", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 2 and lines == [
        f"rlstruct train a2c: error: a run's env cannot be changed at resume: resume={str(tiny_cartpole_run)!r} is a "
        "run on 'CartPole-v1', got env='Acrobot-v1'; drop --env to continue it on 'CartPole-v1', or start a new run "
        "on 'Acrobot-v1' without --resume"]
    assert not (tmp_path / "run").exists()


@pytest.fixture
def no_new_processes():
    """No process is left behind but the fork server and its resource tracker, which serve the next batcher."""

    def children():
        found = set()
        for p in psutil.Process().children(recursive=True):
            try:
                if not any(w in " ".join(p.cmdline()) for w in ("forkserver", "resource_tracker")):
                    found.add(p.pid)
            except psutil.Error:  # ended meanwhile
                pass
        return found

    before = children()
    yield
    assert children() <= before, f"processes left: {children() - before}"


#: a run of a few iterations, its envs stepped by a worker process
TINY = ["--env", "CartPole-v1", "--max-env-steps", "256", "--n-envs", "4", "--n-steps", "8", "--n-processes", "1",
        "--n-evaluation-envs", "2", "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard"]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "name", "fix"), [
    (errno.ENOSPC, "No space left on device (ENOSPC)", "free space on its disk"),
    (errno.EROFS, "Read-only file system (EROFS)", "the run folder became read-only: make it writable"),
])
def test_a_full_or_read_only_disk_during_the_run_is_one_line(tmp_path, monkeypatch, capsys, no_new_processes, code,
                                                             name, fix):
    logdir = tmp_path / "run"

    def refused(self):  # progress.csv's flush to the disk, at the first checkpoint
        raise OSError(code, os.strerror(code), str(self.path / "progress.csv"))

    monkeypatch.setattr(run_folder.RunFolder, "sync", refused)
    status, lines = run_cli(["train", "a2c", *TINY, "--logdir", str(logdir)], capsys)
    assert status == 1 and lines == [f"rlstruct train a2c: error: cannot write {str(logdir / 'progress.csv')!r}: "
                                     f"{name}; {fix}, then rlstruct train a2c --resume {logdir} continues the run "
                                     "from its last checkpoint"]


@pytest.mark.slow
def test_a_full_disk_at_the_checkpoint_names_the_run_folder(tmp_path, monkeypatch, capsys, no_new_processes):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    status, lines = run_cli(["train", "a2c", *TINY, "--logdir", str(tmp_path / "run")], capsys)
    assert status == 1 and lines == [f"rlstruct train a2c: error: cannot write into the run folder "
                                     f"{str(tmp_path / 'run')!r}: No space left on device (ENOSPC); free space on its "
                                     f"disk, then rlstruct train a2c --resume {tmp_path / 'run'} continues the run "
                                     "from its last checkpoint"]


@pytest.mark.slow
def test_a_run_folder_deleted_during_the_run_is_one_line(tmp_path, monkeypatch, capsys, no_new_processes):
    logdir = tmp_path / "run"
    save = log.Run.save_checkpoint

    def deleted_first(self, *args, **kwargs):  # someone removes the folder just before the checkpoint is written
        shutil.rmtree(self.logdir, ignore_errors=True)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(log.Run, "save_checkpoint", deleted_first)
    status, lines = run_cli(["train", "a2c", *TINY, "--logdir", str(logdir)], capsys)
    assert status == 1 and len(lines) == 1
    assert lines[0].startswith("rlstruct train a2c: error: cannot write ") and "Traceback" not in lines[0]
    assert lines[0].endswith(f": the run folder {str(logdir)!r} was deleted or moved during the run; move it back and "
                             f"rlstruct train a2c --resume {logdir} continues the run from its last checkpoint, or "
                             "start a new run")


@pytest.mark.slow
@pytest.mark.parametrize("reason", ["unable to write to file </torch_1_2>: No space left on device (28)",
                                    "unable to open shared memory object </torch_1_2> in read-write mode: Read-only "
                                    "file system (30)"])
def test_a_small_or_read_only_dev_shm_is_one_line(tmp_path, monkeypatch, capsys, no_new_processes, reason):
    def refused(self):
        raise RuntimeError(reason)

    monkeypatch.setattr(torch.Tensor, "share_memory_", refused)
    status, lines = run_cli(["train", "a2c", *TINY, "--logdir", str(tmp_path / "run")], capsys)
    assert status == 2 and len(lines) == 1, lines
    assert re.match(r"rlstruct train a2c: error: shared memory for the batcher's trajectory buffer \([\d.,]+ MB\) "
                    rf"cannot be made: {re.escape(reason)}; /dev/shm has [\d.,]+ MB free of [\d.,]+ MB\. Use fewer "
                    r"envs or steps per acquisition, no worker processes \(n_processes=0\), or a larger /dev/shm "
                    r"\(e\.g\. docker run --shm-size=8g\)$", lines[0]), lines[0]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_more_envs_than_memory_holds_is_refused_before_anything_is_allocated(tmp_path, monkeypatch, capsys, algo):
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 10**9)  # a 2 GB machine
    code, lines = run_cli(["train", algo, "--env", "CartPole-v1", "--n-envs", "100000000", "--logdir",
                           str(tmp_path / "run")], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(rf"rlstruct train {algo}: error: --n-envs 100000000 needs at least [\d.]+ GB of memory for one "
                        r"collection \(\d+ bytes per env\), this machine has 2\.0 GB available; pass a smaller "
                        r"--n-envs \(at most \d+ fits\)( or --n-steps| or --rollout-steps)?", lines[0]), lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("frameskip", ['"x"', "0", "2.5", "true"])
def test_a_bad_frameskip_names_the_field_instead_of_an_invalid_literal(tmp_path, capsys, frameskip):
    pytest.importorskip("ale_py", reason="needs the atari extra")
    code, lines = run_cli(["train", "a2c", "--env", "ALE/Pong-v5", "--env-kwargs", f'{{"frameskip": {frameskip}}}',
                           "--max-env-steps", "64", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rlstruct train a2c: error: env_kwargs['frameskip'] must be an int >= 1 (emulator "
                               "frames per agent step), got ") and "invalid literal" not in lines[0]
    assert not (tmp_path / "run").exists()
