"""benchmarks/multinode.py at its smallest budget: two torchrun launchers of one rank each, and a Ray cluster of two
nodes with an actor on each, run what one process runs, and both nodes (both ranks) take part; nothing is left
running."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _multinode(tmp_path: Path, part: str) -> dict:
    """``python benchmarks/multinode.py --parts PART`` at one iteration of the torchrun half (128 env steps); its
    JSON."""
    out = subprocess.run([sys.executable, "benchmarks/multinode.py", "--parts", part, "--budget", "128", "--timeout",
                          "240", "--json", str(tmp_path / "result.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=560)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())[part]


@pytest.mark.long(reason="two torchrun launchers and their ranks beside one process of two workers, each process "
                         "importing torch: 32 CPU s on the 2-vCPU VM, loaded")
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the script reads the process tree from /proc (Linux)")
@pytest.mark.timeout(600)
def test_two_torchrun_nodes_of_one_rank_end_with_one_process_parameters(tmp_path):
    half = _multinode(tmp_path, "torchrun")
    assert half["same_run"] and half["distributed"], half
    assert half["ranks"] == {"node-a": [0], "node-b": [1]} or half["ranks"] == {"node-a": [1], "node-b": [0]}
    assert half["largest_difference"] < 1e-5 and half["killed_after"] == []


@pytest.mark.long(reason="two Ray nodes started and drained, a run on them and one beside them, each process "
                         "importing torch: 28 CPU s counted on the 2-vCPU VM, loaded, beside the nodes' own")
@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the script reads the process tree from /proc (Linux)")
@pytest.mark.timeout(600)
def test_two_ray_nodes_of_one_actor_write_the_progress_of_one_process(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed")
    half = _multinode(tmp_path, "ray")
    assert half["same_run"] and half["distributed"], half
    assert [len(node["actor_pids"]) for node in half["nodes"].values()] == [1, 1]
    assert len({node["node_id"] for node in half["nodes"].values()}) == 2
    assert half["left_running"] == [] and half["killed_after"] == []
