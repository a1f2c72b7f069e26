"""The uniformly random policy's return in each torch MinAtar game: the floor a learning curve is read against.

Plays ``--episodes`` envs of ``make_env("MinAtar/<Game>-v1", N, backend="torch")`` (episodic, the ids' time limit)
to the end of their first episode, each action drawn uniformly from the game's minimal action set with
``torch.randint`` (seeded), and prints the mean return a game with its standard error. Only first episodes count:
those that end within a fixed number of steps would favour short ones.

Run: python benchmarks/minatar_random_policy.py [--episodes 1000] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from rlstruct import DictTensor
from rlstruct.envs import make_env

GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")


def random_policy_returns(game: str, episodes: int, seed: int) -> torch.Tensor:
    """The first episode's return of each of ``episodes`` envs under uniformly random actions: ``[episodes]``."""
    env = make_env(f"MinAtar/{game}-v1", episodes, backend="torch", seed=seed)
    generator = torch.Generator().manual_seed(seed)
    returns = torch.zeros(episodes)
    _, running = env.reset()
    while len(running):
        action = torch.randint(env.action_space.n, (len(running),), generator=generator)
        (observation, ids), (_, running) = env.step(DictTensor({"action": action}))
        returns[ids] += observation["reward"].float()
    env.close()
    return returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000, help="envs, one episode each (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="the envs' and the actions' seed (default: 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| game | random policy's return (mean +/- standard error) |")
    print("|:--|--:|")
    for game in GAMES:
        returns = random_policy_returns(game, args.episodes, args.seed)
        print(f"| {game} | {returns.mean():.2f} +/- {returns.std() / args.episodes ** 0.5:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
