"""An algorithm defined in a notebook cell (here fed to ``python -``, which has no file either) trains with worker
processes: its own agent factory reaches the training and evaluation workers by value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELL_TAIL = """
import dataclasses
import functools

from rlstruct.algos.policies import create_policy_agent


def cell_agent(config):  # the cell's own agent factory: no worker could import it by reference
    return functools.partial(create_policy_agent)


ALGORITHM = OnPolicyAlgorithm(name="cella2c", title="CellA2C", config_cls=A2CConfig, description="A2C from a cell",
                              model=dataclasses.replace(ACTOR_CRITIC, agent=cell_agent), make_learn=learn_step)
result = trainer(ALGORITHM)(A2CConfig(n_processes=1, n_envs=4, n_evaluation_processes=1, max_env_steps=256,
                                      progress=False, tensorboard=False, logdir={logdir!r}))
print("env steps", result.env_steps)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_algorithm_defined_in_a_cell_trains_with_worker_processes(tmp_path):
    """A fresh interpreter, since the cell's ``__main__`` is the thing tested; one training worker and one evaluation
    worker are each a process the factory must reach by value, and a few iterations show both ran."""
    source = (ROOT / "algos" / "a2c.py").read_text()
    cell = source[:source.index('if __name__ == "__main__":')] + CELL_TAIL.format(logdir=str(tmp_path / "run"))
    result = subprocess.run([sys.executable, "-"], input=cell, cwd=tmp_path, capture_output=True, text=True,
                            timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "env steps 256"
