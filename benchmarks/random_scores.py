"""The random-policy scores of the classic-control envs in the package's normalisation table
(``algos/data/score_table.json``): the mean return of a uniformly random policy over ``--episodes`` episodes of
gymnasium's own envs, each episode seeded ``--seed + i``, actions drawn from the action space seeded ``--seed``::

    python benchmarks/random_scores.py --episodes 100 --seed 0
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

ENVS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1", "LunarLander-v3")


def random_score(env_id: str, *, episodes: int, seed: int) -> float:
    """The mean undiscounted return of a uniformly random policy over ``episodes`` episodes of ``env_id``."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    try:
        for i in range(episodes):
            env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    out = {}
    for env_id in ENVS:
        try:
            out[env_id] = round(random_score(env_id, episodes=ns.episodes, seed=ns.seed), 2)
        except gym.error.DependencyNotInstalled as e:  # LunarLander without box2d
            print(f"{env_id}: skipped ({e})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
