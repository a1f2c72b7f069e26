"""A run's folder as a durable record: ``progress.csv`` grows by appends and is rewritten only through a file swapped
in whole, a checkpoint carries a digest of its content that every load checks, ``--resume`` of a finished run changes
nothing, and a start refused before training leaves no folder claimed.

Each fault is injected at a chosen moment (a kill inside the rewrite, a byte flipped in the checkpoint's weights),
never by timing.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import zipfile

import pytest
import torch

from rlstruct.algos import a2c, cli, load
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, content_digest, load_checkpoint
from rlstruct.algos._train.log import Run
from rlstruct.algos.cli import evaluate_checkpoint
from rlstruct.errors import CheckpointError

pytestmark = pytest.mark.timeout(120)

CONFIG = a2c.A2CConfig(n_envs=4, n_steps=8, hidden_sizes=(8,), progress=False, tensorboard=False,
                       n_evaluation_envs=2, eval_every=3, max_episode_steps=50, log_every=1,
                       stop_at_reward_threshold=False, time_limit=100.0, preset="none", max_env_steps=32 * 4)


def csv_rows(logdir) -> list[dict]:
    with open(os.path.join(logdir, Run.CSV_NAME), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished a2c run's folder (4 iterations)."""
    logdir = tmp_path_factory.mktemp("a2c") / "run"
    a2c.train(dataclasses.replace(CONFIG, logdir=str(logdir)))
    return logdir


def flip_a_weight_byte(checkpoint) -> None:
    """Flips one byte in the middle of the checkpoint's largest tensor (the zip stores it uncompressed)."""
    with zipfile.ZipFile(checkpoint) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
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
    damaged.mkdir()
    path = damaged / CHECKPOINT_NAME
    path.write_bytes((trained / CHECKPOINT_NAME).read_bytes())
    for name in (Run.CSV_NAME, Run.SUMMARY_NAME, Run.CONFIG_NAME):
        (damaged / name).write_bytes((trained / name).read_bytes())
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


def test_a_checkpoint_written_before_digests_still_loads(trained, tmp_path):
    data = torch.load(trained / CHECKPOINT_NAME, weights_only=True)
    del data["digest"]
    torch.save(data, tmp_path / CHECKPOINT_NAME)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["iteration"] == data["iteration"]
    assert json.loads((trained / Run.SUMMARY_NAME).read_text())["iterations"] == data["iteration"]
