"""The ``rlstruct`` command: ``rlstruct train {reinforce,a2c,dqn} [flags]``, ``rlstruct eval CHECKPOINT``,
``rlstruct autotune`` and ``rlstruct profile`` (the last two from :mod:`rlstruct.batchers`).

``rlstruct train ALGO --help`` lists every flag of the algorithm (one per field of its config dataclass).
Both commands print a JSON object as their last line on stdout; a bad setting (an unknown env, a device
this machine does not have) prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import torch

from rlstruct.batchers import RL_Batcher
from rlstruct.devices import check_device_exists
from rlstruct.errors import RLStructError
from rlstruct.structures import DictTensor

from rlstruct.algos._common import create_env, create_policy_agent, episode_returns, load_checkpoint

__all__ = ["ALGORITHMS", "main", "evaluate_checkpoint"]

#: algorithm name -> module under rlstruct.algos
ALGORITHMS = ("reinforce", "a2c", "dqn")


def _agent_of(algo: str) -> tuple[Any, DictTensor]:
    """The evaluation agent factory of ``algo`` and its greedy agent_info example."""
    if algo == "dqn":
        from rlstruct.algos.dqn import create_q_agent

        return create_q_agent, DictTensor({"epsilon": torch.zeros(1)})
    if algo in ("reinforce", "a2c"):
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
) -> dict[str, Any]:
    """Rebuilds the agent of a checkpoint and runs ``episodes`` greedy episodes.

    Args:
        path: a ``checkpoint.pt`` written by ``train``.
        episodes: episodes to run (one env each, per worker).
        device: where the evaluation envs and agent run.
        backend: env backend (default: the training run's).
        seed: env seed.
        n_processes: evaluation worker processes (0: this process).

    Returns:
        ``{"eval_return", "return_min", "return_max", "episodes", "env", "algo", "checkpoint"}``.

    Raises:
        DeviceUnavailableError: ``device`` does not exist here.
        ValueError: the file is not an rlstruct checkpoint, or ``episodes < 1``.
    """
    check_device_exists(device, argument="device")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    ckpt = load_checkpoint(path)
    cfg, spec = ckpt["config"], ckpt["env_spec"]
    create_agent, agent_info = _agent_of(ckpt["algo"])
    n_workers = max(n_processes, 1)
    per_worker = -(-episodes // n_workers)
    agent_args = {"obs_dim": spec["obs_dim"], "n_actions": spec["n_actions"],
                  "hidden_sizes": tuple(cfg["hidden_sizes"]), "device": device}
    env_args = {"name": cfg["env"], "n_envs": per_worker, "backend": backend or cfg["backend"],
                "max_episode_steps": spec["max_episode_steps"], "autoreset": False, "device": device}
    with RL_Batcher(spec["max_episode_steps"], create_agent, agent_args, create_env, env_args, n_processes,
                    [seed + k for k in range(n_workers)], agent_info=agent_info, device=device) as batcher:
        batcher.update(ckpt["model"])
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    returns, _ = episode_returns(traj)
    returns = returns[:episodes]
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
    parser.add_argument("checkpoint", help="checkpoint.pt written by rlstruct train")
    parser.add_argument("--episodes", type=int, default=16, help="episodes to run (default: 16)")
    parser.add_argument("--device", default="cpu", help="device of the evaluation envs and agent (default: cpu)")
    parser.add_argument("--backend", default=None, help="env backend (default: the training run's)")
    parser.add_argument("--seed", type=int, default=12345, help="env seed (default: 12345)")
    parser.add_argument("--n-processes", type=int, default=0, help="evaluation worker processes (default: 0)")
    ns = parser.parse_args(argv)
    try:
        check_device_exists(ns.device, argument="device")
        result = evaluate_checkpoint(ns.checkpoint, episodes=ns.episodes, device=ns.device, backend=ns.backend,
                                     seed=ns.seed, n_processes=ns.n_processes)
    except (ValueError, RLStructError, FileNotFoundError) as e:
        print(f"rlstruct eval: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"mean return over {result['episodes']} episodes of {result['env']}: {result['eval_return']:.2f}")
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlstruct`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: rlstruct train {reinforce,a2c,dqn} [flags]   (rlstruct train ALGO --help lists them)\n"
             "       rlstruct eval CHECKPOINT [--episodes N]\n"
             "       rlstruct autotune [--env ID] [--processes P ...]   (best envs per process and process count)\n"
             "       rlstruct profile [--env ID] [--n-envs N]   (where the time of a collect + learn loop goes)")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        if not rest or rest[0] not in ALGORITHMS:
            got = rest[0] if rest else "nothing"
            print(f"rlstruct train: error: the algorithm must be one of {', '.join(ALGORITHMS)}, got {got}",
                  file=sys.stderr)
            return 2
        module = importlib.import_module(f"rlstruct.algos.{rest[0]}")
        return module.main(rest[1:])
    if command == "eval":
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return _eval_command(rest)
    if command in ("autotune", "profile"):  # their parsers live beside their logic, in rlstruct.batchers
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return importlib.import_module(f"rlstruct.batchers.{command}").main(rest)
    print(f"rlstruct: error: unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
