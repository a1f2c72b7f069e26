"""The ``rlstruct`` command: ``rlstruct train {reinforce,a2c,dqn,ppo,sac} [flags]``, ``rlstruct eval CHECKPOINT``,
``rlstruct autotune`` and ``rlstruct profile`` (the last two run :mod:`rlstruct.algos.profile`), and the
argument parser every algorithm's ``main`` builds from its config dataclass (:func:`run_main`).

``rlstruct train ALGO --help`` lists every flag of the algorithm (one per field of its config dataclass).
Both commands print a JSON object as their last line on stdout; a bad setting (an unknown env, a device
this machine does not have) prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import json
import logging
import re
import signal
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlstruct.algos.checkpoints import check_resume_exists, load_checkpoint
from rlstruct.algos.evaluation import run_episodes
from rlstruct.algos.networks import create_policy_agent
from rlstruct.algos.run import EnvSpec, Run, RunConfig, TrainResult, create_env
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import check_device_exists
from rlstruct.errors import RLStructError
from rlstruct.structures import DictTensor

__all__ = ["ALGORITHMS", "main", "evaluate_checkpoint", "field_docs", "build_parser", "config_from_args", "run_main"]

#: algorithm name -> module under rlstruct.algos
ALGORITHMS = ("reinforce", "a2c", "dqn", "ppo", "sac")
#: the evaluation's steps per acquisition for checkpoints written before the setting existed
EVALUATION_CHUNK_STEPS = RunConfig.evaluation_chunk_steps


def _agent_of(algo: str, config: dict[str, Any]) -> tuple[Any, DictTensor]:
    """The evaluation agent factory of ``algo`` (as its checkpoint's ``config`` built it) and its greedy
    agent_info example."""
    if config.get("recurrent"):
        from rlstruct.algos.recurrent import create_recurrent_agent

        return create_recurrent_agent, DictTensor({"stochastic": torch.zeros(1, dtype=torch.bool)})
    if algo == "dqn":
        from rlstruct.algos.dqn import create_q_agent

        return (functools.partial(create_q_agent, dueling=bool(config.get("dueling", False))),
                DictTensor({"epsilon": torch.zeros(1)}))
    if algo == "sac":
        from rlstruct.algos.sac import create_sac_agent

        return create_sac_agent, DictTensor({"stochastic": torch.zeros(1, dtype=torch.bool)})
    if algo in ("reinforce", "a2c", "ppo"):
        return create_policy_agent, DictTensor({"stochastic": torch.zeros(1, dtype=torch.bool)})
    raise ValueError(f"unknown algorithm {algo!r} in the checkpoint; expected one of {list(ALGORITHMS)}")


def evaluate_checkpoint(
    path: str,
    *,
    episodes: int = 16,
    device: str = "cpu",
    backend: str | None = None,
    seed: int = 12345,
    n_processes: int = 0,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Rebuilds the agent of a checkpoint and runs ``episodes`` greedy episodes.

    The episodes run in acquisitions of the training run's ``evaluation_chunk_steps`` steps (see
    :class:`~rlstruct.algos.evaluation.Evaluator`), up to the env's time limit.

    Args:
        path: a ``checkpoint.pt`` written by ``train``.
        episodes: episodes to run (one env each, per worker).
        device: where the evaluation envs and agent run.
        backend: env backend (default: the training run's).
        seed: env seed.
        n_processes: evaluation worker processes (0: this process).
        max_steps: steps per episode at most (``None``: the env's time limit); an episode cut there counts its
            partial return.

    Returns:
        ``{"eval_return", "return_min", "return_max", "episodes", "env", "algo", "checkpoint"}``.

    Raises:
        DeviceUnavailableError: ``device`` does not exist here.
        ValueError: the file is not an rlstruct checkpoint, ``episodes < 1`` or ``max_steps < 1``.
    """
    check_device_exists(device, argument="device")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 or None (the env's time limit), got {max_steps}")
    ckpt = load_checkpoint(path)
    cfg, spec = ckpt["config"], ckpt["env_spec"]
    create_agent, agent_info = _agent_of(ckpt["algo"], cfg)
    n_workers = max(n_processes, 1)
    per_worker = -(-episodes // n_workers)
    agent_args = {"spec": EnvSpec.from_dict(spec), "hidden_sizes": tuple(cfg["hidden_sizes"]), "device": device}
    if cfg.get("normalize_observations"):  # the network has the normalizer whose statistics the checkpoint holds
        agent_args["normalize_observations"] = True
    env_args = {"name": cfg["env"], "n_envs": per_worker, "backend": backend or cfg["backend"],
                "max_episode_steps": spec["max_episode_steps"], "autoreset": False, "device": device}
    if max_steps is None or max_steps > spec["max_episode_steps"]:
        max_steps = spec["max_episode_steps"]
    chunk = min(max_steps, cfg.get("evaluation_chunk_steps", EVALUATION_CHUNK_STEPS))
    with RL_Batcher(chunk, create_agent, agent_args, create_env, env_args, n_processes,
                    [seed + k for k in range(n_workers)], agent_info=agent_info, device=device) as batcher:
        batcher.update(ckpt["model"])
        tally = run_episodes(batcher, max_steps)
    returns = tally.returns[:episodes]
    return {
        "eval_return": float(returns.mean()),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
        "episodes": int(returns.shape[0]),
        "env": cfg["env"],
        "algo": ckpt["algo"],
        "checkpoint": str(path),
    }


def _eval_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlstruct eval", description="Evaluates a checkpoint's greedy policy.")
    parser.add_argument("checkpoint", help="checkpoint.pt written by rlstruct train, or its run's log folder")
    parser.add_argument("--episodes", type=int, default=16, help="episodes to run (default: 16)")
    parser.add_argument("--device", default="cpu", help="device of the evaluation envs and agent (default: cpu)")
    parser.add_argument("--backend", default=None, help="env backend (default: the training run's)")
    parser.add_argument("--seed", type=int, default=12345, help="env seed (default: 12345)")
    parser.add_argument("--n-processes", type=int, default=0,
                        help="evaluation worker processes (default: 0); worker k seeds its envs from --seed + k, so "
                             "the episodes, and the mean, depend on the split")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="steps per episode at most (default: the env's time limit)")
    parser.add_argument("--video", default=None, metavar="PATH",
                        help="also record greedy episodes to PATH, .mp4 or .gif (pip install 'rlstruct[video]')")
    parser.add_argument("--video-episodes", type=int, default=1, metavar="N",
                        help="episodes in the video (default: 1), one env on the CPU, seeds --seed, --seed + 1, ...")
    ns = parser.parse_args(argv)
    try:
        check_device_exists(ns.device, argument="device")
        video = None
        if ns.video is not None:  # first: an env that cannot render fails before the evaluation runs
            from rlstruct.algos.video import check_video_path, record_checkpoint_video

            check_video_path(ns.video, argument="--video")
            if ns.video_episodes < 1:
                raise ValueError(f"--video-episodes must be >= 1, got {ns.video_episodes}; pass e.g. 1")
            video = record_checkpoint_video(ns.checkpoint, ns.video, episodes=ns.video_episodes,
                                            max_steps=ns.max_steps, seed=ns.seed, backend=ns.backend)
        result = evaluate_checkpoint(ns.checkpoint, episodes=ns.episodes, device=ns.device, backend=ns.backend,
                                     seed=ns.seed, n_processes=ns.n_processes, max_steps=ns.max_steps)
        if video is not None:
            result["video"] = video.path
            result["video_frames"] = video.frames
    except (ValueError, RLStructError, FileNotFoundError) as e:
        print(f"rlstruct eval: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"mean return over {result['episodes']} episodes of {result['env']}: {result['eval_return']:.2f}")
    if video is not None:
        print(f"video: {video.path} ({video.frames} frames)")
    print(json.dumps(result))
    return 0


def _batchers_command(command: str, argv: Sequence[str]) -> int:
    """``rlstruct autotune`` and ``rlstruct profile``: the table, the PNG, and a JSON line last."""
    from rlstruct.algos import profile

    if command == "autotune":
        p = argparse.ArgumentParser(prog="rlstruct autotune",
                                    description="Finds the env count per process and the process count with the "
                                                "highest steps/s that fits in memory.")
        p.add_argument("--env", default="CartPole-v1", help="gymnasium id with discrete actions (default: CartPole-v1)")
        p.add_argument("--device", default="cpu", help="batcher device (default: cpu)")
        p.add_argument("--backend", default="torch", help="env backend (default: torch)")
        p.add_argument("--processes", type=int, nargs="+", default=[1, 2],
                       help="process counts to sweep, 0: this process (default: 1 2)")
        p.add_argument("--min-envs", type=int, default=128, help="first env count per process (default: 128)")
        p.add_argument("--max-envs", type=int, default=2**14, help="largest env count per process (default: 16384)")
        p.add_argument("--n-timesteps", type=int, default=32, help="steps per acquisition (default: 32)")
        p.add_argument("--iters", type=int, default=3, help="timed acquisitions per configuration (default: 3)")
        p.add_argument("--min-gain", type=float, default=0.1,
                       help="saturation threshold: steps/s gain per unit of extra memory (default: 0.1)")
        p.add_argument("--num-threads", type=int, default=None, help="torch threads of this process (default: torch's)")
        p.add_argument("--png", default="autotune.png", help="plot to write (default: autotune.png; '' for none)")
    else:
        p = argparse.ArgumentParser(prog="rlstruct profile",
                                    description="Runs a short collect + learn loop and shows where the time goes.")
        p.add_argument("--env", default="CartPole-v1", help="gymnasium id with discrete actions (default: CartPole-v1)")
        p.add_argument("--n-envs", type=int, default=256, help="envs per worker (default: 256)")
        p.add_argument("--n-processes", type=int, default=0, help="batcher worker processes, 0: this one (default: 0)")
        p.add_argument("--n-timesteps", type=int, default=32, help="steps per acquisition (default: 32)")
        p.add_argument("--iterations", type=int, default=10, help="profiled iterations (default: 10)")
        p.add_argument("--device", default="cpu", help="batcher device (default: cpu)")
        p.add_argument("--learner-device", default=None, help="learner device (default: --device)")
        p.add_argument("--backend", default="torch", help="env backend (default: torch)")
        p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
        p.add_argument("--no-sync", action="store_true", help="do not synchronize the GPU at phase boundaries")
        p.add_argument("--cuda-graph", action="store_true",
                       help="replay each acquisition as one CUDA graph (a GPU --device; RL_Batcher(cuda_graph=True))")
        p.add_argument("--zero-copy", action="store_true",
                       help="get() returns views of the batcher's buffer, not copies (RL_Batcher(zero_copy=True))")
        p.add_argument("--physics-dtype", default="float64", choices=["float64", "float32"],
                       help="the torch simulators' physics precision (default: float64)")
        p.add_argument("--autocast", default="none", choices=["none", "bfloat16"],
                       help="the loss's forward and the policy under torch.autocast (rlstruct train --autocast)")
        p.add_argument("--compile-policy", action="store_true",
                       help="compile the policy step with torch.compile (rlstruct train --compile-policy)")
        p.add_argument("--num-threads", type=int, default=None, help="torch threads of this process (default: torch's)")
        p.add_argument("--png", default="profile.png", help="bar chart to write (default: profile.png; '' for none)")
    ns = p.parse_args(argv)
    try:
        if ns.num_threads is not None:
            torch.set_num_threads(ns.num_threads)
        if command == "autotune":
            out = profile.autotune_batcher(
                ns.env, process_counts=ns.processes, min_envs=ns.min_envs, max_envs=ns.max_envs,
                n_timesteps=ns.n_timesteps, iters=ns.iters, device=ns.device, backend=ns.backend,
                min_gain_per_memory=ns.min_gain,
            )
        else:
            out = profile.profile_training(
                ns.env, n_envs=ns.n_envs, n_processes=ns.n_processes, n_timesteps=ns.n_timesteps,
                iterations=ns.iterations, device=ns.device, learner_device=ns.learner_device,
                backend=ns.backend, seed=ns.seed, sync=not ns.no_sync, cuda_graph=ns.cuda_graph,
                zero_copy=ns.zero_copy, physics_dtype=ns.physics_dtype, autocast=ns.autocast,
                compile_policy=ns.compile_policy,
            )
        png = out.plot(ns.png) if ns.png else None
    except (ValueError, RLStructError) as e:
        print(f"rlstruct {command}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(out.table())
    if png is not None:
        print(f"wrote {png}")
    print(json.dumps({**out.to_dict(), "png": None if png is None else str(png)}))
    return 0


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


def _parse_optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def build_parser(config_cls: type, prog: str, description: str = "") -> argparse.ArgumentParser:
    """An argument parser with one ``--flag-name`` per config field (help from :func:`field_docs`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        kwargs: dict[str, Any] = {"default": f.default, "help": docs.get(f.name, ""), "dest": f.name}
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is tuple:
            kwargs.update(nargs="+", type=args[0])
        elif args and type(None) in typing.get_args(hint):
            kwargs["type"] = _parse_optional(args[0])
        else:
            kwargs["type"] = hint
        parser.add_argument(flag, **kwargs)
    return parser


def resumed_defaults(config_cls: type, resume: str) -> dict[str, Any]:
    """The settings of the run that ``resume`` (a checkpoint or a run's folder) continues, as the defaults of
    ``config_cls``'s flags: ``rlstruct train ALGO --resume RUN`` takes the run's own settings, and a flag given
    overrides its value (a larger ``--max-env-steps``, say).

    Raises:
        FileNotFoundError: ``resume`` does not exist, or is a folder without a checkpoint.
        ValueError: it is not an rlstruct checkpoint.
    """
    check_resume_exists(resume)
    saved = load_checkpoint(resume)["config"]
    # logdir: a resumed run writes into the checkpoint's folder unless told otherwise (the saved path may be
    # relative to another working directory).
    names = {f.name for f in dataclasses.fields(config_cls)} - {"resume", "logdir"}
    return {k: v for k, v in saved.items() if k in names}


def config_from_args(config_cls: type, ns: argparse.Namespace):
    """Builds the config dataclass from parsed arguments (lists become tuples)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(config_cls)}
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def configure_logging() -> None:
    """Sends warnings of every ``rlstruct`` logger to stderr: the command line's choice, never a library's."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def run_main(train: Callable[[Any], TrainResult], config_cls: type, validate: Callable[[Any], None],
             argv: Sequence[str] | None, prog: str, description: str) -> int:
    """The body of every algorithm's ``main``: parse, validate, train, report.

    With ``--resume RUN``, the flags not given take the values of that run's config (:func:`resumed_defaults`).
    A config error (an unknown env, a device this machine does not have, a value out of range, a ``--resume``
    checkpoint that is missing or that the settings cannot continue) prints one line to stderr and returns 2.
    The last line on stdout is a JSON object with ``eval_return``, ``env_steps``, ``wall_time_s`` and ``logdir``
    (also written to ``summary.json`` in the log folder).

    Ctrl-C (SIGINT) stops training after the iteration under way (see
    :func:`~rlstruct.algos.run.training_run`): the checkpoint, the learning curve and the summary (with
    ``"interrupted": true``) are written, one line goes to stderr, and the status is 130 (128 + SIGINT, as
    for any command a terminal interrupts). A second Ctrl-C, or one before training starts, stops at once,
    also with status 130 and one line. SIGTERM (``timeout``, SLURM, ``docker stop``) does the same, with
    status 143 (128 + SIGTERM).
    """
    parser = build_parser(config_cls, prog, description)
    ns = parser.parse_args(argv)
    try:
        if ns.resume is not None:
            parser.set_defaults(**resumed_defaults(config_cls, ns.resume))
            ns = parser.parse_args(argv)
        config = config_from_args(config_cls, ns)
        validate(config)
    except (ValueError, TypeError, RLStructError, FileNotFoundError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    configure_logging()
    try:
        result = train(config)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted: stopped without writing a checkpoint", file=sys.stderr)
        return 130
    # The command ends here. Once torch._dynamo is imported (the first Adam does), the interpreter's final
    # garbage collections walk ~2000 modules for 1-2 s after the last line; frozen objects are skipped (they
    # are still freed by reference counting), so an interrupted run exits within its two seconds.
    gc.freeze()
    if result.interrupted:
        print(f"{prog}: interrupted after {result.env_steps} env steps ({result.wall_time_s:.1f} s): wrote "
              f"{result.checkpoint}, the learning curve and {Path(result.logdir) / Run.SUMMARY_NAME}", file=sys.stderr)
        print(json.dumps(result.summary()))
        return 128 + signal.Signals[result.stop_signal or "SIGINT"]
    if result.reached_target:
        print(f"an evaluation reached the target return {result.target_return:g}: stopped and kept those weights")
    print(f"final evaluation return {result.eval_return:.2f} after {result.env_steps} env steps "
          f"in {result.wall_time_s:.1f} s")
    print(f"logs: {Path(result.logdir) / Run.CSV_NAME} (TensorBoard: tensorboard --logdir {result.logdir})")
    if result.plot:
        print(f"learning curve: {result.plot}")
    print(f"checkpoint: {result.checkpoint} (rlstruct eval {result.checkpoint})")
    print(json.dumps(result.summary()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlstruct`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: rlstruct train {reinforce,a2c,dqn,ppo,sac} [flags]   (rlstruct train ALGO --help lists them)\n"
             "       rlstruct eval CHECKPOINT [--episodes N] [--max-steps N]\n"
             "       rlstruct autotune [--env ID] [--processes P ...]   (best envs per process and process count)\n"
             "       rlstruct profile [--env ID] [--n-envs N]   (where the time of a collect + learn loop goes)")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        if rest and rest[0] in ("-h", "--help"):
            print("usage: rlstruct train {" + ",".join(ALGORITHMS) + "} [flags]\n\n"
                  "Trains one algorithm; `rlstruct train ALGO --help` lists its flags.")
            return 0
        if not rest or rest[0] not in ALGORITHMS:
            got = rest[0] if rest else "nothing"
            print(f"rlstruct train: error: the algorithm must be one of {', '.join(ALGORITHMS)}, got {got}",
                  file=sys.stderr)
            return 2
        try:
            module = importlib.import_module(f"rlstruct.algos.{rest[0]}")
        except KeyboardInterrupt:  # while torch imports: nothing to save yet
            print("rlstruct train: interrupted", file=sys.stderr)
            return 130
        return module.main(rest[1:])
    if command == "eval":
        configure_logging()
        return _eval_command(rest)
    if command in ("autotune", "profile"):
        configure_logging()
        return _batchers_command(command, rest)
    print(f"rlstruct: error: unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
