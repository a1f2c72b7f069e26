"""What an algorithm is, as data: its description (:class:`Algorithm`, which carries its family's training loop),
the two families' (:class:`OnPolicyAlgorithm`, with the :class:`OnPolicyModel` it learns, and
:class:`OffPolicyAlgorithm`), and the registry that finds the algorithms (:data:`ALGORITHMS`, :func:`algorithm`,
:func:`algorithm_source`). The command line's choices, ``rlstruct.algos``'s names, and the evaluation agent of a
saved run all come from here.

A description runs nothing: the harness trains one (:func:`~.session.validate`, :func:`~.loops.run`,
:func:`~.loops.train`, :func:`~.train_command.main` each take it) in the loop it names, so that this module sits
beneath the harness.
Adding a built-in algorithm is its module and one line in :data:`ALGORITHMS`. An algorithm from outside the package
is found by its source, the conventions Python users know: ``MODULE:ATTRIBUTE`` (an importable module and the name
of its description, as uvicorn's ``main:app``), or the name of an installed package's entry point in the
:data:`ENTRY_POINT_GROUP` group. A run records its algorithm's source (:func:`algorithm_source`), so that every
command that rebuilds the run resolves it the same way, in any process where its module imports.

A saved run travels (a colleague's folder, a paper's results), so opening one imports only the code it names that is
rlstruct's or an installed package's (:func:`check_run_code`) unless the user trusts it; a run records which
distribution held each module it named (:func:`run_code`), and ``--resume`` continues a run only with the algorithm
it recorded (:func:`check_resume_source`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlstruct._sources import is_source, module_distribution, resolve_source, source_module, untrusted_module
from rlstruct.algos._train.config import RolloutPart, check_evaluation_policy, check_off_policy, check_on_policy
from rlstruct.errors import AlgorithmSourceError, ConfigError, UntrustedCodeError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rlstruct.agents import RL_Agent
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.structures import DictTensor

__all__ = ["ALGORITHMS", "CODE_FIELDS", "ENTRY_POINT_GROUP", "Algorithm", "OffPolicyAlgorithm", "OnPolicyAlgorithm",
           "OnPolicyModel", "algorithm", "algorithm_source", "check_resume_source", "check_run_code",
           "entry_point_algorithms", "exports", "run_code", "saved_algorithm"]

log = logging.getLogger(__name__)

#: each algorithm's name (``rlstruct train NAME``, the module ``rlstruct.algos.NAME``) and the names its module gives
#: ``rlstruct.algos``
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "reinforce": ("ReinforceConfig", "reinforce_loss"),
    "a2c": ("A2CConfig", "a2c_loss"),
    "dqn": ("DQNConfig", "dqn_loss", "double_dqn_targets"),
    "ppo": ("PPOConfig", "ppo_loss"),
    "sac": ("SACConfig", "sac_actor_loss", "sac_critic_loss", "sac_temperature_loss"),
    "pqn": ("PQNConfig", "pqn_loss", "q_lambda_targets"),
    "td3": ("TD3Config", "td3_actor_loss", "td3_critic_loss", "td3_targets"),
    "impala": ("IMPALAConfig",),
}


#: the entry-point group through which an installed package offers its algorithms: ``NAME = "module:ATTRIBUTE"``
ENTRY_POINT_GROUP = "rlstruct.algorithms"


def _no_check(*args: Any) -> None:
    return None


#: the two families' loops by name, which :mod:`~.loops` hands in when it is imported (it imports this module, which
#: sits beneath the harness and imports none of it); every path to a description imports it first (the harness does)
FAMILY_LOOPS: dict[str, Callable[..., Any]] = {}


def _family_loop(name: str) -> Callable[[], Callable[..., Any]]:
    """The default ``loop`` of a family's description: the loop :mod:`~.loops` registered as ``name``."""

    def loop() -> Callable[..., Any]:
        try:
            return FAMILY_LOOPS[name]
        except KeyError:
            raise RuntimeError(f"the {name} loop is not registered: import rlstruct.algos.harness (which imports "
                               "the loops) before describing an algorithm of that family") from None

    return loop


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm:
    """An algorithm as the loops, the command line and the evaluation of a saved run see it. Each algorithm module
    holds one, ``ALGORITHM``, and :data:`ALGORITHMS` names the modules. A member of a family describes itself with
    the family's description (:class:`OnPolicyAlgorithm`, :class:`OffPolicyAlgorithm`), which names the family's
    loop; a new family is an :class:`Algorithm` with its own ``loop``.

    Attributes:
        name: the command's name (``rlstruct train a2c``), also the log folder's and the checkpoint's.
        title: the name in ``--help`` and in the learning curve's title, e.g. ``"A2C"``.
        config_cls: its config dataclass (a :class:`~.config.RunConfig` of its family).
        description: one line for ``--help``.
        agent: ``(config as a dict) -> agent factory``: the agent that acts with the run's weights in its evaluations,
            its videos, ``rlstruct eval`` (and the on-policy training batcher); a checkpoint's config rebuilds it.
        evaluation_info: ``(saved config, sample) -> agent_info`` (one value per key) of that agent: greedy, or
            acting as in training at its end when ``sample``.
        check_config: raises on the algorithm's own settings (after the shared and the family's ones are checked,
            before the env is built): ``(config) -> None``.
        check_env: raises when the algorithm cannot run on the env: ``(config, spec) -> None``.
        search_space: what ``rlstruct sweep`` searches by default: field -> a range or choices (the format of
            :mod:`~rlstruct.algos._train.search_space`).
        loop: its family's training loop (a :class:`~.family.TrainingLoop`): ``(setup, *, timer=None) ->
            TrainResult``; every command that trains (``train``, ``sweep``, ``profile``) runs it.
        steps_setting: the config field that sets each env's steps per iteration (``rlstruct profile
            --n-timesteps``); ``None``: an iteration's steps vary (whole episodes), which ``rlstruct profile``
            cannot budget.
        population_loop: its family's loop of a population of seeds (``--seeds``): ``(setups) -> [TrainResult]``,
            one checked :class:`~.session.Setup` and one result per member; ``None``: the family trains one seed a
            process (a new family provides one to train populations).
    """

    name: str
    title: str
    config_cls: type
    description: str
    agent: Callable[[Mapping[str, Any]], Callable[..., RL_Agent]]
    evaluation_info: Callable[[Mapping[str, Any], bool], dict[str, bool | float]]
    loop: Callable[..., Any]
    check_config: Callable[[Any], None] = _no_check
    check_env: Callable[[Any, EnvSpec], None] = _no_check
    search_space: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    steps_setting: str | None = None
    population_loop: Callable[..., Any] | None = None

    def check_family(self, config: Any) -> None:
        """Raises on the settings of the algorithm's family (its loop's)."""

    def evaluation_agent_info(self, config: Mapping[str, Any], policy: str | None = None) -> dict[str, bool | float]:
        """The ``agent_info`` of the evaluation agent of a run whose ``config`` (a dict) is given: by ``policy``
        (``"greedy"`` or ``"sample"``), or by the run's ``evaluation_policy`` (greedy when it has none)."""
        policy = config.get("evaluation_policy", "greedy") if policy is None else policy
        return self.evaluation_info(config, check_evaluation_policy(policy, argument="policy") == "sample")


@dataclasses.dataclass(frozen=True)
class OnPolicyModel:
    """The model an on-policy algorithm learns and the agents that run it, as the loop builds them.

    Attributes:
        agent: ``(config as a dict) -> agent factory`` of the batchers (see :class:`Algorithm`).
        evaluation_info: ``(config as a dict, sample) -> agent_info`` of the evaluation agent.
        explore: ``(config) -> agent_info`` of the training batcher, one value per key.
        build: ``(config, spec) -> model``, on the CPU; the batchers' agents (``agent``) build the same one.
        learner_agent: ``(model, device, config) -> agent`` that replays a collection on the learner.
        agent_kwargs: ``(config) -> (agent_kwargs, model_kwargs)`` of :func:`~.session.open_batchers`: the training
            agent's own keyword arguments, and both batchers' agents'.
        check_env: ``(title, config, spec) -> None``: raises when the model cannot run on the env; an algorithm's
            ``check_env`` unless it gives its own.
    """

    agent: Callable[[Mapping[str, Any]], Callable[..., RL_Agent]]
    evaluation_info: Callable[[Mapping[str, Any], bool], dict[str, bool | float]]
    explore: Callable[[Any], dict[str, bool | float]]
    build: Callable[[Any, EnvSpec], nn.Module]
    learner_agent: Callable[[nn.Module, torch.device, Any], RL_Agent]
    agent_kwargs: Callable[[Any], tuple[dict[str, object], dict[str, object]]]
    check_env: Callable[[str, Any, EnvSpec], None] = _no_check


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnPolicyAlgorithm(Algorithm):
    """An on-policy algorithm as :func:`~.loops.train_on_policy` runs it (see :class:`Algorithm` for the other
    fields). Its batchers' and evaluation's agents are its ``model``'s, and so is its ``check_env`` unless it gives
    its own; its collection is its config's: ``n_steps`` steps of auto-reset envs for a config with a
    :class:`~.config.RolloutPart`, else whole episodes.

    Attributes:
        make_learn: ``(config, learner) -> learn step`` (:data:`~.loops.LearnFn`).
        model: the model and its agents (:data:`~.actor_critic.ACTOR_CRITIC`, or another, e.g. PQN's Q-network).
        schedule: ``(config, env_steps, n_rows) -> (agent_info, statistics)``: the training ``agent_info``
            (``n_rows`` rows, CPU) of the next collection and the statistics it is recorded with (e.g. PQN's
            epsilon); ``None``: ``model.explore``'s throughout.
    """

    make_learn: Callable[[Any, Any], Callable[..., dict[str, Any]]]
    model: OnPolicyModel
    agent: Callable[[Mapping[str, Any]], Callable[..., RL_Agent]] = dataclasses.field(init=False)
    evaluation_info: Callable[[Mapping[str, Any], bool], dict[str, bool | float]] = dataclasses.field(init=False)
    schedule: Callable[[Any, int, int], tuple[DictTensor, dict[str, Any]]] | None = None
    loop: Callable[..., Any] = dataclasses.field(default_factory=_family_loop("on-policy"))
    population_loop: Callable[..., Any] | None = dataclasses.field(
        default_factory=_family_loop("on-policy population"))
    steps_setting: str | None = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "agent", self.model.agent)
        object.__setattr__(self, "evaluation_info", self.model.evaluation_info)
        object.__setattr__(self, "steps_setting", None if self.episodic else "n_steps")
        if self.check_env is _no_check:
            object.__setattr__(self, "check_env", functools.partial(self.model.check_env, self.title))

    @property
    def episodic(self) -> bool:
        """Whether it collects whole episodes (episodic envs, an acquisition as long as the time limit, the envs
        reset every iteration): its config has no :class:`~.config.RolloutPart`."""
        return not issubclass(self.config_cls, RolloutPart)

    def check_family(self, config: Any) -> None:
        """The on-policy settings' checks (:func:`~.config.check_on_policy`)."""
        check_on_policy(config, self.title)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OffPolicyAlgorithm(Algorithm):
    """An off-policy algorithm as :func:`~.loops.train_off_policy` runs it (see :class:`Algorithm` for the other
    fields).

    Attributes:
        make_learner: the learner's class (an :class:`~.loops.OffPolicyLearner`).
    """

    make_learner: type
    loop: Callable[..., Any] = dataclasses.field(default_factory=_family_loop("off-policy"))
    population_loop: Callable[..., Any] | None = dataclasses.field(
        default_factory=_family_loop("off-policy population"))
    steps_setting: str | None = "rollout_steps"

    def check_family(self, config: Any) -> None:
        """The off-policy settings' checks (:func:`~.config.check_off_policy`)."""
        check_off_policy(config, self.title)


def _offered() -> dict[str, list[tuple[str, str | None]]]:
    """``{name: [(value, distribution), ...]}`` of the entry points in :data:`ENTRY_POINT_GROUP`, every package's."""
    offered: dict[str, list[tuple[str, str | None]]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        offered.setdefault(ep.name, []).append((ep.value, None if dist is None else dist.metadata["Name"]))
    return offered


def entry_point_algorithms() -> dict[str, str]:
    """``{name: "module:ATTRIBUTE"}`` of the installed packages' entry points in :data:`ENTRY_POINT_GROUP`, read from
    their metadata without importing them (a name two packages offer: the first one's, which :func:`algorithm`
    refuses)."""
    return {name: offers[0][0] for name, offers in _offered().items()}


def _entry_point(name: str) -> str | None:
    """The ``"module:ATTRIBUTE"`` of the entry point ``name`` (``None``: none has that name).

    Raises:
        AlgorithmSourceError: installed packages offer the name with different values: which one the user means
            cannot be told.
    """
    offers = _offered().get(name)
    if not offers:
        return None
    if len(dict.fromkeys(value for value, _ in offers)) > 1:
        shown = " and ".join(repr(value) + (f" (package {dist})" if dist else "") for value, dist in offers)
        raise AlgorithmSourceError(f"entry point {name!r} of {ENTRY_POINT_GROUP} is offered {len(offers)} times, by "
                                   f"{shown}; uninstall all but one of those packages, or name the algorithm you "
                                   "mean as MODULE:ATTRIBUTE")
    return offers[0][0]


def _from_source(source: str, what: str) -> Algorithm:
    """The description that ``source`` (``"module:ATTRIBUTE"``) names; ``what`` says where the source came from, in
    the errors."""
    module_name, _, attribute = source.partition(":")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")) or not (
            attribute and all(part.isidentifier() for part in attribute.split("."))):
        raise AlgorithmSourceError(f"{what} must be MODULE:ATTRIBUTE (e.g. mylab.myalgo:ALGORITHM) or a built-in "
                                   f"algorithm's name, got {source!r}")
    if module_name == "__main__":
        raise AlgorithmSourceError(f"{what} {source!r} was defined in a script run as __main__, which another process "
                                   "cannot import; define ALGORITHM in an importable module and train it as "
                                   "rlstruct train MODULE:ALGORITHM")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise AlgorithmSourceError(f"{what} {source!r}: module {module_name!r} does not import: it needs "
                                       f"{e.name!r}, which is not installed ({e})") from e
        raise AlgorithmSourceError(f"{what} {source!r}: no module named {e.name!r} here; run from the folder that "
                                   "holds it, add that folder to PYTHONPATH, or pip install its package") from e
    except Exception as e:  # a module that fails as it imports: its own error, in one line
        raise AlgorithmSourceError(f"{what} {source!r}: module {module_name!r} does not import: "
                                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise AlgorithmSourceError(f"{what} {source!r}: module {module_name!r} has no attribute {attribute!r}; "
                                       "name the module's algorithm description (usually ALGORITHM)")
        found = getattr(found, part)
    if not isinstance(found, Algorithm):
        raise AlgorithmSourceError(f"{what} {source!r} is a {type(found).__name__}, not an algorithm description; "
                                   "name an Algorithm, OnPolicyAlgorithm or OffPolicyAlgorithm "
                                   "(rlstruct.algos.harness), usually the module's ALGORITHM")
    builtin = f"rlstruct.algos.{found.name}"
    if found.name in ALGORITHMS and module_name != builtin:
        raise AlgorithmSourceError(f"{what} {source!r} is named {found.name!r}, the name of the built-in algorithm "
                                   f"{builtin}; give its description another name (Algorithm(name=...))")
    return found


def algorithm(name: str) -> Algorithm:
    """The description (``ALGORITHM``) of the algorithm ``name``: a built-in algorithm's name (its module imported
    on first use), ``"module:ATTRIBUTE"``, or the name of an entry point of :data:`ENTRY_POINT_GROUP`.

    Raises:
        AlgorithmSourceError: (a ``ValueError``) no algorithm has that name; its module is not importable or fails as
            it imports; the attribute is missing or no :class:`Algorithm`; it takes a built-in algorithm's name; or
            two installed packages offer an entry point of that name.

    >>> algorithm("ppo").title
    'PPO'
    """
    if name in ALGORITHMS:
        return importlib.import_module(f"rlstruct.algos.{name}").ALGORITHM
    if ":" in name:
        return _from_source(name, "algorithm")
    offered = _entry_point(name)
    if offered is not None:
        found = _from_source(offered, f"entry point {name!r} of {ENTRY_POINT_GROUP}")
        if found.name != name:
            raise AlgorithmSourceError(f"entry point {name!r} of {ENTRY_POINT_GROUP} names {offered!r}, whose "
                                       f"name is {found.name!r}; name the entry point {found.name!r}")
        return found
    installed = entry_point_algorithms()
    extra = f", an installed one ({', '.join(sorted(installed))})" if installed else ""
    raise AlgorithmSourceError(f"unknown algorithm {name!r}; expected one of {list(ALGORITHMS)}{extra}, or "
                               "MODULE:ATTRIBUTE of an algorithm description (e.g. mylab.myalgo:ALGORITHM)")


def algorithm_source(description: Algorithm) -> str:
    """What a run records of where ``description`` came from, for :func:`algorithm` to find it again in another
    process: a built-in algorithm's name, else ``"module:ATTRIBUTE"`` of the module that holds it (the module its
    config class is defined in, or the one its learn step is; for a module run with ``python -m``, its import name).

    >>> from rlstruct.algos import ppo
    >>> algorithm_source(ppo.ALGORITHM)
    'ppo'
    """
    if description.config_cls.__module__ == f"rlstruct.algos.{description.name}":
        return description.name
    source = _outside_source(description)
    if source.startswith("__main__:"):
        # It trains; the run it writes is what no other process can open, so the user hears it now, not at eval.
        log.warning("the algorithm %r is defined in __main__ (a notebook cell, or a script run as a file): this run "
                    "trains, but rlstruct eval, export and train --resume, in another process, cannot import it; "
                    "define it in a module and train it as MODULE:ALGORITHM", description.name)
    return source


def _outside_source(description: Algorithm) -> str:
    """``"module:ATTRIBUTE"`` of the module that holds an algorithm from outside the package
    (:func:`algorithm_source`)."""
    hints = [description.config_cls.__module__, getattr(description.loop, "__module__", None),
             getattr(getattr(description, "make_learn", None) or getattr(description, "make_learner", None),
                     "__module__", None)]
    for module_name in dict.fromkeys(h for h in hints if h):
        module = sys.modules.get(module_name)
        names = [k for k, v in vars(module).items() if v is description] if module is not None else []
        if names:
            attribute = "ALGORITHM" if "ALGORITHM" in names else sorted(names)[0]
            spec = getattr(module, "__spec__", None)
            if module_name == "__main__" and spec is not None and spec.name != "__main__":
                module_name = spec.name  # python -m mylab.myalgo: importable by that name
            return f"{module_name}:{attribute}"
    return f"{description.config_cls.__module__}:ALGORITHM"


def saved_algorithm(record: Mapping[str, Any]) -> str:
    """The source of a saved run's algorithm, from its checkpoint or ``config.json`` (``record``): the
    ``"algorithm"`` it recorded, or the name (``"algo"``) of a run saved before runs recorded a source."""
    return record.get("algorithm") or record["algo"]


#: the settings of a run that name code it imports: its algorithm's source, its network factory, its env
CODE_FIELDS = ("algorithm", "network", "env")


def _named_code(source: Any, config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(setting, value, module)`` of each module a run imports when it is rebuilt: its algorithm's (``source``, as
    :func:`saved_algorithm` gives it), its network factory's and its env's (``config``'s ``network`` and ``env``)."""
    if not isinstance(source, str):
        raise AlgorithmSourceError(f"a run's algorithm must be a name or MODULE:ATTRIBUTE, got {source!r}; pass a run "
                                   "written by rlstruct train")
    if source in ALGORITHMS:
        module: str | None = f"rlstruct.algos.{source}"
    else:
        offered = source if ":" in source else _entry_point(source)
        module = None if offered is None else offered.partition(":")[0]
    named = [] if module is None else [("algorithm", source, module)]
    for field in ("network", "env"):
        module = source_module(field, config.get(field))
        if module is not None:
            named.append((field, config[field], module))
    return named


def run_code(source: str, config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What a run records of the code it imports (``"code"`` in ``config.json`` and the checkpoints): for each of
    its algorithm (``source``, :func:`algorithm_source`), network factory and env module (``config``'s), the
    setting's value, the module, and the installed distribution that holds the module with its version (``None``:
    none does, e.g. a module of the folder the run was trained from).

    >>> run_code("ppo", {"env": "CartPole-v1", "network": None})["algorithm"]["distribution"]
    'rlstruct'
    """
    code = {}
    for field, value, module in _named_code(source, config):
        found = module_distribution(module)
        code[field] = {"source": value, "module": module, "distribution": None if found is None else found[0],
                       "version": None if found is None else found[1]}
    return code


def check_run_code(checkpoint: Mapping[str, Any], run: str | os.PathLike, *, trust_code: bool = False,
                   fields: Iterable[str] = CODE_FIELDS) -> None:
    """Refuses a saved run (``checkpoint``, the content of ``run``) that names code neither rlstruct's nor an
    installed package's, before any of it is imported: a module in the run's folder, one the current folder
    provides, on ``PYTHONPATH`` only, or Python's own (:func:`~rlstruct._sources.untrusted_module`); then checks that
    the factories the run names in installed packages are factories, before anything calls them. A run opened
    travels (a colleague's folder, a downloaded one): what it names must not run unless the user says so.

    Args:
        checkpoint: :func:`~.checkpoints.load_checkpoint`'s content.
        run: its path (a run's folder or its checkpoint), in the messages.
        trust_code: the user trusts the run's code (``--trust-code``): nothing is checked here.
        fields: the settings (of :data:`CODE_FIELDS`) whose modules are the run's, not the caller's (``--resume``
            leaves out the algorithm the command names, and the settings its flags give).

    Raises:
        UntrustedCodeError: (a ``ConfigError``) a module is refused; the message names the setting, the module, the
            modules the run needs, and ``--trust-code``.
        ConfigError: a factory that does not resolve in its installed package.

    >>> check_run_code({"algo": "ppo", "config": {"env": "evil:make"}}, "runs/x")
    Traceback (most recent call last):
    ...
    rlstruct.errors.UntrustedCodeError: env='evil:make' of the run 'runs/x' names module 'evil', which is not \
installed here; opening a run imports only rlstruct's and installed packages' code (this run needs: env evil): pass \
--trust-code (trust_code=True in Python) if you trust the run's code
    """
    if trust_code:
        return
    config = checkpoint.get("config")
    named = [n for n in _named_code(saved_algorithm(checkpoint), config if isinstance(config, Mapping) else {})
             if n[0] in set(fields)]
    folder = Path(run) if Path(run).is_dir() else Path(run).parent
    needs = ", ".join(f"{field} {module}" for field, _, module in named if not module.startswith("rlstruct."))
    for field, value, module in named:
        reason = untrusted_module(module, run_folder=folder)
        if reason is not None:
            raise UntrustedCodeError(f"{field}={value!r} of the run {os.fspath(run)!r} names module {module!r}, "
                                     f"{reason}; opening a run imports only rlstruct's and installed packages' code "
                                     f"(this run needs: {needs}): pass --trust-code (trust_code=True in Python) if you "
                                     "trust the run's code")
    for field, value, _ in named:
        if field != "algorithm" and is_source(value):
            resolve_source(value, argument=field, same_package=True)


def check_resume_source(description: Algorithm, resume: str | os.PathLike, checkpoint: Mapping[str, Any]) -> None:
    """Checks that ``description`` is the algorithm the run of ``checkpoint`` (the content of ``resume``) recorded:
    the same ``MODULE:ATTRIBUTE`` (:func:`algorithm_source`), from the same installed distribution when both are
    known; another module whose description has the same name would train on and rewrite the run.

    Raises:
        ConfigError: the sources or the distributions differ.
    """
    recorded = checkpoint.get("algorithm")
    if recorded is None:  # a run saved before runs recorded a source: check_resume_algorithm compared the name
        return
    mine = algorithm_source(description)
    if recorded != mine:
        raise ConfigError(f"resume={os.fspath(resume)!r} is a run of the algorithm {recorded!r}, got {mine!r}, another "
                          f"description named {description.name!r}; resume it with rlstruct train {recorded}, or start "
                          "a new run without --resume")
    code = checkpoint.get("code")
    entry = code.get("algorithm") if isinstance(code, Mapping) else None
    before = entry.get("distribution") if isinstance(entry, Mapping) else None
    if before is None:  # trained from a module no installed package held: its source is all there is to compare
        return
    now = module_distribution(f"rlstruct.algos.{mine}" if mine in ALGORITHMS else mine.partition(":")[0])
    if now is not None and before != now[0]:
        raise ConfigError(f"resume={os.fspath(resume)!r} is a run of {recorded!r} from the installed package "
                          f"{before!r}, got {recorded!r} from {now[0]!r}; install {before!r} to resume it, or start a "
                          "new run without --resume")
    if now is not None and entry.get("version") != now[1]:
        log.warning("resume=%r was trained with %s %s; resuming it with %s %s", os.fspath(resume), before,
                    entry.get("version"), before, now[1])


def exports() -> dict[str, str]:
    """``{name: module}`` of the names the algorithm modules give ``rlstruct.algos``.

    >>> exports()["PPOConfig"]
    'rlstruct.algos.ppo'
    """
    return {export: f"rlstruct.algos.{name}" for name, names in ALGORITHMS.items() for export in names}
