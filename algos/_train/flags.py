"""The flags of ``rlstruct train ALGO``, built from the algorithm's config dataclass: one ``--flag`` per field, in
the field's group, with the help written beside the field (:func:`~rlstruct.algos._train.config.setting`)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["OneLineParser", "GROUPS", "declared", "field_help", "build_parser", "resumed_defaults",
           "config_from_args", "given_flags", "show_config"]

#: the width of ``--help`` and the characters of one flag's help at most (two lines, the default included)
HELP_WIDTH, HELP_POSITION = 100, 32
#: the order of the ``--help`` groups; the algorithm's own settings come last
GROUPS = ("environment", "run", "evaluation", "checkpoints", "on-policy", "off-policy", "normalisation", "fast path")


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


def declared(config_cls: type, key: str) -> dict[str, Any]:
    """``{field: value}`` of the metadata ``key`` of each field of a config dataclass, from the nearest class of its
    MRO that declares the field with a value for ``key`` other than ``None`` (a field re-declared with
    :func:`~rlstruct.algos._train.config.default` keeps its base's); ``None`` where no class does.

    >>> from rlstruct.algos._train.config import OnPolicyConfig
    >>> declared(OnPolicyConfig, "group")["gamma"], declared(OnPolicyConfig, "group")["lr"]
    ('on-policy', 'run')
    """
    out = {}
    for f in dataclasses.fields(config_cls):
        values = [vars(base)["__dataclass_fields__"][f.name].metadata.get(key) for base in config_cls.__mro__
                  if f.name in vars(base).get("__dataclass_fields__", {})]
        out[f.name] = next((v for v in values if v is not None), None)
    return out


def field_help(config_cls: type) -> dict[str, tuple[str, str]]:
    """``{field: (help, group)}`` of a config dataclass, from each field's :func:`setting`. A field re-declared with
    :func:`~rlstruct.algos._train.config.default`, or without a group, keeps the help or the group of the base
    class's field; a field with no group anywhere is the algorithm's own (``"algorithm"``).

    >>> from rlstruct.algos._train.config import OnPolicyConfig
    >>> field_help(OnPolicyConfig)["lr"]
    ('Adam learning rate', 'run')
    """
    helps, groups = declared(config_cls, "help"), declared(config_cls, "group")
    return {name: (helps[name] or "", groups[name] or "algorithm") for name in helps}


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2 (argparse's own print the usage
    first): ``prog: error: argument --lr: invalid float value: 'abc' (prog --help lists the flags)``.

    A flag is never matched by a prefix of its name (argparse's ``allow_abbrev``, off): ``--max-env 3000`` is an
    error that names the flags it may mean, not a silent ``--max-env-steps 3000``, and a flag added later cannot
    change what an old command line means.

    >>> p = OneLineParser(prog="prog")
    >>> _ = p.add_argument("--max-env-steps", type=int)
    >>> p.unknown_flag_hint(["--max-env", "3000"])
    '; did you mean --max-env-steps?'
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def unknown_flag_hint(self, arguments: Sequence[str]) -> str:
        """``"; did you mean --flag?"`` for the first of ``arguments`` that is close to a flag of this parser (a
        prefix of one, or a close spelling), else ``""``."""
        flags = [o for o in self._option_string_actions if o.startswith("--")]
        for argument in arguments:
            if not argument.startswith("--"):
                continue
            name = argument.split("=", 1)[0]
            close = [f for f in flags if f.startswith(name)] or difflib.get_close_matches(name, flags, n=3)
            if close:
                return f"; did you mean {' or '.join(close[:3])}?"
        return ""

    def error(self, message: str) -> typing.NoReturn:
        """Prints ``message`` on one line and exits with status 2."""
        if message.startswith("unrecognized arguments: "):
            message += self.unknown_flag_hint(message.removeprefix("unrecognized arguments: ").split())
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=HELP_POSITION, width=HELP_WIDTH)


def build_parser(config_cls: type, prog: str, description: str = "", *,
                 algorithm_group: str = "the algorithm's settings") -> argparse.ArgumentParser:
    """An argument parser with one ``--flag-name`` per config field, grouped by :func:`field_help` (the algorithm's
    own under ``algorithm_group``)."""
    parser = OneLineParser(prog=prog, description=description, formatter_class=_Formatter,
                           usage="%(prog)s [-h] [--flag VALUE ...]",
                           epilog="The documentation's settings page describes each setting in full.")
    hints = typing.get_type_hints(config_cls)
    helps = field_help(config_cls)
    used = {group for _, group in helps.values()}
    sections = {title: parser.add_argument_group(algorithm_group if title == "algorithm" else title)
                for title in (*GROUPS, "algorithm") if title in used}
    for f in dataclasses.fields(config_cls):
        text, group = helps[f.name]
        hint = hints[f.name]
        kwargs: dict[str, Any] = {"default": f.default, "help": text, "dest": f.name}
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is tuple:
            kwargs.update(nargs="+", type=args[0])
        elif args and typing.get_origin(args[0]) is tuple:
            kwargs.update(type=_parse_optional(_comma_list(typing.get_args(args[0])[0])), metavar="A,B,...")
        elif args and typing.get_origin(args[0]) is dict:
            kwargs.update(type=_parse_optional(parse_json_object), metavar="JSON")
        elif args and type(None) in typing.get_args(hint):
            kwargs["type"] = _parse_optional(args[0])
        else:
            kwargs["type"] = hint
        sections[group].add_argument("--" + f.name.replace("_", "-"), **kwargs)
    return parser


def _comma_list(item: type) -> Callable[[str], tuple[Any, ...]]:
    """Parses ``"0,1,2"`` into a tuple of ``item``s (a flag of a tuple that may be ``None``)."""

    def parse(text: str) -> tuple[Any, ...]:
        return tuple(item(part) for part in text.split(",") if part.strip())

    parse.__name__ = f"comma-separated {item.__name__}s"
    return parse


def resumed_defaults(config_cls: type, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The settings of the run that a checkpoint (:func:`~rlstruct.algos._train.checkpoints.load_checkpoint`'s content)
    continues, as the defaults of ``config_cls``'s flags: ``rlstruct train ALGO --resume RUN`` takes the run's own
    settings, and a flag given overrides its value (a larger ``--max-env-steps``, say)."""
    saved = checkpoint["config"]
    # logdir: a resumed run writes into the checkpoint's folder unless told otherwise (the saved path may be
    # relative to another working directory).
    names = {f.name for f in dataclasses.fields(config_cls)} - {"resume", "logdir", "seeds"}
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


