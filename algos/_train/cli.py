"""The ``rlstruct`` command: ``rlstruct train ALGO [flags]``, ``rlstruct eval CHECKPOINT``, ``rlstruct export RUN``,
``rlstruct autotune`` and ``rlstruct profile`` (the last two run :mod:`rlstruct.algos._train.profile`),
``rlstruct compare`` (:mod:`~rlstruct.algos._train.compare`), ``rlstruct report``
(:mod:`~rlstruct.algos._train.report`) and ``rlstruct sweep``
(:mod:`~rlstruct.algos._train.sweep`).

``rlstruct train ALGO`` imports the algorithm's module alone and runs its ``main`` (see
:mod:`rlstruct.algos._train.flags`); ``rlstruct train ALGO --help`` lists its flags in groups. ``ALGO`` is a built-in
algorithm's name, ``MODULE:ATTRIBUTE`` of an algorithm description, or the name of an installed package's entry
point in the ``rlstruct.algorithms`` group (:func:`~rlstruct.algos._train.registry.algorithm`); as ``python -m``
does, ``rlstruct train``, ``profile`` and ``sweep`` find modules in the folder they run from (after the installed
ones), so that ``rlstruct train mylab.myalgo:ALGORITHM`` works from the folder that holds ``mylab``. The commands that
open a saved run (``eval``, ``export``, ``record``, ``train --resume``) import only the code it names that is
rlstruct's or an installed package's, and search the current folder only with ``--trust-code``
(:func:`~rlstruct.algos._train.registry.check_run_code`): a run folder may come from anyone.
Both commands print a JSON object as their last line on stdout; a bad setting (an unknown env, a device
this machine does not have) prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

import torch

from rlstruct import __version__
from rlstruct.algos._train.config import AUTOCAST_VALUES, EVALUATION_POLICIES
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.flags import OneLineParser, build_parser, config_from_args, given_flags
from rlstruct.algos._train.registry import (
    ALGORITHMS,
    ENTRY_POINT_GROUP,
    algorithm,
    check_run_code,
    entry_point_algorithms,
)
from rlstruct.algos._train.train_command import TRUST_CODE_HELP, configure_logging
from rlstruct.algos._train.train_command import main as train_main
from rlstruct.allocator import tune_allocator
from rlstruct.devices import check_device_exists
from rlstruct.errors import RLStructError
from rlstruct.seeding import check_seed

__all__ = ["main"]

def _search_current_folder() -> None:
    """Appends the current folder to ``sys.path`` (the installed packages stay first), as ``python -m`` puts it first:
    a console script's ``sys.path`` lacks it."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def _eval_command(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog="rlstruct eval", description="Evaluates a checkpoint's policy.")
    parser.add_argument("checkpoint", help="checkpoint.pt written by rlstruct train, or its run's log folder")
    parser.add_argument("--episodes", type=int, default=16, help="episodes to run (default: 16)")
    parser.add_argument("--device", default="cpu", help="device of the evaluation envs and agent (default: cpu)")
    parser.add_argument("--backend", default=None, help="env backend (default: the training run's)")
    parser.add_argument("--seed", type=int, default=12345, help="env seed (default: 12345)")
    parser.add_argument("--n-processes", type=int, default=0,
                        help="evaluation worker processes (default: 0); each seeds its envs and agent from --seed, "
                             "so the episodes, and the mean, depend on the split")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="steps per episode at most (default: the env's time limit)")
    parser.add_argument("--policy", default=None, choices=EVALUATION_POLICIES,
                        help="greedy: the policy's mode; sample: its draws as in training (default: the run's "
                             "--evaluation-policy)")
    parser.add_argument("--returns", action="store_true",
                        help="also give each episode's return in the JSON line (\"returns\")")
    parser.add_argument("--video", default=None, metavar="PATH",
                        help="also record episodes to PATH, .mp4 or .gif (pip install 'rlstruct[video]')")
    parser.add_argument("--video-episodes", type=int, default=1, metavar="N",
                        help="episodes in the video (default: 1), one env on the CPU, seeds --seed, --seed + 1, ...")
    parser.add_argument("--trust-code", action="store_true", help=TRUST_CODE_HELP)
    ns = parser.parse_args(argv)
    try:
        check_device_exists(ns.device, argument="device")
        # Every number is checked before anything runs, also those of an option not used (a video's episodes).
        for flag, value, least in (("--episodes", ns.episodes, 1), ("--video-episodes", ns.video_episodes, 1),
                                   ("--n-processes", ns.n_processes, 0), ("--max-steps", ns.max_steps or 1, 1)):
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}; pass e.g. {least or 2}")
        check_seed(ns.seed, argument="--seed")
        video = None
        if ns.video is not None:  # first: an env that cannot render fails before the evaluation runs
            from rlstruct.algos._train.checkpoints import load_checkpoint
            from rlstruct.algos._train.video import check_video_path, record_checkpoint_video

            check_video_path(ns.video, argument="--video")
            check_run_code(load_checkpoint(ns.checkpoint, argument="checkpoint"), ns.checkpoint,
                           trust_code=ns.trust_code)
            video = record_checkpoint_video(ns.checkpoint, ns.video, episodes=ns.video_episodes,
                                            max_steps=ns.max_steps, seed=ns.seed, backend=ns.backend,
                                            policy=ns.policy)
        result = evaluate_checkpoint(ns.checkpoint, episodes=ns.episodes, device=ns.device, backend=ns.backend,
                                     seed=ns.seed, n_processes=ns.n_processes, max_steps=ns.max_steps,
                                     policy=ns.policy, returns=ns.returns, trust_code=ns.trust_code)
        if video is not None:
            result["video"] = video.path
            result["video_frames"] = video.frames
    except (ValueError, RLStructError) as e:
        print(f"rlstruct eval: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"mean return over {result['episodes']} {result['policy']} episodes of {result['env']}: "
          f"{result['eval_return']:.2f}")
    if video is not None:
        print(f"video: {video.path} ({video.frames} frames)")
    print(json.dumps(result))
    return 0


def _export_command(argv: Sequence[str]) -> int:
    from rlstruct.algos._train.export import EXPORT_FORMATS, export_format
    from rlstruct.algos._train.policy import load
    from rlstruct.algos._train.run_folder import check_output

    parser = OneLineParser(prog="rlstruct export",
                           description="Writes a run's deterministic policy for onnxruntime or torch.jit.load.")
    parser.add_argument("run", help="a run's log folder, or its checkpoint.pt")
    parser.add_argument("--format", default=None, choices=list(EXPORT_FORMATS),
                        help="onnx or torchscript (default: by --output's suffix, .onnx or not)")
    parser.add_argument("--output", required=True, metavar="FILE", help="the file to write, e.g. policy.onnx")
    parser.add_argument("--trust-code", action="store_true", help=TRUST_CODE_HELP)
    ns = parser.parse_args(argv)
    try:
        check_output(ns.output, argument="--output")  # before the run is read: never one of its files
        path = load(ns.run, trust_code=ns.trust_code).export(ns.output, format=ns.format)
    except (ValueError, RLStructError, FileNotFoundError) as e:
        print(f"rlstruct export: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    print(json.dumps({"run": ns.run, "format": export_format(ns.output, ns.format), "output": path}))
    return 0


def _batchers_command(command: str, argv: Sequence[str]) -> int:
    """``rlstruct autotune`` and ``rlstruct profile``: the table, the PNG, and a JSON line last."""
    from rlstruct.algos._train import profile

    if command == "autotune":
        p = OneLineParser(prog="rlstruct autotune",
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
        p = OneLineParser(prog="rlstruct profile",
                                    description="Runs a few iterations of an algorithm's training loop and shows "
                                                "where the time goes. Any other flag of `rlstruct train ALGO` "
                                                "(IMPALA's --max-lag 2, say) sets that setting of the run.")
        p.add_argument("--algo", default="a2c", metavar="ALGO",
                       help=f"the algorithm to train: {', '.join(profile.profiled_algorithms())}, or "
                            "MODULE:ATTRIBUTE of another (default: a2c)")
        p.add_argument("--env", default="CartPole-v1", help="gymnasium id (default: CartPole-v1)")
        p.add_argument("--preset", default="none",
                       help="a preset of the algorithm (rlstruct presets) whose settings fill those not given, "
                            "'auto' the env's own (default: none)")
        p.add_argument("--n-envs", type=int, default=None,
                       help="envs in all, split over the workers (default: the preset run's, else 256)")
        p.add_argument("--n-processes", type=int, default=None,
                       help="batcher worker processes, 0: this one (default: the preset run's, else 0)")
        p.add_argument("--n-timesteps", type=int, default=None,
                       help="steps per acquisition (default: the preset run's, else 32)")
        p.add_argument("--iterations", type=int, default=10, help="profiled iterations (default: 10)")
        p.add_argument("--device", default="cpu", help="batcher device (default: cpu)")
        p.add_argument("--learner-device", default=None, help="learner device (default: --device)")
        p.add_argument("--backend", default="torch", help="env backend (default: torch)")
        p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
        p.add_argument("--no-sync", action="store_true", help="do not synchronize the GPU at phase boundaries")
        p.add_argument("--cuda-graph", action="store_true",
                       help="replay each acquisition as one CUDA graph (a GPU --device; RL_Batcher(cuda_graph=True))")
        p.add_argument("--overlap", action="store_true",
                       help="collect the next batch while learning on this one (rlstruct train --overlap)")
        p.add_argument("--physics-dtype", default="float64", choices=["float64", "float32"],
                       help="the torch simulators' physics precision (default: float64)")
        p.add_argument("--autocast", default="none", choices=AUTOCAST_VALUES,
                       help="the learn step's forward and the policy under torch.autocast (rlstruct train --autocast)")
        p.add_argument("--compile-policy", action="store_true",
                       help="compile the policy step with torch.compile (rlstruct train --compile-policy)")
        p.add_argument("--num-threads", type=int, default=None, help="torch threads of this process (default: torch's)")
        p.add_argument("--png", default="profile.png", help="bar chart to write (default: profile.png; '' for none)")
    ns, rest = (p.parse_args(argv), []) if command == "autotune" else p.parse_known_args(argv)
    try:
        settings = _algorithm_flags(ns.algo, rest) if rest else {}
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
                ns.env, algo=ns.algo, n_envs=ns.n_envs, n_processes=ns.n_processes, n_timesteps=ns.n_timesteps,
                iterations=ns.iterations, device=ns.device, learner_device=ns.learner_device,
                backend=ns.backend, seed=ns.seed, sync=not ns.no_sync, cuda_graph=ns.cuda_graph,
                overlap=ns.overlap, physics_dtype=ns.physics_dtype, autocast=ns.autocast,
                compile_policy=ns.compile_policy, preset=ns.preset, settings=settings,
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


def _algorithm_flags(algo: str, argv: Sequence[str]) -> dict:
    """The settings that flags of ``rlstruct train ALGO`` in ``argv`` give (``rlstruct profile --max-lag 2``): the
    flags ``rlstruct profile`` does not have, parsed by the parser of the algorithm's config; a flag neither knows
    exits 2 with that parser's usage."""
    config_cls = algorithm(algo).config_cls
    parser = build_parser(config_cls, prog=f"rlstruct profile --algo {algo}")
    given = given_flags(parser, argv)
    config = config_from_args(config_cls, parser.parse_args(argv), given)
    return {k: getattr(config, k) for k in given}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlstruct`` console script.

    A reader that closes the output early (``rlstruct presets | head``) ends the command quietly, as a Unix filter
    does, not with a traceback.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so that the interpreter's final flush does not fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, a shell's status for a writer whose reader left


def _algorithm_choices() -> str:
    """The algorithms ``rlstruct train`` offers, for its usage lines: the built-in ones and the installed ones."""
    return "{" + ",".join([*ALGORITHMS, *sorted(entry_point_algorithms())]) + "}"


def _main(argv: Sequence[str] | None) -> int:
    tune_allocator()
    argv = list(sys.argv[1:] if argv is None else argv)
    # The commands that name the user's own MODULE:ATTRIBUTE find it in the folder they run from; those that open a
    # saved run search it only with --trust-code (a shared run's folder may hold a module of the name it asks for).
    if argv and (argv[0] in ("train", "profile", "sweep") or "--trust-code" in argv[1:]):
        _search_current_folder()
    if argv == ["--version"]:
        print(f"rlstruct {__version__}")
        return 0
    usage = ("usage: rlstruct train ALGO [flags]   (ALGO: a built-in, MODULE:ATTRIBUTE or an installed one; "
             "rlstruct train --help lists them)\n"
             "       rlstruct eval CHECKPOINT [--episodes N] [--max-steps N] [--trust-code]\n"
             "       rlstruct autotune [--env ID] [--processes P ...]   (best envs per process and process count)\n"
             "       rlstruct profile [--algo A] [--env ID] [--preset P] [--n-envs N]   (where the time of the "
             "training loop goes)\n"
             "       rlstruct export RUN --output FILE [--format onnx|torchscript]   (the policy, for deployment)\n"
             "       rlstruct record RUN --episodes N --dataset-id ID   (a Minari dataset; pip install "
             "'rlstruct[datasets]')\n"
             "       rlstruct presets   (the tuned settings a run gets by naming its env)\n"
             "       rlstruct compare GROUP... [--json] [--curves FILE] [--table markdown|latex]   (IQM and intervals "
             "over seeds)\n"
             "       rlstruct report GROUP... --output report.html   (curves, statistics and runs on one page)\n"
             "       rlstruct sweep ALGO --env ID --trials N   (an Optuna search; pip install 'rlstruct[sweep]')\n"
             "       rlstruct --version")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        if rest and rest[0] in ("-h", "--help"):
            installed = entry_point_algorithms()
            listed = "".join(f"\n  {name:<12} {source}" for name, source in sorted(installed.items()))
            print(f"usage: rlstruct train {_algorithm_choices()} [flags]\n"
                  "       rlstruct train MODULE:ATTRIBUTE [flags]\n\n"
                  "Trains one algorithm; `rlstruct train ALGO --help` lists its flags.\n\n"
                  f"built-in: {', '.join(ALGORITHMS)}\n"
                  f"installed (entry points of {ENTRY_POINT_GROUP}):{listed or ' none'}\n"
                  "MODULE:ATTRIBUTE: an importable module and its algorithm description, e.g. mylab.myalgo:ALGORITHM")
            return 0
        if not rest or rest[0].startswith("-"):
            got = rest[0] if rest else "nothing"
            print(f"rlstruct train: error: the algorithm must be one of {', '.join(ALGORITHMS)}, an installed one or "
                  f"MODULE:ATTRIBUTE, got {got}; rlstruct train --help lists them", file=sys.stderr)
            return 2
        try:
            description = algorithm(rest[0])
        except KeyboardInterrupt:  # while torch imports: nothing to save yet
            print("rlstruct train: interrupted", file=sys.stderr)
            return 130
        except RLStructError as e:
            print(f"rlstruct train: error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        return train_main(description, rest[1:])
    if command == "eval":
        configure_logging()
        return _eval_command(rest)
    if command == "export":
        configure_logging()
        return _export_command(rest)
    if command == "presets":
        from rlstruct.algos._train.presets import list_presets

        print(list_presets())
        return 0
    if command == "record":
        from rlstruct.algos._train.record_cli import record_main

        configure_logging()
        return record_main(rest)
    if command == "compare":
        from rlstruct.algos._train.compare_cli import compare_main

        return compare_main(rest)
    if command == "report":
        from rlstruct.algos._train.report import report_main

        return report_main(rest)
    if command == "sweep":
        from rlstruct.algos._train.sweep import sweep_main

        configure_logging()
        return sweep_main(rest)
    if command in ("autotune", "profile"):
        configure_logging()
        return _batchers_command(command, rest)
    print(f"rlstruct: error: unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
