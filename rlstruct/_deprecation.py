"""The stability promise of the public names: a name of a public module's ``__all__`` that changes or goes keeps
working for one minor release, behind a ``DeprecationWarning`` that says what to use instead (numpy's and
scikit-learn's convention), and the change is recorded in the changelog.

A module lists its deprecated names in ``_DEPRECATED`` (name -> :class:`Deprecated`) and, while that table is not
empty, sets its module ``__getattr__`` from :func:`deprecated_names` (or passes the table to
:func:`~rlstruct._lazy.lazy_names`); the name leaves ``__all__``. A module without deprecated names has no
``__getattr__``, so that type checkers still flag a misspelled name. ``tests/project/test_public_names.py`` holds
every public module to the committed list of its names: one that disappears without an entry here fails it.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Deprecated", "deprecated_names", "removal_release"]


@dataclasses.dataclass(frozen=True)
class Deprecated:
    """A public name on its way out.

    Attributes:
        since: the release that deprecated it (``"0.2.0"``); it goes in the next minor release.
        use: what to use instead, as the fix of the warning (``"use rlstruct.algos.harness.trainer"``).
        target: ``"module:attribute"`` of the object the old name still gives, imported on first use.
    """

    since: str
    use: str
    target: str

    def resolve(self) -> Any:
        """The object the old name gives."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


def removal_release(since: str) -> str:
    """The release in which a name deprecated in ``since`` goes: the next minor release.

    >>> removal_release("0.1.3"), removal_release("1.4.0")
    ('0.2.0', '1.5.0')
    """
    major, minor = (int(part) for part in since.split(".")[:2])
    return f"{major}.{minor + 1}.0"


def warn_deprecated(module: str, name: str, entry: Deprecated, *, stacklevel: int = 3) -> None:
    """Warns that ``module.name`` is deprecated (``DeprecationWarning``, at the caller of the module's
    ``__getattr__``)."""
    warnings.warn(f"{module}.{name} is deprecated since rlstruct {entry.since} and goes in "
                  f"{removal_release(entry.since)}; {entry.use}", DeprecationWarning, stacklevel=stacklevel)


def deprecated_names(module: str, table: Mapping[str, Deprecated]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` (PEP 562) of ``module`` whose deprecated names are ``table``'s: reading one
    warns and gives its object; any other unknown name raises ``AttributeError``.

    >>> getattr_ = deprecated_names("pkg", {"root": Deprecated("0.1.0", "use math.sqrt", "math:sqrt")})
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     getattr_("root")(9.0), str(caught[0].message)
    (3.0, 'pkg.root is deprecated since rlstruct 0.1.0 and goes in 0.2.0; use math.sqrt')
    """

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_deprecated(module, name, table[name])
        return table[name].resolve()

    return __getattr__
