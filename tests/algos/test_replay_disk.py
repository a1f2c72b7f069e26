"""A disk-backed replay buffer (``storage="disk"``, ``--replay-storage disk``): its space checked at setup and
reserved when its files are made, a full disk a clear error, and the files of a killed run reclaimed."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections import namedtuple

import pytest
import torch

from rlstruct._processes import pid_namespace, process_identity, process_start
from rlstruct.algos import EnvSpec, _replay_storage
from rlstruct.algos._replay_storage import OWNER_FILE
from rlstruct.algos.replay import ReplayBuffer
from rlstruct.errors import ConfigError, DiskSpaceError

ATARI = EnvSpec((4, 84, 84), "uint8", 4, 1000)  # stacked frames: about 8 kB per transition on disk


def _bin_files(folder):
    return sorted(p.name for p in folder.glob("*.bin"))


def test_a_buffer_the_disk_cannot_hold_is_refused_at_setup_in_one_line(tmp_path, monkeypatch):
    from rlstruct.algos.dqn import DQNConfig, train

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(_replay_storage.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 10**6, 10**6))
    config = DQNConfig(env="CartPole-v1", buffer_size=100_000, replay_storage="disk", logdir=str(tmp_path / "run"),
                       progress=False, tensorboard=False, max_env_steps=256, learning_starts=64, preset="none")
    with pytest.raises(DiskSpaceError, match=r"^--buffer-size 100000 with --replay-storage disk needs [0-9.]+ GB of "
                                             r"disk for the replay buffer's files \(\d+ bytes per transition x 100000 "
                                             r"transitions, \d+ bytes\), the disk of '.*replay' has 0\.0 GB free "
                                             r"\(1000000 bytes\); pass a smaller --buffer-size \(at most \d+ fits\), "
                                             r"free disk space, or a --logdir on a larger disk$"):
        train(config)
    assert not (tmp_path / "run" / "replay").exists()  # refused before any file was made
    assert issubclass(DiskSpaceError, ConfigError)  # the command line's one line and exit status 2


def test_the_files_blocks_are_reserved_when_made(tmp_path):
    buf = ReplayBuffer.for_spec(ATARI, 256, "cpu", storage="disk", folder=tmp_path / "replay")
    for path in (tmp_path / "replay").glob("*.bin"):  # not sparse: a page write cannot find the disk full (SIGBUS)
        assert path.stat().st_blocks * 512 >= path.stat().st_size > 0
    assert buf.nbytes() > ReplayBuffer.planned_disk_nbytes(ATARI, 256) > 0
    buf.close()


def test_a_full_disk_when_a_file_is_made_is_a_clear_error(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_replay_storage.os, "posix_fallocate", full)
    with pytest.raises(DiskSpaceError, match=r"^the replay buffer needs [0-9.]+ GB more on disk for .*frame-numbers"
                                             r"-0\.bin \(\d+ bytes\), the disk has [0-9.]+ GB free; free disk space, "
                                             r"pass a smaller --buffer-size, or --replay-storage memory$"):
        ReplayBuffer.for_spec(ATARI, 256, "cpu", storage="disk", folder=tmp_path / "replay")
    assert _bin_files(tmp_path / "replay") == []


def test_a_file_system_without_fallocate_gets_its_blocks_by_writing_zeros(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(_replay_storage.os, "posix_fallocate", unsupported)
    buf = ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=tmp_path / "replay")
    assert int(buf.store.frames.sum()) == 0
    for path in (tmp_path / "replay").glob("*.bin"):
        assert path.stat().st_blocks * 512 >= path.stat().st_size > 0
    buf.close()


_OWNER = """
import sys, time
from rlstruct.algos import EnvSpec
from rlstruct.algos.replay import ReplayBuffer
buf = ReplayBuffer.for_spec(EnvSpec((4, 84, 84), "uint8", 4, 1000), 256, "cpu", storage="disk", folder=sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""


def _killed_owner(folder):
    """Makes a disk-backed buffer in ``folder`` in a process of its own, then kills that process (SIGKILL)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OWNER), str(folder)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
    assert _bin_files(folder)  # nothing removed them


@pytest.mark.slow  # 2.6 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("where", ["same-folder", "rerun-beside-it"])
def test_the_files_of_a_killed_run_are_reclaimed_by_the_next_buffer(tmp_path, caplog, where):
    killed = tmp_path / "runs" / "dqn-0" / "replay"
    _killed_owner(killed)
    caplog.set_level(logging.INFO, logger="rlstruct.algos._replay_storage")
    folder = killed if where == "same-folder" else tmp_path / "runs" / "dqn-0-2" / "replay"
    buf = ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=folder)
    [line] = [r.getMessage() for r in caplog.records if "reclaimed" in r.getMessage()]
    assert line.startswith("reclaimed ") and str(killed) in line
    if where == "rerun-beside-it":
        assert _bin_files(killed) == [] and not (killed / OWNER_FILE).exists()
    assert json.loads((folder / OWNER_FILE).read_text())["pid"] == os.getpid()
    buf.close()
    assert _bin_files(folder) == [] and not (folder / OWNER_FILE).exists()


def test_a_folder_a_running_process_owns_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "replay"
    folder.mkdir()
    (folder / "frames-0.bin").write_bytes(b"\0" * 64)
    parent = os.getppid()  # a process that runs for as long as this one
    owner = {"host": os.uname().nodename, "pid": parent, "start": process_start(parent)}
    (folder / OWNER_FILE).write_text(json.dumps(owner))
    with pytest.raises(ConfigError, match=rf"^replay folder '.*replay' holds the replay files of process {parent}, "
                                          r"which is running; give this buffer another folder \(another --logdir\), "
                                          r"or stop that process$"):
        ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=folder)
    assert _bin_files(folder) == ["frames-0.bin"]


def test_a_full_disk_when_the_buffer_grows_during_the_run_is_the_same_clear_error(tmp_path, monkeypatch):
    import torch

    buf = ReplayBuffer(8, 3, "cpu", obs_capacity=4, storage="disk", folder=tmp_path / "replay")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_replay_storage.os, "posix_fallocate", full)
    with pytest.raises(DiskSpaceError, match=r"^the replay buffer needs .* more on disk for .*observations-1\.bin"):
        for _ in range(4):  # 2 observations per transition: the ring of 4 must grow to keep them
            buf.push(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.zeros(2, 3),
                     torch.ones(2))
    buf.close()
    assert _bin_files(tmp_path / "replay") == []


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_a_large_buffer_says_its_size_and_where_before_it_is_allocated(tmp_path, monkeypatch, caplog, storage):
    from rlstruct.algos._train import replay_setup
    from rlstruct.algos._train.config import OffPolicyConfig

    spec = EnvSpec((4, 84, 84), "uint8", 4, 1000)
    config = OffPolicyConfig(buffer_size=100_000, replay_storage=storage)
    made = []
    monkeypatch.setattr(ReplayBuffer, "for_spec", classmethod(lambda cls, *a, **kw: made.append(a) or "buffer"))
    with caplog.at_level(logging.INFO, logger="rlstruct.algos"):
        replay_setup.make_replay_buffer(config, spec, torch.device("cpu"), seed=0, folder=tmp_path)
        assert caplog.records == [] and len(made) == 1  # under 1 GB: nothing to say
        monkeypatch.setattr(replay_setup, "LARGE_BUFFER_BYTES", 10**6)
        replay_setup.make_replay_buffer(config, spec, torch.device("cpu"), seed=0, folder=tmp_path)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING  # the command line shows warnings
    where = (r"0\.0 GB of CPU memory and 0\.[1-9] GB of disk in '.*replay'" if storage == "disk"
             else r"0\.[1-9] GB of CPU memory")
    assert re.fullmatch(rf"the replay buffer of --buffer-size 100000 takes {where} once full \(\d+ bytes per "
                        r"transition\)", record.getMessage()), record.getMessage()


def test_the_files_of_a_container_beside_this_one_are_not_reclaimed(tmp_path, caplog):
    # Same hostname, another PID namespace: its pid means nothing here, so its files stay.
    other = tmp_path / "runs" / "dqn-0" / "replay"
    other.mkdir(parents=True)
    (other / "frames-0.bin").write_bytes(b"\0" * 64)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = {**process_identity(), "pid_ns": (pid_namespace() or 0) + 1, "pid": dead.pid, "start": 1}
    (other / OWNER_FILE).write_text(json.dumps(owner))
    buf = ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=tmp_path / "runs" / "dqn-0-2" / "replay")
    buf.close()
    assert _bin_files(other) == ["frames-0.bin"] and not [r for r in caplog.records if "reclaimed" in r.getMessage()]
    with pytest.raises(ConfigError, match=f"holds the replay files of process {dead.pid}, which is running"):
        ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=other)
    owner["pid_ns"] = pid_namespace()  # the same namespace: provably dead, reclaimed
    (other / OWNER_FILE).write_text(json.dumps(owner))
    ReplayBuffer.for_spec(ATARI, 64, "cpu", storage="disk", folder=other).close()
    assert _bin_files(other) == []
