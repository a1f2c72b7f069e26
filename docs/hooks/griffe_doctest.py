"""Griffe extensions: rlstruct's docstrings as Markdown, and the names its packages export lazily.

The docstrings are written for ``pytest --doctest-modules`` and for ``help()``: reST roles, doctests in the body.

Markdown would read ``>>>`` as nested quotes, ``obs["frame"]`` as a link reference and ``:class:`~a.B``` as text.
:class:`DoctestFences` rewrites each docstring before it is parsed (the sources stay as they are): each run of
doctest lines (from a ``>>>`` line to the next blank line or dedent) becomes a fenced ``python`` block, and each
reST role a code span of the name (``:class:`~a.b.C``` -> ``C``, ``:mod:`a.b``` -> ``a.b``).
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def roles_to_code(text: str) -> str:
    """reST cross-reference roles as Markdown code spans (``~`` keeps the last component, as Sphinx shows it)."""
    return _ROLE.sub(lambda m: "`" + (m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)) + "`", text)


def fence_doctests(text: str) -> str:
    """``text`` with every doctest run wrapped in a fenced code block at the run's indentation."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```python")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctests and converts the roles of every object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrites ``obj``'s docstring (before griffe parses it)."""
        if obj.docstring is not None:
            obj.docstring.value = roles_to_code(fence_doctests(obj.docstring.value))


class LazyExports(griffe.Extension):
    """Adds to a module the names of its ``__all__`` that it exports at run time only.

    ``rlstruct.algos`` imports its algorithm modules on first use (a module ``__getattr__``), so a static reader
    sees ``A2CConfig`` in its ``__all__`` but not where it comes from. Once the package is loaded, each such name is
    looked up by importing the module, and becomes an alias of the object's defining path: the reference then
    documents the object where the package exports it, whatever the package's import mechanics.
    """

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Aliases, in ``pkg`` and its submodules, every name of ``__all__`` that static analysis did not find."""

        modules = [pkg]
        while modules:
            module = modules.pop()
            modules.extend(m for m in module.modules.values() if not m.is_alias)
            exported = getattr(module, "exports", None)
            if not exported and "__all__" in module.members:
                # an __all__ computed at import time (``list(_LAZY)``) is not readable statically: take the live one,
                # which also makes public the names the package imports under TYPE_CHECKING for static readers
                exported = list(getattr(importlib.import_module(module.path), "__all__", []))
                module.exports = exported
            names = [n if isinstance(n, str) else getattr(n, "name", str(n)) for n in exported or []]
            absent = [n for n in names if n not in module.members]
            if not absent or any(part.startswith("_") for part in module.path.split(".")):
                continue  # a private package's names are not in the reference
            live = importlib.import_module(module.path)
            for name in absent:
                obj = getattr(live, name)
                if inspect.ismodule(obj):
                    target = obj.__name__
                elif not hasattr(obj, "__qualname__"):  # a constant: in the module the package loads it from
                    target = f"{live._LAZY[name]}.{name}"
                else:
                    target = f"{obj.__module__}.{obj.__qualname__}"
                module.set_member(name, griffe.Alias(name, target, parent=module))
