"""``MODULE:ATTRIBUTE`` references to a user's own code, the convention of uvicorn's ``main:app`` and setuptools'
entry points: how a network factory (``--network``) and a ``VecEnv`` factory (``--env``) are named in a run's settings,
so that any process where the module imports rebuilds them; and which modules a saved run may import when it is opened
without the user's consent (:func:`untrusted_module`): rlstruct's own and installed packages', found without running
them."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from rlstruct.errors import ConfigError, UntrustedCodeError

__all__ = ["is_source", "module_distribution", "resolve_source", "source_module", "untrusted_module"]

#: what a C extension's callables are: never a factory a setting names (``os:system``, ``builtins:eval``)
_C_CALLABLES = (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType,
                types.MethodDescriptorType, types.ClassMethodDescriptorType)


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def is_source(text: str) -> bool:
    """Whether ``text`` has the form ``MODULE:ATTRIBUTE``, both dotted Python names (gymnasium's
    ``module:Env-v0`` registration ids have a dash or a slash after the colon, and are not).

    >>> is_source("mylab.nets:actor_critic"), is_source("mylab.envs:Maze-v0"), is_source("CartPole-v1")
    (True, False, False)
    """
    module, colon, attribute = text.partition(":")
    return bool(colon) and _dotted(module) and _dotted(attribute)


def import_source_module(module: str, *, argument: str, value: str) -> Any:
    """Imports ``module``, named by the setting ``argument`` (whose value is ``value``) in the one-line errors.

    Raises:
        ConfigError: the module is not importable here (the message names it and how to make it importable), or it
            fails as it imports (its own error, in one line).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise ConfigError(f"{argument}={value!r} names module {module!r}, but no module named {e.name!r} imports "
                              "here; run from the folder that holds it, add that folder to PYTHONPATH, or install its "
                              "package") from e
        raise ConfigError(f"{argument}={value!r}: module {module!r} does not import, it needs {e.name!r}, which is "
                          "not installed; install it") from e
    except Exception as e:  # the module's own failure, in one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"{argument}={value!r}: module {module!r} raised {type(e).__name__} as it imported "
                          f"({first}); fix the module") from e


def resolve_source(source: str, *, argument: str, same_package: bool = False) -> Any:
    """The object that ``source`` (``"MODULE:ATTRIBUTE"``, the setting ``argument`` in errors) names, its module
    imported; it must be callable, and a function or class of Python code (no C function: ``os:system`` is none).

    Args:
        source: ``"MODULE:ATTRIBUTE"``.
        argument: the setting's name, for the messages.
        same_package: also require the object to be defined in the named module's top-level package (a saved run's
            factory: a package that re-exports another's callable, e.g. ``subprocess``'s, does not lend it its trust).

    Raises:
        ConfigError: ``source`` has not the form ``MODULE:ATTRIBUTE``, its module does not import here (the message
            names the missing module), it has no such attribute, or the attribute is not callable.
        UntrustedCodeError: (a ``ConfigError``) the attribute is a C function or a built-in type, or, with
            ``same_package``, is defined in another package.

    >>> resolve_source("textwrap:dedent", argument="network")("  a")
    'a'
    >>> resolve_source("os.path:sep", argument="network")
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: network='os.path:sep' names a str, not a callable; name a function or a class
    >>> resolve_source("os:system", argument="network")
    Traceback (most recent call last):
    ...
    rlstruct.errors.UntrustedCodeError: network='os:system' names the C function posix.system, not a factory; name a \
function or a class of your module
    """
    if not is_source(source):
        raise ConfigError(f"{argument} must be MODULE:CALLABLE (dotted Python names, e.g. mylab.nets:make), got "
                          f"{source!r}")
    module_name, _, attribute = source.partition(":")
    found = import_source_module(module_name, argument=argument, value=source)
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{argument}={source!r}: module {module_name!r} has no attribute {attribute!r}; name a "
                              "function or a class the module defines")
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError(f"{argument}={source!r} names a {type(found).__name__}, not a callable; name a function or "
                          "a class")
    defined_in = getattr(found, "__module__", None) or type(found).__module__
    if isinstance(found, _C_CALLABLES) or (isinstance(found, type) and defined_in == "builtins"):
        what = "C function" if isinstance(found, _C_CALLABLES) else "built-in type"
        raise UntrustedCodeError(f"{argument}={source!r} names the {what} {defined_in}."
                                 f"{getattr(found, '__qualname__', attribute)}, not a factory; name a function or a "
                                 "class of your module")
    package = module_name.partition(".")[0]
    if same_package and str(defined_in).partition(".")[0] != package:
        raise UntrustedCodeError(f"{argument}={source!r} names a callable defined in {defined_in!r}, outside the "
                                 f"package {package!r} the setting names; name a function or a class that {package!r} "
                                 "defines")
    return found


def source_module(argument: str, value: Any) -> str | None:
    """The module that a run's setting ``argument`` (``"network"`` or ``"env"``) imports when its value is ``value``:
    a factory's (``MODULE:CALLABLE``), the module that registers a gymnasium id (``"module:Env-v0"``), or ``None``
    (a gymnasium id, rlstruct's own networks).

    >>> source_module("network", "mylab.nets:make"), source_module("env", "mylab.envs:Maze-v0")
    ('mylab.nets', 'mylab.envs')
    >>> source_module("env", "CartPole-v1"), source_module("network", None)
    (None, None)
    """
    if not isinstance(value, str) or ":" not in value:
        return None
    module = value.partition(":")[0]
    return module if _dotted(module) and (argument == "env" or is_source(value)) else None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _find_spec(module: str) -> Any:
    """``module``'s spec; finding a submodule's imports its parent packages, so the caller checks those first."""
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a missing parent; a module in sys.modules without a spec (__main__)
        return None


def _roots(distribution: importlib.metadata.Distribution) -> list[Path]:
    """The folders that hold an installed distribution's modules: the one of its metadata (site-packages), and an
    editable install's project folder (``direct_url.json``, PEP 610)."""
    roots = [Path(os.fspath(distribution.locate_file(""))).resolve()]
    try:
        direct = json.loads(distribution.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if isinstance(direct, dict) and isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable"):
        url = urlparse(str(direct.get("url", "")))
        if url.scheme == "file":
            roots.append(Path(unquote(url.path)).resolve())
    return roots


@functools.lru_cache(maxsize=1)
def _packages_distributions(path: tuple[str, ...]) -> dict[str, list[str]]:
    """importlib.metadata's ``packages_distributions`` of the installed distributions that ``path`` (``sys.path``)
    finds: it reads every distribution's file list (a few tenths of a second), once per ``sys.path``."""
    return importlib.metadata.packages_distributions()


def _providers(package: str) -> Iterator[importlib.metadata.Distribution]:
    """The installed distributions that may hold the top-level ``package``: those named like it first (most are:
    found at once), then those whose metadata lists it (:func:`_packages_distributions`)."""
    named = list(importlib.metadata.distributions(name=package))
    yield from named
    seen = {d.metadata["Name"] for d in named}
    for name in dict.fromkeys(_packages_distributions(tuple(sys.path)).get(package, ())):
        if name not in seen:
            yield from importlib.metadata.distributions(name=name)


def module_distribution(module: str) -> tuple[str, str] | None:
    """``(name, version)`` of the installed distribution that holds ``module`` (found without running it, its parent
    packages imported), or ``None``: a module of the current folder or of ``PYTHONPATH``, or Python's own.

    >>> module_distribution("rlstruct.algos.ppo")[0], module_distribution("textwrap")
    ('rlstruct', None)
    """
    package = module.partition(".")[0]
    if package == "rlstruct":  # this package, imported before any of its modules: its own version
        return "rlstruct", sys.modules["rlstruct"].__version__
    spec = _find_spec(module)
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    path = Path(spec.origin).resolve()
    for distribution in _providers(package):
        if any(_inside(path, root) for root in _roots(distribution)):
            return distribution.metadata["Name"], distribution.version
    return None


def untrusted_module(module: str, *, run_folder: str | os.PathLike) -> str | None:
    """Why a saved run in ``run_folder`` may not import ``module`` without the user's consent, or ``None`` when it may:
    rlstruct's own modules, and those whose file an installed distribution holds, outside the run's folder and not
    provided by the current folder. No code of ``module`` runs here (``importlib.util.find_spec``); the parent
    packages of a submodule are imported once they are found to be installed ones.

    Returns:
        The reason, as the end of a sentence naming the module (``"which lies in the run's folder (...)"``).

    >>> untrusted_module("rlstruct.algos.ppo", run_folder="runs/x") is None
    True
    >>> untrusted_module("this", run_folder="runs/x")
    "which is Python's own (its standard library), not an installed package"
    """
    package = module.partition(".")[0]
    if package == "rlstruct":
        return None
    folder, here = Path(run_folder).resolve(), Path.cwd().resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = _find_spec(name)
        if spec is None:
            return "which is not installed here" if depth == 1 else f"which is not importable here (no {name!r})"
        if spec.origin is None and spec.submodule_search_locations is not None:
            continue  # a namespace package runs no code: its submodules are checked
        if not spec.has_location or spec.origin is None:  # built into the interpreter, or frozen in it (os)
            return "which is Python's own (built into the interpreter), not an installed package"
        path = Path(spec.origin).resolve()
        if _inside(path, folder):
            return f"which lies in the run's folder ({path})"
        holder = path.parent.parent if spec.submodule_search_locations is not None else path.parent
        if depth == 1 and holder == here:
            return f"which the current folder provides ({path})"
        if _inside(path, stdlib) and "site-packages" not in path.parts and "dist-packages" not in path.parts:
            return "which is Python's own (its standard library), not an installed package"
        if not any(_inside(path, root) for d in _providers(package) for root in _roots(d)
                   if root != here and not _inside(root, folder)):
            return f"which no installed package holds ({path})"
    return None
