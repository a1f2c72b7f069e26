"""``rlstruct record``: a trained run's episodes (or a random policy's) written as a Minari dataset
(:mod:`rlstruct.algos.datasets`); a JSON object last on stdout, a bad setting one line on stderr and status 2."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence

from rlstruct.algos._train.flags import OneLineParser
from rlstruct.devices import check_device_exists
from rlstruct.errors import RLStructError
from rlstruct.seeding import check_seed

__all__ = ["record_main"]


def record_main(argv: Sequence[str]) -> int:
    """Runs ``rlstruct record`` with ``argv`` (the arguments after ``record``); returns the exit status."""
    parser = OneLineParser(prog="rlstruct record",
                           description="Writes episodes of a run's policy, or of a random one, as a Minari dataset "
                                       "(pip install 'rlstruct[datasets]').")
    parser.add_argument("run", nargs="?", default=None, help="a run's log folder or checkpoint.pt")
    parser.add_argument("--dataset-id", required=True, metavar="ID",
                        help="Minari's NAMESPACE/NAME-vVERSION, e.g. rlstruct/cartpole-expert-v0")
    parser.add_argument("--episodes", type=int, required=True, help="episodes to write")
    parser.add_argument("--checkpoints", nargs="+", default=None, metavar="CKPT",
                        help="several checkpoints of one env instead of RUN, sharing the episodes (a mixed set)")
    parser.add_argument("--env", default=None, metavar="ID",
                        help="without RUN: record a uniformly random policy on this env")
    parser.add_argument("--policy", default=None, choices=("greedy", "sample"),
                        help="greedy: the policy's mode; sample: its draws as in training (default: the run's "
                             "--evaluation-policy, as rlstruct eval)")
    parser.add_argument("--epsilon", type=float, default=0.0,
                        help="probability of a uniform random action at each step (default: 0)")
    parser.add_argument("--seed", type=int, default=12345,
                        help="rlstruct eval's --seed: a run's episodes are those it plays (default: 12345)")
    parser.add_argument("--n-processes", type=int, default=0, help="batcher worker processes (default: 0)")
    parser.add_argument("--n-envs", type=int, default=None,
                        help="envs per worker (default: one per episode, at most 256)")
    parser.add_argument("--device", default="cpu", help="device of the envs and the policy (default: cpu)")
    parser.add_argument("--backend", default=None,
                        help="env backend (default: the run's; with --env, rlstruct's simulator where it has one)")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset of that id")
    parser.add_argument("--trust-code", action="store_true",
                        help="import the code the run names even from outside rlstruct and installed packages")
    parser.add_argument("--no-disk-check", action="store_true",
                        help="start even when the episodes, at the env's time limit, would not fit on the disk")
    ns = parser.parse_args(argv)
    command = shlex.join(["rlstruct", "record", *argv])
    try:
        from rlstruct.algos import datasets

        check_device_exists(ns.device, argument="--device")
        check_seed(ns.seed, argument="--seed")
        for flag, value, least in (("--episodes", ns.episodes, 1), ("--n-processes", ns.n_processes, 0),
                                   ("--n-envs", ns.n_envs or 1, 1)):
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}; pass e.g. {least or 2}")
        given = [name for name, value in (("RUN", ns.run), ("--checkpoints", ns.checkpoints), ("--env", ns.env))
                 if value is not None]
        if len(given) != 1:
            raise ValueError(f"rlstruct record takes one of RUN, --checkpoints or --env, got "
                             f"{' and '.join(given) or 'none'}; pass a run's folder, or --env ID for a random policy")
        if ns.env is not None:
            from rlstruct.algos import create_env
            from rlstruct.envs.factory import resolve_backend

            n_workers = max(ns.n_processes, 1)
            n_envs = ns.n_envs or min(-(-ns.episodes // n_workers), datasets.MAX_DEFAULT_ENVS)
            env_args = {"name": ns.env, "n_envs": n_envs, "backend": resolve_backend(ns.env, ns.backend or "auto"),
                        "device": ns.device}
            result = datasets.record(ns.dataset_id, None, None, create_env, env_args, episodes=ns.episodes,
                                     n_processes=ns.n_processes, seeds=ns.seed, agent_seeds=ns.seed,
                                     device=ns.device, epsilon=ns.epsilon, overwrite=ns.overwrite,
                                     check_disk=not ns.no_disk_check,
                                     metadata={"rlstruct": {"seed": ns.seed, "command": command}})
        else:
            result = datasets.record_run(ns.dataset_id, ns.checkpoints or ns.run, episodes=ns.episodes,
                                         policy=ns.policy, epsilon=ns.epsilon, seed=ns.seed,
                                         n_processes=ns.n_processes, n_envs=ns.n_envs, device=ns.device,
                                         backend=ns.backend, overwrite=ns.overwrite,
                                         check_disk=not ns.no_disk_check, command=command,
                                         trust_code=ns.trust_code)
    except (ValueError, RLStructError, FileNotFoundError, ImportError) as e:
        print(f"rlstruct record: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {result.episodes} episodes ({result.steps} steps, mean return {result.mean_return:.2f}) to "
          f"{result.dataset_id} at {result.path}")
    print(json.dumps({"dataset_id": result.dataset_id, "path": result.path, "episodes": result.episodes,
                      "steps": result.steps, "mean_return": result.mean_return}))
    return 0
