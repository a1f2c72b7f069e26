"""benchmarks/multinode.py at its smallest budget: two torchrun launchers of one rank each, and a Ray cluster of two
nodes with an actor on each, run what one process runs, and both nodes (both ranks) take part; nothing is left
running."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ForkedCommand
from tests.project.forked_runs import forkable


class _ForkedRun:
    """What benchmarks/multinode.py uses of the ``subprocess.Popen`` of its one-process run (``rlstruct train ...``
    without Ray), run in a child forked from this process and started as a fresh one (``tests.helpers
    .ForkedCommand``: a process group of its own, which the script ends as it ends a command's) in ``cwd`` with the
    environment ``env``; its output copied into ``log`` once it ended."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str], log: Path):
        def seam() -> None:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)

        self.args, self.log = cmd, log
        self._run = ForkedCommand(cmd[1:], log.with_suffix(""), seam=seam)
        self.pid = self._run.pid

    @property
    def returncode(self) -> int | None:
        return self._run.returncode

    def poll(self) -> int | None:
        if self._run.returncode is None and self._run.poll() is not None:
            self.log.write_text(self._run.stdout + self._run.stderr)
        return self._run.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self._run.returncode


def _multinode(tmp_path: Path, part: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict:
    """``python benchmarks/multinode.py --parts PART`` at one iteration of the torchrun half (128 env steps); its
    JSON. The script's own process is this one (its ``main``, its SIGTERM handler restored after): it only starts the
    nodes and the runs, each a process of its own as before, and reads their records; a fresh one would import torch
    again to compare two checkpoints (2-3 CPU s). The run in one process that each half compares with is forked from
    this one (:class:`_ForkedRun`) where a fork starts as a fresh interpreter would, its worker processes its own;
    every node, launcher, rank and run on the nodes is still a fresh process that the script starts."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts its folder first, for its own imports
    from benchmarks import multinode

    if forkable():
        started = multinode.launch

        def launch(cmd: list[str], cwd: Path, env: dict[str, str], log: Path):
            if cmd[0] != "rlstruct" or "--ray-actors" in cmd:
                return started(cmd, cwd, env, log)
            return _ForkedRun(cmd, cwd, env, log)

        monkeypatch.setattr(multinode, "launch", launch)

    out = tmp_path / "result.json"
    monkeypatch.setattr(sys, "argv", ["benchmarks/multinode.py", "--parts", part, "--budget", "128", "--timeout",
                                      "240", "--json", str(out)])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        multinode.main()
    except SystemExit as e:
        printed = capsys.readouterr()
        pytest.fail(f"multinode.py exited with {e.code}:\n{printed.out[-3000:]}{printed.err[-3000:]}")
    finally:
        signal.signal(signal.SIGTERM, handler)
    return json.loads(out.read_text())[part]


@pytest.mark.long(reason="two torchrun launchers and their ranks beside one process of two workers, each process "
                         "but the forked one importing torch: 22-27 CPU s on the 2-vCPU VM, loaded")
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the script reads the process tree from /proc (Linux)")
@pytest.mark.timeout(600)
def test_two_torchrun_nodes_of_one_rank_end_with_one_process_parameters(tmp_path, monkeypatch, capsys):
    half = _multinode(tmp_path, "torchrun", monkeypatch, capsys)
    assert half["same_run"] and half["distributed"], half
    assert half["ranks"] == {"node-a": [0], "node-b": [1]} or half["ranks"] == {"node-a": [1], "node-b": [0]}
    assert half["largest_difference"] < 1e-5 and half["killed_after"] == []


@pytest.mark.long(reason="two Ray nodes started and drained, a run on them and one beside them, each process "
                         "importing torch: 28 CPU s counted on the 2-vCPU VM, loaded, beside the nodes' own")
@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the script reads the process tree from /proc (Linux)")
@pytest.mark.timeout(600)
def test_two_ray_nodes_of_one_actor_write_the_progress_of_one_process(tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed")
    half = _multinode(tmp_path, "ray", monkeypatch, capsys)
    assert half["same_run"] and half["distributed"], half
    assert [len(node["actor_pids"]) for node in half["nodes"].values()] == [1, 1]
    assert len({node["node_id"] for node in half["nodes"].values()}) == 2
    assert half["left_running"] == [] and half["killed_after"] == []
