"""The import graph of the library: no cycle among its modules, and importing an algorithm loads what it uses.

The graph is read from the sources with ``ast``, every ``import`` counted wherever it stands: at the top, inside a
function (a lazy import), under ``if TYPE_CHECKING:``. A module importing itself (an algorithm's ``__main__`` block
does, so that spawned workers unpickle its functions under their real name) is not an edge; a package's
``__init__`` is an edge only where it is imported by name, and a name it loads on first use (its ``_LAZY`` table) is an
edge to the module that defines it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: source folder -> the import package it installs as
PACKAGES = {"rlstruct": "rlstruct", "agents": "rlstruct.agents", "batchers": "rlstruct.batchers",
            "algos": "rlstruct.algos"}


def project_modules() -> dict[str, Path]:
    """Every module of the library by its dotted name."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _literal_entries(node: ast.expr) -> dict[str, str]:
    """``{name: module}`` of a ``_LAZY`` table's literal entries: ``"name": "module"``, and the
    ``by_name({"module": ("name", ...)})`` tables written in it or as it."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "by_name" and node.args:
        grouped = node.args[0]
        if not isinstance(grouped, ast.Dict):
            return {}
        return {n.value: k.value for k, v in zip(grouped.keys, grouped.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple)
                for n in v.elts if isinstance(n, ast.Constant)}
    if not isinstance(node, ast.Dict):
        return {}
    entries: dict[str, str] = {}
    for k, v in zip(node.keys, node.values, strict=True):
        if k is None:  # **by_name({...})
            entries.update(_literal_entries(v))
        elif isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
            entries[k.value] = v.value
    return entries


def lazy_tables(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """``{package: {name: module}}`` of the packages whose names load their module on first use (their ``_LAZY``
    table's literal entries), so that importing such a name is an edge to the module that defines it."""
    tables: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
                tables[name] = _literal_entries(node.value)
    return tables


def import_graph() -> dict[str, set[str]]:
    """``{module: the project's modules it imports}``, imports inside functions and under TYPE_CHECKING counted; a
    lazy name of a package counts as an import of its module."""
    modules = project_modules()
    lazy = lazy_tables(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # a relative import
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from package import submodule" imports the submodule; "from module import name" the module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                           else lazy.get(base, {}).get(a.name, base) for a in node.names]
            for target in targets:
                while target and target not in modules:  # "import rlstruct.envs.gym" names the module itself
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    assert "rlstruct.algos._env_spec" in graph["rlstruct.algos.networks"]  # under TYPE_CHECKING, a lazy name
    assert "rlstruct.algos._train.profile" in graph["rlstruct.algos._train.cli"]  # inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_the_librarys_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


#: a fresh interpreter that imports torch once, then forks a child per statement of ``argv[1]`` (a JSON list) that runs
#: it and reports the rlstruct modules (and Ray) loaded: what each statement loads, for one import of torch (2.8 of a
#: fresh interpreter's 3.5 CPU s) rather than one per statement. Only torch is imported before the fork: it loads none
#: of rlstruct's modules nor Ray, so a child's list is the statement's own.
_LOADED = """
import json, os, sys, traceback
import torch

assert not [m for m in sys.modules if m.startswith("rlstruct") or m == "ray"], "torch's import loaded rlstruct or Ray"
loaded = {}
for statement in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(statement)
            found = sorted(m for m in sys.modules if m in ("rlstruct", "ray") or m.startswith("rlstruct."))
        except BaseException:
            found = traceback.format_exc()
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(found))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        loaded[statement] = json.loads(f.read())
    os.waitpid(pid, 0)
print(json.dumps(loaded))
"""

#: the env backends' adapter modules, which only a run on that backend needs, and the tools a training run does not
#: use (the gymnasium bridge, the Ray batcher, the autotuner, the profiler)
UNUSED_BY_TRAINING = ("rlstruct.envs.jax_env", "rlstruct.envs.gymnax_env", "rlstruct.envs.brax_env",
                      "rlstruct.envs.mjx_env", "rlstruct.envs.mujoco_torch_env", "rlstruct.envs.bridge",
                      "rlstruct.batchers.ray_batcher", "rlstruct.batchers.autotune", "rlstruct.batchers.profile",
                      "rlstruct.algos._train.profile", "rlstruct.algos._train.cli")
ALGOS = ["a2c", "ppo", "reinforce", "dqn", "sac", "td3"]
GYMNAX = "import rlstruct.envs; rlstruct.envs.make_env('CartPole-v1', 1, backend='gymnax').close()"
RAY_BATCHER = "import rlstruct.batchers as b; b.RayBatcher"


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    """``{statement: the rlstruct modules (and Ray) it loads}`` for every statement the tests below ask about, each
    run in a process of its own (forked from one fresh interpreter, :data:`_LOADED`)."""
    statements = [f"import rlstruct.algos.{algo}" for algo in ALGOS] + ["import rlstruct.envs", RAY_BATCHER]
    if importlib.util.find_spec("gymnax") is not None:
        statements.append(GYMNAX)
    out = subprocess.run([sys.executable, "-c", _LOADED, json.dumps(statements)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, check=True).stdout
    found = json.loads(out.splitlines()[-1])
    failed = {s: f for s, f in found.items() if isinstance(f, str)}
    assert not failed, failed
    return {s: set(f) for s, f in found.items()}


@pytest.mark.slow  # its users share one fresh interpreter: 4-10 CPU s for the first, depending on JAX's import
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ALGOS)
def test_importing_an_algorithm_loads_its_own_modules_and_no_backend_adapter(algo, loaded):
    modules = loaded[f"import rlstruct.algos.{algo}"]
    others = {f"rlstruct.algos.{a}" for a in ("a2c", "ppo", "reinforce", "dqn", "sac", "pqn", "td3")} - {
        f"rlstruct.algos.{algo}"}
    assert not modules & others, modules & others
    assert not modules & set(UNUSED_BY_TRAINING), sorted(modules & set(UNUSED_BY_TRAINING))
    assert "rlstruct.algos._train.loops" in modules


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_backends_adapter_loads_when_that_backend_is_asked_for(loaded):
    assert not loaded["import rlstruct.envs"] & set(UNUSED_BY_TRAINING)
    if GYMNAX not in loaded:  # not importorskip: importing JAX here would cost this process 3-5 CPU s
        pytest.skip("the jax extra is not installed: pip install 'rlstruct[jax]'")
    modules = loaded[GYMNAX]
    assert {"rlstruct.envs.jax_env", "rlstruct.envs.gymnax_env"} <= modules
    assert not modules & {"rlstruct.envs.brax_env", "rlstruct.envs.mjx_env", "rlstruct.envs.mujoco_torch_env"}


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_ray_batcher_resolves_without_importing_ray(loaded):
    """``rlstruct.batchers.RayBatcher`` loads its module, which imports Ray only when a RayBatcher is built."""
    modules = loaded[RAY_BATCHER]
    assert "rlstruct.batchers.ray_batcher" in modules and "ray" not in modules


def test_the_lazy_names_of_the_packages_resolve():
    import rlstruct.algos
    import rlstruct.batchers
    import rlstruct.envs

    for package in (rlstruct.envs, rlstruct.batchers, rlstruct.algos):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
        with pytest.raises(AttributeError, match="has no attribute 'nope'"):
            package.nope  # noqa: B018
