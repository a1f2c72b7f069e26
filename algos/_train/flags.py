"""``rlstruct train ALGO``: the argument parser every algorithm's command builds from its config dataclass, and the
command's body (:func:`run_main`: parse, check once, train, report).

``--help`` lists one flag per field of the config, in groups (the environment, the run, the evaluation, the
checkpoints, the fast path, the normalisation, the algorithm's own), each with the first clause of the field's
description; the full descriptions are the config dataclasses' docstrings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["OneLineParser", "field_docs", "short_help", "help_groups", "build_parser", "resumed_defaults",
           "config_from_args", "given_flags", "show_config"]

#: the width of ``--help`` and the characters of one flag's help at most (two lines, the default included)
HELP_WIDTH, HELP_POSITION = 100, 32
HELP_CHARS = 2 * (HELP_WIDTH - HELP_POSITION) - 12


def field_docs(cls: type) -> dict[str, str]:
    """The description of every field, read from the ``Attributes:`` sections of the docstrings along the MRO.

    A description that wraps onto more-indented lines is joined into one line; a subclass's description of a
    field replaces its base's.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Config:
    ...     '''Settings.
    ...
    ...     Attributes:
    ...         gamma: the discount factor, which wraps
    ...             onto a second line.
    ...         lr: Adam learning rate.
    ...     '''
    ...     gamma: float = 0.99
    ...     lr: float = 1e-3
    >>> field_docs(Config)
    {'gamma': 'the discount factor, which wraps onto a second line.', 'lr': 'Adam learning rate.'}
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        section = re.split(r"\n[ \t]*Attributes:[ \t]*\n", klass.__doc__ or "", maxsplit=1)
        if len(section) < 2:
            continue
        name, indent = None, None
        for line in section[1].splitlines():
            depth = len(line) - len(line.lstrip())
            if not line.strip():
                name = None
                continue
            if indent is None:
                indent = depth
            if depth < indent:
                break  # the next section of the docstring
            m = re.match(r"(\w+)(?: \(.*?\))?: (.*)$", line.strip())
            if depth == indent and m:
                name = m.group(1)
                docs[name] = m.group(2).strip()
            elif depth > indent and name is not None:
                docs[name] += " " + line.strip()
    return docs


def parse_json_object(text: str) -> dict[str, Any]:
    """A dict-valued flag's text: a JSON object (:func:`_parse_optional` takes ``none``).

    >>> parse_json_object('{"episodic_life": true, "noop_max": 0}')
    {'episodic_life': True, 'noop_max': 0}
    >>> parse_json_object("episodic_life=true")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a JSON object such as '{"episodic_life": true}' (quoted for the shell), or \
none; got 'episodic_life=true' (Expecting value at character 0)
    """
    example = """'{"episodic_life": true}' (quoted for the shell), or none"""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}; got {text!r} ({e.msg} at "
                                         f"character {e.pos})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}; got {text!r}, a JSON "
                                         f"{type(value).__name__}")
    return value


def _parse_optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def short_help(doc: str, limit: int = HELP_CHARS) -> str:
    """The first clause of a field's description (up to the first ``;``, ``:`` or sentence end outside
    parentheses), shortened to ``limit`` characters: what ``--help`` shows of it.

    >>> short_help("steps per update (the batcher's n_timesteps); more is slower.")
    "steps per update (the batcher's n_timesteps)"
    >>> short_help("a long one (with an aside that is long) and more words", limit=30)
    'a long one and more words'
    """
    depth, end = 0, len(doc)
    for i, ch in enumerate(doc):
        depth += ch == "("
        depth -= ch == ")"
        sentence_end = ch == "." and (i + 1 == len(doc) or doc[i + 1] == " ") and doc[max(i - 3, 0):i] not in (
            "e.g", "i.e", "etc")
        if depth == 0 and (ch in ";:" or sentence_end):
            end = i
            break
    text = doc[:end].strip()
    if len(text) > limit:
        text = re.sub(r"\s*\([^()]*(?:\([^()]*\)[^()]*)*\)", "", text)
    if len(text) > limit:
        text = text[: limit - 4].rsplit(" ", 1)[0] + " ..."
    return text


def help_groups(config_cls: type) -> dict[str, str]:
    """The ``--help`` group of every field of ``config_cls``: the ``HELP_GROUPS`` (``{field: group}``) or
    ``HELP_GROUP`` (every field it declares) of the first class along the MRO that declares it, else the
    algorithm's own settings (``"algorithm"``)."""
    groups: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        for name in vars(klass).get("__annotations__", {}):
            if name in groups or name.isupper():
                continue
            by_field = vars(klass).get("HELP_GROUPS", {})
            groups[name] = by_field.get(name) or vars(klass).get("HELP_GROUP") or "algorithm"
    return groups


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2 (argparse's own print the usage
    first): ``prog: error: argument --lr: invalid float value: 'abc' (prog --help lists the flags)``."""

    def error(self, message: str) -> typing.NoReturn:
        """Prints ``message`` on one line and exits with status 2."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=HELP_POSITION, width=HELP_WIDTH)


def build_parser(config_cls: type, prog: str, description: str = "", *,
                 algorithm_group: str = "the algorithm's settings") -> argparse.ArgumentParser:
    """An argument parser with one ``--flag-name`` per config field, in the groups of :func:`help_groups` (the
    algorithm's own under ``algorithm_group``), each with :func:`short_help` of its description."""
    parser = OneLineParser(prog=prog, description=description, formatter_class=_Formatter,
                                     usage="%(prog)s [-h] [--flag VALUE ...]",
                                     epilog=f"The settings are described in full in help({config_cls.__module__}."
                                            f"{config_cls.__qualname__}).")
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    groups = help_groups(config_cls)
    sections: dict[str, argparse._ArgumentGroup] = {}
    for title in (*dict.fromkeys(g for g in groups.values() if g != "algorithm"), "algorithm"):
        if title in groups.values():
            sections[title] = parser.add_argument_group(algorithm_group if title == "algorithm" else title)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        # Two lines at most with the " (default: ...)" that the formatter appends.
        limit = HELP_CHARS - len(f" (default: {f.default})")
        kwargs: dict[str, Any] = {"default": f.default, "help": short_help(docs.get(f.name, ""), limit), "dest": f.name}
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is tuple:
            kwargs.update(nargs="+", type=args[0])
        elif args and typing.get_origin(args[0]) is dict:
            kwargs.update(type=_parse_optional(parse_json_object), metavar="JSON")
        elif args and type(None) in typing.get_args(hint):
            kwargs["type"] = _parse_optional(args[0])
        else:
            kwargs["type"] = hint
        sections[groups[f.name]].add_argument(flag, **kwargs)
    return parser


def resumed_defaults(config_cls: type, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The settings of the run that a checkpoint (:func:`~rlstruct.algos._train.checkpoints.load_checkpoint`'s content)
    continues, as the defaults of ``config_cls``'s flags: ``rlstruct train ALGO --resume RUN`` takes the run's own
    settings, and a flag given overrides its value (a larger ``--max-env-steps``, say)."""
    saved = checkpoint["config"]
    # logdir: a resumed run writes into the checkpoint's folder unless told otherwise (the saved path may be
    # relative to another working directory).
    names = {f.name for f in dataclasses.fields(config_cls)} - {"resume", "logdir"}
    return {k: v for k, v in saved.items() if k in names}


def config_from_args(config_cls: type, ns: argparse.Namespace, given: Iterable[str] | None = None):
    """Builds the config dataclass from parsed arguments (lists become tuples), passing the fields of ``given``
    only (None: every field), so that a preset fills the others (:func:`~.presets.apply_preset`)."""
    names = [f.name for f in dataclasses.fields(config_cls)]
    values = {k: getattr(ns, k) for k in names if given is None or k in given}
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


_UNSET = object()


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> frozenset[str]:
    """The config fields whose flags ``argv`` gives (abbreviated or not, ``--no-x`` included): ``argv`` parsed
    again with every default replaced by a marker.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Config:
    ...     lr: float = 1e-3
    ...     gamma: float = 0.99
    ...     progress: bool = True
    >>> sorted(given_flags(build_parser(Config, "prog"), ["--lr", "1e-3", "--no-progress"]))
    ['lr', 'progress']
    """
    dests = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    parser.set_defaults(**dict.fromkeys(dests, _UNSET))
    try:
        ns = parser.parse_args(argv)
    finally:
        parser.set_defaults(**dests)
    return frozenset(k for k, v in vars(ns).items() if v is not _UNSET)


def show_config(config: Any, sources: dict[str, str]) -> str:
    """The settings of a run, one per line: the flag, the value and where it came from.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Config:
    ...     lr: float = 1e-3
    ...     n_envs: int = 16
    >>> print(show_config(Config(lr=2e-3), {"lr": "preset x", "n_envs": "default"}))
    --lr      0.002  preset x
    --n-envs  16     default
    """
    def shown(value: Any) -> str:
        if isinstance(value, tuple):
            return " ".join(map(str, value))
        return json.dumps(value) if isinstance(value, dict) else str(value)

    rows = [("--" + f.name.replace("_", "-"), shown(getattr(config, f.name)), sources[f.name])
            for f in dataclasses.fields(config)]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows)


