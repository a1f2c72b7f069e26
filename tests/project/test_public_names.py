"""The stability promise of the public face: every name of a public module's ``__all__`` listed in
``public_names.json`` stays, or leaves through a deprecation (:mod:`rlstruct._deprecation`) that keeps it working for
one minor release behind a ``DeprecationWarning``; a new public name joins the list, and so the promise."""

from __future__ import annotations

import importlib
import json
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

import rlstruct
from rlstruct._deprecation import Deprecated, deprecated_names, removal_release

LISTED = Path(__file__).with_name("public_names.json")


def _release(version: str) -> tuple[int, int]:
    return tuple(int(part) for part in version.split(".")[:2])  # type: ignore[return-value]


def broken_promises(listed: dict[str, list[str]], modules: dict[str, Any], version: str) -> list[str]:
    """What breaks the promise, one line each: a listed name gone from its module's ``__all__`` without a
    deprecation entry, or whose entry does not warn and give an object; an entry kept past its removal release; a
    public name not in the list."""
    found = []
    for name, module in modules.items():
        exported = set(module.__all__)
        deprecated = getattr(module, "_DEPRECATED", {})
        for gone in sorted(set(listed.get(name, [])) - exported):
            if gone not in deprecated:
                found.append(f"{name}.{gone} left __all__ without a deprecation: keep it for one minor release in "
                             f"{name}._DEPRECATED (rlstruct._deprecation.Deprecated) and record it in CHANGELOG.md")
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = getattr(module, gone, None)
            if value is None or not any(issubclass(w.category, DeprecationWarning) for w in caught):
                found.append(f"{name}.{gone} is deprecated but reading it does not warn and give its object: set the "
                             "module's __getattr__ from rlstruct._deprecation.deprecated_names")
        for old, entry in deprecated.items():
            if _release(version) >= _release(removal_release(entry.since)):
                found.append(f"{name}.{old} was deprecated in {entry.since} and goes in "
                             f"{removal_release(entry.since)}: remove it and its entry now (rlstruct {version})")
            if old in exported:
                found.append(f"{name}.{old} is deprecated and still in __all__: take it out")
        new = sorted(exported - set(listed.get(name, [])))
        if new:
            found.append(f"{name} exports names that tests/project/public_names.json does not list: {new}; add them "
                         "(they join the stability promise)")
    return found


def test_every_listed_public_name_stays_or_leaves_through_a_deprecation():
    listed = json.loads(LISTED.read_text())
    modules = {name: importlib.import_module(name) for name in listed}
    problems = broken_promises(listed, modules, rlstruct.__version__)
    assert not problems, "\n".join(problems)


def _module(names: list[str], deprecated: dict[str, Deprecated] | None = None) -> types.ModuleType:
    module = types.ModuleType("pkg")
    module.__all__ = names
    for name in names:
        setattr(module, name, object())
    if deprecated is not None:
        module._DEPRECATED = deprecated
        module.__getattr__ = deprecated_names("pkg", deprecated)
    return module


def test_the_check_fails_on_a_name_gone_silently_and_passes_one_deprecated():
    listed = {"pkg": ["trainer", "sqrt"]}
    assert broken_promises(listed, {"pkg": _module(["trainer", "sqrt"])}, "0.1.0") == []
    gone = broken_promises(listed, {"pkg": _module(["trainer"])}, "0.1.0")
    assert len(gone) == 1 and gone[0].startswith("pkg.sqrt left __all__ without a deprecation")
    entry = {"sqrt": Deprecated("0.1.0", "use math.sqrt", "math:sqrt")}
    module = _module(["trainer"], entry)
    assert broken_promises(listed, {"pkg": module}, "0.1.5") == []
    with pytest.warns(DeprecationWarning, match=r"^pkg.sqrt is deprecated since rlstruct 0.1.0 and goes in 0.2.0; "
                                                r"use math.sqrt$"):
        assert module.sqrt(4.0) == 2.0
    overdue = broken_promises(listed, {"pkg": module}, "0.2.0")
    assert overdue == ["pkg.sqrt was deprecated in 0.1.0 and goes in 0.2.0: remove it and its entry now "
                       "(rlstruct 0.2.0)"]
    unlisted = broken_promises(listed, {"pkg": _module(["trainer", "sqrt", "cbrt"])}, "0.1.0")
    assert unlisted == ["pkg exports names that tests/project/public_names.json does not list: ['cbrt']; add them "
                        "(they join the stability promise)"]


def test_a_lazy_package_serves_its_deprecated_names_with_the_warning():
    from rlstruct._lazy import lazy_names

    namespace: dict[str, Any] = {}
    getattr_, _ = lazy_names("pkg", {"sqrt": "math"}, ["sqrt"], namespace,
                             deprecated={"root": Deprecated("0.1.0", "use pkg.sqrt", "math:sqrt")})
    assert getattr_("sqrt")(9.0) == 3.0
    with pytest.warns(DeprecationWarning, match="pkg.root is deprecated since rlstruct 0.1.0 and goes in 0.2.0"):
        assert getattr_("root")(9.0) == 3.0
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'cbrt'"):
        getattr_("cbrt")
