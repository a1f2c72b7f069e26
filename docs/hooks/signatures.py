"""MkDocs hook: each distinct signature formatted once per build.

mkdocstrings-python lays out a long signature with ``ruff format``, a process per signature: some 690 a build, a third
of them repeats (an object documented where its package exports it and where it is defined, a method shared by
subclasses). The layout is a function of the text and the line length alone, so a repeat takes the first answer: the
site is the same, some 230 processes fewer. Where mkdocstrings-python no longer has the formatter this reads, the
hook does nothing.
"""

from __future__ import annotations

import functools


def on_config(config):
    """Memoizes mkdocstrings-python's signature formatter, once per process."""
    try:
        from mkdocstrings_handlers.python._internal import rendering
    except ImportError:
        return config
    formatter = getattr(rendering, "_get_formatter", None)
    if formatter is None or getattr(formatter, "memoized_by_hook", False):
        return config

    @functools.cache
    def memoized() -> object:
        return functools.cache(formatter())

    memoized.memoized_by_hook = True
    rendering._get_formatter = memoized
    return config
