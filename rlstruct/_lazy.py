"""Names of a package that load their module on first use (PEP 562), so that importing the package loads only what
a run uses: one implementation for every package that re-exports optional or heavy modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlstruct._deprecation import Deprecated, warn_deprecated


def by_name(modules: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """``{name: module}`` of ``modules`` (``{module: its names}``): the form :func:`lazy_names` takes, for a package
    that writes each module once.

    >>> by_name({"math": ("sqrt", "cbrt"), "cmath": ("phase",)})
    {'sqrt': 'math', 'cbrt': 'math', 'phase': 'cmath'}
    """
    return {name: module for module, names in modules.items() for name in names}


def lazy_names(package: str, lazy: dict[str, str], exported: Iterable[str], namespace: dict[str, Any],
               deprecated: Mapping[str, Deprecated] | None = None,
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: a name of ``lazy`` (name -> module) is
    imported from its module when first read; one of ``deprecated`` (the package's ``_DEPRECATED``, see
    :mod:`rlstruct._deprecation`) warns and gives its object; ``dir()`` lists the loaded names and ``exported``.

    >>> ns = {}
    >>> getattr_, dir_ = lazy_names("pkg", {"sqrt": "math"}, ["sqrt"], ns)
    >>> getattr_("sqrt")(4.0)
    2.0
    >>> getattr_("cbrt")
    Traceback (most recent call last):
    AttributeError: module 'pkg' has no attribute 'cbrt'
    """
    exported = tuple(exported)

    def __getattr__(name: str) -> Any:
        if deprecated and name in deprecated:
            warn_deprecated(package, name, deprecated[name])
            return deprecated[name].resolve()
        if name not in lazy:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(lazy[name]), name)

    def __dir__() -> list[str]:
        return sorted({*namespace, *exported})

    return __getattr__, __dir__
