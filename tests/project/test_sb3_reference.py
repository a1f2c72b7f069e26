"""benchmarks/sb3_reference.py at a tiny budget: rl-baselines3-zoo's HalfCheetah entry (the reference beside
``ppo-halfcheetah-zoo``) trains through VecNormalize and reports its evaluation as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sb3_reference.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_zoos_halfcheetah_settings_train_and_evaluate_at_the_budget(tmp_path):
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is not installed (the test extra has it)")
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--algo", "ppo", "--env", "HalfCheetah-v4",
                           "--max-env-steps", "1024", "--eval-every", "1024", "--eval-episodes", "1", "--seeds", "3",
                           "--json", str(out)], capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())
    assert run["seed"] == 3 and run["env_steps"] == 1024 and run["last_eval_env_steps"] == 1024
    assert isinstance(run["last_eval_return"], float)
