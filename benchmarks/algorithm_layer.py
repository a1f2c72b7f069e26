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
* ``help_chars``: the characters of ``rlstruct train ppo --help`` (and its flag count);
* ``public_algos``: the public modules of ``algos/`` (no part of the path starting with ``_``, the package's
  ``__init__`` aside), the names in their ``__all__`` together, and the names in ``rlstruct.algos``' own;
* ``module_sizes``: the largest module of each of ``rlstruct/``, ``agents/``, ``batchers/``, ``algos/``, and the
  modules there over 600 and over 400 lines;
* ``algorithm_registries``: the places of the library that list the algorithms (a literal naming three or more of
  them, a docstring aside) or switch on one's name (a comparison with one's name), one per file and kind;
* ``duplicates``: the rows of ``duplicates --most 200 --repo .`` (the whole tree, and those with both sides in the
  four library folders), when that command is on ``PATH``.

Usage: ``python benchmarks/algorithm_layer.py`` (from the repository root). ``--static DIR`` prints the last four
figures alone for the tree at ``DIR`` (any checkout, e.g. ``git archive REV | tar -x -C DIR``) without running its code.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the library's folders, each a package of ``rlstruct``
LIBRARY = ("rlstruct", "agents", "batchers", "algos")
#: the algorithms of a tree without a registry (``algos/_train/registry.py``)
FIVE = ("reinforce", "a2c", "dqn", "ppo", "sac")

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
from rlstruct.algos._train.cli import main
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


def algorithms(root: Path) -> tuple[str, ...]:
    """The algorithms of the tree at ``root``: its registry's keys, or the five of a tree without one."""
    registry = root / "algos" / "_train" / "registry.py"
    if not registry.is_file():
        return FIVE
    for node in ast.walk(ast.parse(registry.read_text())):
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            return tuple(k.value for k in node.value.keys)
    raise ValueError(f"no ALGORITHMS dict in {registry}")


def sibling_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """For each algorithm, ``module.name`` of what it imports from the other ``rlstruct.algos`` modules (the module
    named from ``rlstruct.algos.`` on, e.g. ``_train.loops.train_on_policy``)."""
    out = {}
    for algo in algorithms(root):
        tree = ast.parse((root / "algos" / f"{algo}.py").read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlstruct.algos."):
                if node.module != f"rlstruct.algos.{algo}":
                    module = node.module.removeprefix("rlstruct.algos.")
                    names.update(f"{module}.{a.name}" for a in node.names)
        out[algo] = sorted(names)
    return out


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _all_names(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module, or None where it is built at run time (or absent)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def public_algos(root: Path) -> dict[str, object]:
    """The public modules of ``algos/`` and the names in their ``__all__``, and ``rlstruct.algos``' own names."""
    modules = sorted(p.relative_to(root / "algos") for p in (root / "algos").rglob("*.py"))
    public = [p for p in modules if p.name != "__init__.py" and not any(part.startswith("_") for part in p.parts)]
    names = {str(p): _all_names(root / "algos" / p) or [] for p in public}
    own = _all_names(root / "algos" / "__init__.py")
    if own is None and root == ROOT:  # built from the registry: read it from the package
        own = list(__import__("rlstruct.algos", fromlist=["__all__"]).__all__)
    return {"modules": len(public), "lines": sum(_lines(root / "algos" / p) for p in public),
            "all_names": sum(map(len, names.values())), "per_module": {k: len(v) for k, v in names.items()},
            "package_names": len(own or []), "package_all": own,
            "private_modules": [str(p) for p in modules if p not in public and p.name != "__init__.py"]}


def module_sizes(root: Path) -> dict[str, object]:
    """The largest module of each library folder, and the modules there over 600 and over 400 lines."""
    lines = {str(p.relative_to(root)): _lines(p) for folder in LIBRARY for p in (root / folder).rglob("*.py")}
    largest = {}
    for folder in LIBRARY:
        inside = {k: v for k, v in lines.items() if k.startswith(folder + "/")}
        name = max(inside, key=inside.get)
        largest[folder] = {"file": name, "lines": inside[name]}
    by_size = sorted(lines.items(), key=lambda kv: -kv[1])
    return {"largest": largest, "over_600": dict(kv for kv in by_size if kv[1] > 600),
            "over_400": dict(kv for kv in by_size if kv[1] > 400)}


def algorithm_registries(root: Path) -> list[str]:
    """``file: kind`` of each place of the library that lists the algorithms or switches on one's name."""
    names = set(algorithms(root))
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    places = set()
    for folder in LIBRARY:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
            rel = str(path.relative_to(root))
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    sides = [node.left, *node.comparators]
                    if any(isinstance(s, ast.Constant) and s.value in names for s in sides):
                        places.add(f"{rel}: switch on a name")
                elif isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
                    if len(_named(node, names)) >= 3:
                        places.add(f"{rel}: list")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    if len(set(word.findall(node.value))) >= 3:
                        places.add(f"{rel}: list")
    return sorted(places)


def _named(node: ast.AST, names: set[str]) -> set[str]:
    """The algorithms a literal's elements (and its dict's keys and values, one tuple deep) name: ``"ppo"`` or
    ``"rlstruct.algos.ppo"``."""
    elements = [*node.keys, *node.values] if isinstance(node, ast.Dict) else list(node.elts)
    elements += [e for el in list(elements) if isinstance(el, ast.Tuple) for e in el.elts]
    return {e.value.removeprefix("rlstruct.algos.") for e in elements
            if isinstance(e, ast.Constant) and isinstance(e.value, str)
            and e.value.removeprefix("rlstruct.algos.") in names}


def duplicates(root: Path) -> dict[str, object] | None:
    """The rows of ``duplicates --most 200`` over the tree, and those with both sides in the library's folders."""
    if shutil.which("duplicates") is None:
        return None
    out = subprocess.run(["duplicates", "--most", "200", "--repo", str(root), "--seconds", "120"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
    library = [r for r in rows if all(side.strip().split(":")[0].split("/")[0] in LIBRARY
                                      for side in r.split(" ", 1)[1].split(" ~ "))]
    return {"rows": len(rows), "library_rows": len(library), "library": library, "summary": out.splitlines()[0]}


def static_figures(root: Path) -> dict[str, object]:
    """The figures read from the files alone (nothing of the tree runs)."""
    report = {"public_algos": public_algos(root), "module_sizes": module_sizes(root),
              "algorithm_registries": algorithm_registries(root),
              "sibling_imports": {k: {"count": len(v), "names": v} for k, v in sibling_imports(root).items()}}
    found = duplicates(root)
    if found is not None:
        report["duplicates"] = found
    return report


def import_ppo() -> dict[str, object]:
    times, modules = [], []
    for _ in range(5):
        line = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split("IMPORT", 1)[1].split(" ", 2)
        times.append(float(line[1]))
        modules = ast.literal_eval(line[2].strip())
    return {"modules": len(modules), "seconds_median": round(statistics.median(times), 3),
            "seconds_range": [round(min(times), 3), round(max(times), 3)], "names": modules}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--static", type=Path, metavar="DIR", help="the figures read from the files of the tree at DIR only")
    ns = p.parse_args(argv)
    if ns.static is not None:
        print(json.dumps(static_figures(ns.static.resolve()), indent=1))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        traced = trace_ppo(tmp)
    lines = {str(p.relative_to(ROOT / "algos")): len(p.read_text().splitlines())
             for p in (ROOT / "algos").rglob("*.py")}
    largest = max(lines, key=lines.get)
    help_text = subprocess.run([sys.executable, "-m", "rlstruct.algos", "train", "ppo", "--help"],
                               capture_output=True, text=True, check=True, cwd=ROOT).stdout
    report = {
        "ppo_iteration_files": {"count": len(traced["iteration"]), "files": traced["iteration"]},
        "train_files": {"count": len(traced["all"])},
        "largest_algos_module": {"file": f"algos/{largest}", "lines": lines[largest]},
        "algos_lines": dict(sorted(lines.items())),
        "import_ppo": import_ppo(),
        "help_chars": len(help_text),
        "help_flags": help_text.count("\n  --"),
        "help_longest_entry_lines": _longest_entry(help_text),
        **static_figures(ROOT),
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
