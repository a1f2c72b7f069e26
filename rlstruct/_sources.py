"""``MODULE:ATTRIBUTE`` references to a user's own code, the convention of uvicorn's ``main:app`` and setuptools'
entry points: how a network factory (``--network``) and a ``VecEnv`` factory (``--env``) are named in a run's settings,
so that any process where the module imports rebuilds them."""

from __future__ import annotations

import importlib
from typing import Any

from rlstruct.errors import ConfigError

__all__ = ["is_source", "resolve_source"]


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


def resolve_source(source: str, *, argument: str) -> Any:
    """The object that ``source`` (``"MODULE:ATTRIBUTE"``, the setting ``argument`` in errors) names, its module
    imported; it must be callable.

    Raises:
        ConfigError: ``source`` has not the form ``MODULE:ATTRIBUTE``, its module does not import here (the message
            names the missing module), it has no such attribute, or the attribute is not callable.

    >>> resolve_source("os.path:join", argument="network")("a", "b")
    'a/b'
    >>> resolve_source("os.path:sep", argument="network")
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: network='os.path:sep' names a str, not a callable; name a function or a class
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
    return found
