"""Tutorial 13: record episodes as a Minari dataset, then learn offline from it.

Offline RL, imitation learning and world models learn from recorded experience, and Minari is the format the
field reads (d3rlpy, TorchRL and Tianshou load it). ``rlstruct.algos.datasets.record`` plays whole episodes of any
agent through a batcher and writes each one as it ends; ``load`` reads a dataset back as ``Trajectories``, so that
the learner is written on the library's structures. Here a scripted CartPole controller is the expert, its episodes
are recorded, and a behaviour-cloning policy trained on them alone is evaluated.

Needs the ``datasets`` extra: ``pip install 'rlstruct[datasets]'``. Run it with
``python tutorials/13_record_then_learn_offline.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the episodes recorded and the gradient steps; the tests run
every tutorial with a small value.
"""

from __future__ import annotations

import os
import tempfile

import minari
import torch
from torch import nn

from rlstruct import RL_Agent, RL_Batcher
from rlstruct.algos import create_env
from rlstruct.algos.datasets import load, record
from rlstruct.structures import DictTensor

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


class Balancer(RL_Agent):
    """The scripted expert: push the cart towards where the pole falls (its angle, and its angular velocity)."""

    def __call__(self, state, observation, agent_info, history=None):
        frame = observation["frame"]
        return DictTensor({"action": (3.0 * frame[:, 2] + frame[:, 3] > 0).long()}), state


class Cloned(RL_Agent):
    """A network's most likely action."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, state, observation, agent_info, history=None):
        return DictTensor({"action": self.model(observation["frame"]).argmax(-1)}), state


def mean_return(create_agent, agent_args, episodes: int = 16) -> float:
    """One episode on each of ``episodes`` envs of an episodic batcher (its rows shrink as envs finish)."""
    with RL_Batcher(500, create_agent, agent_args, create_env, {"name": "CartPole-v1", "n_envs": episodes}, 0,
                    123) as batcher:
        batcher.reset()
        batcher.execute()
        trajectories, _ = batcher.get()
    tt = trajectories.trajectories
    return float((tt["_observation/reward"] * tt.mask()).sum(1).mean())


def record_the_expert(episodes: int) -> None:
    print("== 1. Record the expert's episodes, each one as it ends")
    # record(dataset_id, create_agent, agent_args, create_env, env_args, ...) takes what RL_Batcher takes; the
    # batcher auto-resets its envs and each episode is cut where it ends, across acquisitions. With
    # create_agent=None the actions are uniformly random: the "random" set of D4RL, which rlstruct record --env
    # writes too; epsilon=0.3 would mix random actions into the expert's.
    env_args = {"name": "CartPole-v1", "n_envs": min(episodes, 8)}
    expert = record("tutorial/cartpole-expert-v0", Balancer, {}, create_env, env_args, episodes=episodes, seeds=0,
                    agent_seeds=0)
    random = record("tutorial/cartpole-random-v0", None, None, create_env, env_args, episodes=episodes, seeds=0,
                    agent_seeds=0)
    print(f"   expert: {expert.episodes} episodes, {expert.steps} steps, mean return {expert.mean_return:.1f}")
    print(f"   random: {random.episodes} episodes, mean return {random.mean_return:.1f}")
    assert expert.episodes == random.episodes == episodes
    assert expert.mean_return > 400 and random.mean_return < 50

    # The dataset is Minari's own: any reader of the format opens it, recovers the env from the spec it keeps,
    # and normalises scores with the reference scores the package's table has for CartPole-v1.
    dataset = minari.load_dataset("tutorial/cartpole-expert-v0")
    first = dataset[0]
    # T steps keep T + 1 observations: the last one is where the episode ended.
    assert first.observations.shape == (len(first) + 1, 4)
    assert dataset.recover_environment().spec.id == "CartPole-v1"
    print(f"   normalised expert score: {float(minari.get_normalized_score(dataset, expert.mean_return)):.2f}")


def clone_the_expert(gradient_steps: int) -> None:
    print("== 2. Behaviour cloning on the dataset read back as Trajectories")
    # One row per episode, padded to the longest; lengths say which steps are real. The keys are a batcher's:
    # observation/frame is what the agent saw at step t, action/action what it did.
    trajectories = load("tutorial/cartpole-expert-v0")
    tt = trajectories.trajectories
    valid = tt.mask().bool()
    frames, actions = tt["observation/frame"][valid], tt["action/action"][valid]
    print(f"   {trajectories.n_elems()} episodes, {frames.shape[0]} steps")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(gradient_steps):
        batch = torch.randint(frames.shape[0], (256,))
        loss = nn.functional.cross_entropy(model(frames[batch]), actions[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = float((model(frames).argmax(-1) == actions).float().mean())
    cloned = mean_return(Cloned, {"model": model})
    print(f"   agreement with the expert: {accuracy:.1%}; the clone's mean return: {cloned:.1f}")
    # The clone never acted in the env while learning: what it knows came from the recorded steps.
    assert accuracy > 0.8
    assert cloned > 150


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        # Minari keeps datasets under MINARI_DATASETS_PATH (default ~/.minari/datasets): here, a scratch folder.
        os.environ["MINARI_DATASETS_PATH"] = folder
        record_the_expert(max(4, int(40 * SCALE)))
        clone_the_expert(max(300, int(1500 * SCALE)))
    print("tutorial 13: all claims hold")


if __name__ == "__main__":
    main()
