"""The shape of the algorithm package: a short public tier over a private harness that it reaches through one face,
and user docs that name no private module.

Read from the sources with ``ast``. A public module of ``algos/`` is a file there whose name does not start with
``_``; together they export at most :data:`MAX_PUBLIC_NAMES` names (the union of their ``__all__``), and each reaches
the harness (``rlstruct.algos._train``) through that package only, never through one of its modules, so that the
harness's modules can be split or joined without touching an algorithm.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "rlstruct.algos._train"
MAX_PUBLIC_MODULES = 16
MAX_PUBLIC_NAMES = 80
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


def harness_module_imports(source: str, module: str = "rlstruct.algos.x") -> list[str]:
    """The imports of ``source`` (the module ``module`` of ``algos/``), wherever they stand, that name a module
    inside the harness rather than the harness's package, as ``"line: dotted name"``."""
    package = module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
            if node.level:  # relative to the module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                names = [".".join([*anchor, node.module] if node.module else anchor)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if name.startswith(HARNESS + ".")]
    return found


def private_module_names(text: str) -> list[str]:
    """The dotted paths of ``text`` that name a private module of this project."""
    return PRIVATE_MODULE.findall(text)


def user_docs(root: Path = ROOT) -> list[Path]:
    """What a user reads: the README, the documentation pages and the tutorials."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "tutorials").glob("*.py"))]


def test_the_checks_find_what_they_look_for():
    assert harness_module_imports("from rlstruct.algos._train.loops import OnPolicyAlgorithm\n") == [
        "1: rlstruct.algos._train.loops"]
    assert harness_module_imports("def f():\n    from ._train.update import UpdateStep\n") == [
        "2: rlstruct.algos._train.update"]
    assert harness_module_imports("import rlstruct.algos._train.config\n") == ["1: rlstruct.algos._train.config"]
    assert harness_module_imports("from rlstruct.algos._train import UpdateStep\nfrom ._train import World\n") == []
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
    names = set().union(*(exported_names(p.read_text()) or [] for p in modules))
    assert len(modules) <= MAX_PUBLIC_MODULES, (
        f"{len(modules)} public modules in algos/ (at most {MAX_PUBLIC_MODULES}): {[p.stem for p in modules]}; "
        "merge them or make one private (a leading underscore)")
    assert len(names) <= MAX_PUBLIC_NAMES, (
        f"the public modules of algos/ export {len(names)} names (at most {MAX_PUBLIC_NAMES}); drop from __all__ "
        "what only the library's own modules import")


def test_public_modules_reach_the_harness_through_its_package_only():
    reaching = {p.name: found for p in public_modules()
                if (found := harness_module_imports(p.read_text(), f"rlstruct.algos.{p.stem}"))}
    assert not reaching, (f"public modules import from inside {HARNESS} (import the name from {HARNESS} itself, "
                          f"adding it to its __init__'s table if it is missing): {reaching}")


def test_the_user_docs_name_no_private_module():
    named = {str(p.relative_to(ROOT)): sorted(set(found)) for p in user_docs()
             if (found := private_module_names(p.read_text()))}
    assert not named, f"user docs naming a private module (name its public home instead): {named}"


def test_the_harness_face_loads_every_name_it_lists():
    import rlstruct.algos._train as harness

    for name in harness.__all__:
        assert getattr(harness, name) is not None, name


def test_the_command_line_names_a_harness_warning_by_its_public_package():
    from rlstruct.algos._train.train_command import _PublicNames

    formatter = _PublicNames("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("rlstruct.algos._train.trackers", logging.WARNING, __file__, 1, "dropped", None, None)
    assert formatter.format(record) == "WARNING rlstruct.algos: dropped"
    assert record.name == "rlstruct.algos._train.trackers"  # other handlers still see where it came from
    record = logging.LogRecord("rlstruct.batchers.batcher", logging.WARNING, __file__, 1, "slow", None, None)
    assert formatter.format(record) == "WARNING rlstruct.batchers.batcher: slow"
