"""Code defined in a ``__main__`` without a file (a notebook cell, ``python -``, ``python -c``) reaches worker
processes by value, with every start method the batchers use; the guard rule is named only for a script run as a
file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlstruct._main_module import _names_main, by_value_where_needed

ROOT = Path(__file__).resolve().parents[2]


def _ten_lines_with_workers() -> str:
    """The README's "Ten lines", with two worker processes instead of the calling process."""
    section = (ROOT / "README.md").read_text().split("## Ten lines\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert "n_processes=0, seeds=[0]" in code, code
    return code.replace("n_processes=0, seeds=[0]", "n_processes=2, seeds=[0, 1]")


def _run(args: list[str], tmp_path: Path, method: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # From an empty folder: nothing the workers could import the code from.
    env = {**os.environ, "RLSTRUCT_START_METHOD": method}
    return subprocess.run([sys.executable, *args], input=stdin, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)


def _mean_returns(result: subprocess.CompletedProcess) -> list[float]:
    """The mean returns the script printed, one ``tensor(x)`` line per batcher."""
    assert result.returncode == 0, result.stderr[-3000:]
    printed = re.findall(r"^tensor\(([\d.]+)\)$", result.stdout, flags=re.M)
    assert printed and len(printed) == len(result.stdout.splitlines()), result.stdout
    return [float(p) for p in printed]


# A lambda as create_env, and instances of a class and of a network defined in the cell in agent_args: all by value,
# while the importable env class goes by reference.
_CELL = textwrap.dedent("""
    import torch
    from rlstruct import DictTensor, RL_Agent, RL_Batcher
    from rlstruct.envs import CartPole

    class Always:
        def __init__(self, action):
            self.action = action

    class Push(torch.nn.Module):  # a network defined in the cell, its instance in agent_args
        def forward(self, frame):
            return torch.ones(frame.shape[0], dtype=torch.long)

    class Fixed(RL_Agent):
        def __init__(self, choice, net):
            self.choice, self.net = choice, net

        def __call__(self, state, observation, agent_info, history=None):
            action = self.net(observation["frame"]) * self.choice.action
            return DictTensor({"action": action}), state

    with RL_Batcher(n_timesteps=500, create_agent=Fixed, agent_args={"choice": Always(1), "net": Push()},
                    create_env=lambda **kw: CartPole(**kw), env_args={"n_envs": 4}, n_processes=1,
                    seeds=[0]) as batcher:
        batcher.reset(); batcher.execute()
        print(batcher.get()[0].trajectories.lengths.float().mean())
""")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method, args", [("forkserver", ["-"]), ("spawn", ["-c"])],
                         ids=["stdin-forkserver", "c-spawn"])
def test_the_ten_lines_and_a_cells_lambdas_and_objects_reach_two_workers_without_a_file(method, args, tmp_path):
    """One interpreter a start method runs the README's ten lines, then a cell whose lambda and argument objects
    must travel by value (each batcher's workers start afresh: the second batcher depends on nothing the first left),
    so that each method's interpreter and fork server start once for both claims. The two file-less ``__main__``
    kinds take one start method each: stdin (whose ``__file__`` is ``'<stdin>'``, hidden while a child starts) the
    fork server, whose start and each child's start both write multiprocessing's preparation data, the function that
    spawn's children's start writes it with too; ``python -c`` (no ``__file__`` to hide) spawn, whose children are
    fresh interpreters. The cell's batcher has one worker: the ten lines prove two."""
    code = _ten_lines_with_workers() + _CELL
    ten_lines, cell = _mean_returns(_run([*args, code] if args == ["-c"] else args, tmp_path, method,
                                         stdin=None if args == ["-c"] else code))
    assert 10 < ten_lines < 40
    assert 5 < cell < 15  # always pushing right keeps the pole up for about 9 steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_dying_at_its_start_under_stdin_does_not_name_the_guard(tmp_path):
    # The cell's object fails while the worker unpickles its arguments, before it can report: the error says its
    # stderr tells why, and not to guard a script that has no file.
    code = textwrap.dedent("""
        from rlstruct import RL_Batcher
        from rlstruct.envs import CartPole
        from rlstruct.errors import BatcherWorkerError
        from tests.fakes import ConstantAgent

        class Boom:
            def __init__(self):
                self.state = 1

            def __setstate__(self, state):
                raise RuntimeError("unpickled in the worker")

        try:
            RL_Batcher(4, ConstantAgent, {}, CartPole, {"n_envs": 2, "boom": Boom()}, 1, [0])
        except BatcherWorkerError as e:
            print(e)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-"], input=code, cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exited with code 1 without answering" in result.stdout, result.stdout
    assert "its stderr says why" in result.stdout and "__name__" not in result.stdout
    assert "unpickled in the worker" in result.stderr


def test_importable_objects_stay_by_reference():
    # Whatever __main__ is (pytest's own module, or an xdist worker's `python -c`), what it does not define travels
    # by reference.
    assert by_value_where_needed(len) is len
    assert not _names_main({"n_envs": 2, "f": os.path.join})
    assert _names_main(type("Cell", (), {"__module__": "__main__"}))
