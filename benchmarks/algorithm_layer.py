"""How large and how tangled the algorithm layer is: the figures of docs/benchmarks/algorithm-layer.md.

Prints, as one JSON object:

* ``ppo_iteration_files``: the project's files whose code runs during one PPO iteration (from the top of the loop's
  second iteration to the top of its third), traced with ``sys.settrace`` in a fresh process (``rlstruct train ppo``
  in process, CartPole, 8 envs);
* ``train_files``: the project's files whose code runs during the whole ``rlstruct train ppo`` command;
* ``largest_algos_module``: the longest module of ``algos/`` and its lines;
* ``sibling_imports``: for each algorithm, the names it imports from the other ``rlstruct.algos`` modules;
* ``import_ppo``: how many ``rlstruct`` modules ``import rlstruct.algos.ppo`` loads, and the seconds it takes
  (median of 5 fresh processes);
* ``help_chars``: the characters of ``rlstruct train ppo --help`` (and its flag count).

Usage: ``python benchmarks/algorithm_layer.py`` (from the repository root).
"""

from __future__ import annotations

import ast
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ("a2c", "ppo", "reinforce", "dqn", "sac")

_TRACE = r"""
import sys, threading
from pathlib import Path
root = Path(sys.argv[1]).resolve()
files, iteration_files, state = set(), set(), {"marks": 0}
# The run's record: its budget check opens every iteration.
from rlstruct.algos._train.log import Run
record = Run.should_stop

def should_stop(self):
    state["marks"] += 1
    return record(self)

Run.should_stop = should_stop

def tracer(frame, event, arg):
    path = frame.f_code.co_filename
    try:
        rel = Path(path).resolve().relative_to(root)
    except ValueError:
        return None
    if path.startswith("<") or rel.parts[0] in (".venv", "benchmarks"):
        return None
    files.add(str(rel))
    if state["marks"] == 2:
        iteration_files.add(str(rel))
    return None

sys.settrace(tracer)
threading.settrace(tracer)
from rlstruct.algos.cli import main
main(["train", "ppo", "--n-envs", "8", "--n-steps", "32", "--max-env-steps", "1024", "--no-progress",
      "--no-tensorboard", "--seed", "0", "--logdir", sys.argv[2], "--eval-every", "2", "--n-evaluation-envs", "2",
      "--time-limit", "3600"])
sys.settrace(None)
print("TRACE" + __import__("json").dumps({"iteration": sorted(iteration_files), "all": sorted(files)}))
"""

_IMPORT = r"""
import sys, time
t = time.perf_counter()
import rlstruct.algos.ppo
dt = time.perf_counter() - t
print("IMPORT", dt, sorted(m for m in sys.modules if m == "rlstruct" or m.startswith("rlstruct.")))
"""


def trace_ppo(tmp: str) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", _TRACE, str(ROOT), tmp], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    return json.loads(out.split("TRACE", 1)[1])


def sibling_imports() -> dict[str, list[str]]:
    out = {}
    for algo in ALGORITHMS:
        tree = ast.parse((ROOT / "algos" / f"{algo}.py").read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlstruct.algos."):
                if node.module != f"rlstruct.algos.{algo}":
                    names.update(f"{node.module.rsplit('.', 1)[1]}.{a.name}" for a in node.names)
        out[algo] = sorted(names)
    return out


def import_ppo() -> dict[str, object]:
    times, modules = [], []
    for _ in range(5):
        line = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split("IMPORT", 1)[1].split(" ", 2)
        times.append(float(line[1]))
        modules = ast.literal_eval(line[2].strip())
    return {"modules": len(modules), "seconds_median": round(statistics.median(times), 3),
            "seconds_range": [round(min(times), 3), round(max(times), 3)], "names": modules}


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        traced = trace_ppo(tmp)
    lines = {str(p.relative_to(ROOT / "algos")): len(p.read_text().splitlines())
             for p in (ROOT / "algos").rglob("*.py")}
    largest = max(lines, key=lines.get)
    help_text = subprocess.run([sys.executable, "-m", "rlstruct.algos.cli", "train", "ppo", "--help"],
                               capture_output=True, text=True, check=True, cwd=ROOT).stdout
    report = {
        "ppo_iteration_files": {"count": len(traced["iteration"]), "files": traced["iteration"]},
        "train_files": {"count": len(traced["all"])},
        "largest_algos_module": {"file": f"algos/{largest}", "lines": lines[largest]},
        "algos_lines": dict(sorted(lines.items())),
        "sibling_imports": {k: {"count": len(v), "names": v} for k, v in sibling_imports().items()},
        "import_ppo": import_ppo(),
        "help_chars": len(help_text),
        "help_flags": help_text.count("\n  --"),
        "help_longest_entry_lines": _longest_entry(help_text),
    }
    print(json.dumps(report, indent=1))
    return 0


def _longest_entry(help_text: str) -> int:
    """The lines of the longest flag entry of an argparse help text."""
    longest, current = 0, 0
    for line in help_text.splitlines():
        if line.startswith("  -"):
            current = 1
        elif line.startswith("   ") and current:
            current += 1
        else:
            current = 0
        longest = max(longest, current)
    return longest


if __name__ == "__main__":
    raise SystemExit(main())
