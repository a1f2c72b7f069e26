"""Faults a cluster user meets, each one line (a typed error; from the command line one stderr line, a nonzero exit
status and no traceback) that names what failed and the fix: a bad ``RLSTRUCT_START_METHOD``, a checkpoint whose
zip directory was damaged, a resumed run given another env, a full or read-only disk, a ``/dev/shm`` too small for
the batchers' shared memory, and more envs than memory holds."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest

from rlstruct.algos import load
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
