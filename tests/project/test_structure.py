"""The shape of the algorithm package: a short public tier over a private harness that it reaches through one public
face, and user docs that name no private module.

Read from the sources with ``ast``. A public module of ``algos/`` is a file there whose name does not start with
``_``; together they export at most :data:`MAX_PUBLIC_NAMES` names (the union of their ``__all__``, the face's
counted apart), and only the face (``rlstruct.algos.harness``) imports the harness (``rlstruct.algos._train``), so
that the harness's modules can be split or joined without touching an algorithm. The built-in algorithm modules
import no private module at all: they are the proof that the public modules suffice to write an algorithm.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "rlstruct.algos._train"
#: the public module that holds what an algorithm is written against
FACE = "harness"
BUILT_IN_ALGORITHMS = ("reinforce", "a2c", "ppo", "dqn", "sac", "pqn", "td3", "impala")
MAX_PUBLIC_MODULES = 22  # the eight algorithms, the face, and thirteen pieces a researcher imports (population: #74)
#: policy_actions, critic_values, make_adam, TwinCriticLearner, vtrace and its loss, IMPALAConfig, PopulationAgent,
#: MemberEnvs
MAX_PUBLIC_NAMES = 111
MAX_FACE_NAMES = 49  # what an algorithm is written against, and the run kit a new family's loop is written with
#: a dotted path into this project with a private segment: ``rlstruct.algos._train.sweep``, ``rlstruct.envs._base``
PRIVATE_MODULE = re.compile(r"\b(?:rlstruct|algos|agents|batchers)(?:\.[A-Za-z]\w*)*\._[a-z]\w*")


def public_modules(root: Path = ROOT) -> list[Path]:
    """The public modules of ``algos/``."""
    return sorted(p for p in (root / "algos").glob("*.py") if not p.name.startswith("_"))


def exported_names(source: str) -> list[str] | None:
    """The literal ``__all__`` of a module's source, or ``None`` when it has none."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def imported_modules(source: str, module: str = "rlstruct.algos.x") -> list[tuple[int, str]]:
    """The modules that ``source`` (the module ``module``) imports, wherever the import stands, as
    ``(line, dotted name)``; ``from package import name`` counts ``package.name`` too, which may be a module."""
    package = module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to the module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            found += [(node.lineno, base), *((node.lineno, f"{base}.{alias.name}") for alias in node.names)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def harness_imports(source: str, module: str = "rlstruct.algos.x") -> list[str]:
    """The imports of ``source`` that reach the harness (its package or a module in it), as ``"line: name"``."""
    return sorted({f"{line}: {name}" for line, name in imported_modules(source, module)
                   if name == HARNESS or name.startswith(HARNESS + ".")})


def private_imports(source: str, module: str = "rlstruct.algos.x") -> list[str]:
    """The imports of ``source`` that name a module of this project with a private segment (one starting with
    ``_``: ``rlstruct.algos._qnet``, ``rlstruct.algos._train.loops``), as ``"line: name"``."""
    return sorted({f"{line}: {name}" for line, name in imported_modules(source, module)
                   if name.split(".")[0] == "rlstruct"
                   and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))})


def private_module_names(text: str) -> list[str]:
    """The dotted paths of ``text`` that name a private module of this project."""
    return PRIVATE_MODULE.findall(text)


def user_docs(root: Path = ROOT) -> list[Path]:
    """What a user reads: the README, the documentation pages and the tutorials."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "tutorials").glob("*.py"))]


def test_the_checks_find_what_they_look_for():
    assert harness_imports("from rlstruct.algos._train.loops import OnPolicyAlgorithm\n")[0] == (
        "1: rlstruct.algos._train.loops")
    assert "2: rlstruct.algos._train.update" in harness_imports("def f():\n    from ._train.update import U\n")
    assert harness_imports("import rlstruct.algos._train.config\n") == ["1: rlstruct.algos._train.config"]
    assert "1: rlstruct.algos._train" in harness_imports("from rlstruct.algos import _train\n")
    assert harness_imports("from rlstruct.algos.harness import trainer\nfrom . import returns\n") == []
    assert private_imports("from rlstruct.algos import _qnet\nimport rlstruct.algos.ppo\n") == [
        "1: rlstruct.algos._qnet"]
    assert private_imports("from rlstruct.algos._env_spec import EnvSpec\n")[0] == "1: rlstruct.algos._env_spec"
    assert private_imports("from rlstruct import __version__\nfrom rlstruct.algos import EnvSpec\n") == []
    assert exported_names("__all__ = ['a', 'b']\n") == ["a", "b"] and exported_names("x = 1\n") is None
    assert private_module_names("from rlstruct.algos._train.sweep import run_sweep") == ["rlstruct.algos._train"]
    assert private_module_names("see rlstruct.envs._base.VecEnv and algos._train") == [
        "rlstruct.envs._base", "algos._train"]
    assert private_module_names("torch._dynamo, rlstruct.algos.run_sweep, rlstruct.__version__, os._exit") == []


def test_every_public_module_of_algos_declares_its_exports():
    lacking = [p.name for p in public_modules() if exported_names(p.read_text()) is None]
    assert not lacking, f"public modules of algos/ without __all__: {lacking}"


def test_the_public_modules_of_algos_and_their_names_fit_the_budget():
    modules = public_modules()
    names = set().union(*(exported_names(p.read_text()) or [] for p in modules if p.stem != FACE))
    face = exported_names((ROOT / "algos" / f"{FACE}.py").read_text()) or []
    assert len(face) <= MAX_FACE_NAMES, (
        f"rlstruct.algos.{FACE} exports {len(face)} names (at most {MAX_FACE_NAMES}): it holds what an algorithm is "
        "written against, not what the harness uses inside")
    assert len(modules) <= MAX_PUBLIC_MODULES, (
        f"{len(modules)} public modules in algos/ (at most {MAX_PUBLIC_MODULES}): {[p.stem for p in modules]}; "
        "merge them or make one private (a leading underscore)")
    assert len(names) <= MAX_PUBLIC_NAMES, (
        f"the public modules of algos/ export {len(names)} names (at most {MAX_PUBLIC_NAMES}); drop from __all__ "
        "what only the library's own modules import")


def test_only_the_face_reaches_the_harness():
    reaching = {p.name: found for p in public_modules()
                if p.stem != FACE and (found := harness_imports(p.read_text(), f"rlstruct.algos.{p.stem}"))}
    assert not reaching, (f"public modules import from {HARNESS} (import the name from rlstruct.algos.{FACE}, "
                          f"adding it to the face if it is missing): {reaching}")


def test_no_built_in_algorithm_imports_a_private_module():
    from rlstruct.algos._train.registry import ALGORITHMS

    assert set(BUILT_IN_ALGORITHMS) == set(ALGORITHMS), "every built-in algorithm's file is checked"
    found = {name: imports for name in BUILT_IN_ALGORITHMS
             if (imports := private_imports((ROOT / "algos" / f"{name}.py").read_text(), f"rlstruct.algos.{name}"))}
    assert not found, (f"built-in algorithm modules importing private modules (import from rlstruct.algos.{FACE} "
                       f"or a public building block; make the piece public if an algorithm needs it): {found}")


def test_the_user_docs_name_no_private_module():
    named = {str(p.relative_to(ROOT)): sorted(set(found)) for p in user_docs()
             if (found := private_module_names(p.read_text()))}
    assert not named, f"user docs naming a private module (name its public home instead): {named}"


def test_the_harness_face_holds_every_name_it_lists_as_a_real_import():
    import rlstruct.algos.harness as face

    source = (ROOT / "algos" / f"{FACE}.py").read_text()
    bound = {alias.asname or alias.name for node in ast.parse(source).body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert set(face.__all__) <= bound, f"names of the face that no import statement binds: {set(face.__all__) - bound}"
    for name in face.__all__:
        assert getattr(face, name) is not None, name


def test_the_command_line_names_a_harness_warning_by_its_public_package():
    from rlstruct.algos._train.train_command import _PublicNames

    formatter = _PublicNames("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("rlstruct.algos._train.trackers", logging.WARNING, __file__, 1, "dropped", None, None)
    assert formatter.format(record) == "WARNING rlstruct.algos: dropped"
    assert record.name == "rlstruct.algos._train.trackers"  # other handlers still see where it came from
    record = logging.LogRecord("rlstruct.batchers.batcher", logging.WARNING, __file__, 1, "slow", None, None)
    assert formatter.format(record) == "WARNING rlstruct.batchers.batcher: slow"


def type_checking_imports(source: str) -> dict[str, str]:
    """``{name: module}`` of the ``from module import name`` statements under ``if TYPE_CHECKING:`` at the top of
    ``source``."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    found.update({alias.asname or alias.name: stmt.module for alias in stmt.names})
    return found


@pytest.mark.parametrize("package, folder", [("rlstruct.envs", "rlstruct/envs"), ("rlstruct.batchers", "batchers"),
                                             ("rlstruct.algos", "algos")])
def test_a_lazy_table_has_the_real_imports_beside_it_for_static_readers(package, folder):
    import importlib

    lazy = importlib.import_module(package)._LAZY
    static = type_checking_imports((ROOT / folder / "__init__.py").read_text())
    differ = {n: (lazy.get(n), static.get(n)) for n in {*lazy, *static} if lazy.get(n) != static.get(n)}
    assert not differ, f"{package}'s lazy names and its TYPE_CHECKING imports differ (lazy, imported): {differ}"


def test_the_docs_home_names_every_built_in_algorithm():
    from rlstruct.algos._train.registry import ALGORITHMS, algorithm

    home = (ROOT / "docs" / "index.md").read_text()
    missing = [algorithm(name).title for name in ALGORITHMS if algorithm(name).title not in home]
    assert not missing, f"docs/index.md does not name the built-in algorithms {missing}"
