"""Atari from the command line: PPO and DQN on Breakout's frames with the Nature-DQN CNN (skipped without ale-py).

``backend="ale"`` gives ale-py's preprocessed frames (``uint8 [4, 84, 84]``: 84x84 grayscale, 4 stacked); the
gymnasium backend's ``ALE/`` ids give gymnasium's raw RGB frames (``uint8 [210, 160, 3]``, channel-last), which the
CNN permutes. A few hundred steps each: the pipeline runs, checkpoints, and ``rlstruct eval`` reloads it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("ale_py")

from rlstruct.algos.run import describe_env  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SMALL = ["--n-envs", "4", "--n-evaluation-envs", "1", "--max-episode-steps", "100", "--no-progress",
         "--no-tensorboard"]


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "rlstruct.algos.cli", *args], capture_output=True, text=True,
                         timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("algo", "backend", "flags"), [
    # The default backend ("auto") picks ale-py's vector env for ALE/ ids: `rlstruct train ppo --env ALE/...`.
    ("ppo", "auto", ["--n-steps", "32", "--max-env-steps", "256"]),
    ("dqn", "ale", ["--max-env-steps", "320", "--learning-starts", "128", "--buffer-size", "1000",
                    "--batch-size", "16", "--gradient-steps", "2"]),
    ("a2c", "gymnasium", ["--max-env-steps", "128"]),
])
def test_breakout_trains_from_frames_checkpoints_and_evaluates(algo, backend, flags, tmp_path):
    spec = describe_env("ALE/Breakout-v5", backend, 100)
    assert spec.pixels and spec.obs_dtype == "uint8"
    assert spec.obs_shape == ((210, 160, 3) if backend == "gymnasium" else (4, 84, 84))
    backend_flag = [] if backend == "auto" else ["--backend", backend]
    summary = _cli("train", algo, "--env", "ALE/Breakout-v5", *backend_flag, "--logdir", str(tmp_path), *SMALL, *flags)
    assert summary["env_steps"] >= int(flags[flags.index("--max-env-steps") + 1])
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert any(k.startswith("encoder.convs") for k in ckpt["model"])
    assert ckpt["model"]["encoder.convs.0.weight"].shape[-2:] == (8, 8)  # Nature-DQN's first conv
    result = _cli("eval", str(tmp_path / "checkpoint.pt"), "--episodes", "1")
    assert result["algo"] == algo and result["episodes"] == 1
