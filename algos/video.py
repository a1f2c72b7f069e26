"""Videos of a policy: greedy episodes of one env on the CPU, written to ``.mp4`` or ``.gif`` through imageio.

Where the frames come from depends on the env's backend:

* ``"torch"`` (rlstruct's classic-control simulators): gymnasium's own renderer draws the simulator's state. A
  gymnasium env of the same id (``render_mode="rgb_array"``) is given the torch env's physics row as its ``state``
  before each ``render()``, so the picture is gymnasium's, the dynamics rlstruct's.
* ``"gymnasium"`` (any id, ``ALE/...`` included): the env is made with ``render_mode="rgb_array"`` and renders
  itself.
* ``"ale"`` (ale-py's vector env, which has no ``render``): the agent's own view, the newest of its stacked
  grey 84x84 frames, as RGB.

Frames smaller than 160 pixels on a side (ale-py's 84x84, MinAtar's 10x10 grid) are scaled up by a whole factor.

Other backends (gymnax, mjx, mujoco_torch, brax, envpool) raise :class:`~rlstruct.errors.VideoError`; record
their policies with ``backend="gymnasium"`` where gymnasium has the id.

gymnasium's classic-control renderer needs ``pygame`` and ``.mp4`` needs ffmpeg (the ``imageio-ffmpeg`` wheel ships
it): ``pip install 'rlstruct[video]'``. ``.gif`` needs only imageio and pillow; pillow stores consecutive identical
frames as one frame shown for their total time, so a GIF can decode to fewer frames than were written (the same
playing time), where an ``.mp4`` decodes to every one.

:func:`record_policy_video` works from what a training loop's evaluation holds (the algorithm's name, its config,
the :class:`~rlstruct.algos.run.EnvSpec` and the CPU ``state_dict``); :func:`record_checkpoint_video` from a
``checkpoint.pt`` (``rlstruct eval RUN --video PATH``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from rlstruct.algos.checkpoints import load_checkpoint
from rlstruct.algos.env_spec import EnvSpec, saved_evaluation_env_kwargs
from rlstruct.algos.policy_of import evaluation_agent
from rlstruct.algos.recording import (
    VIDEO_SUFFIXES,
    VideoResult,
    check_renderable,
    check_video_path,
    record_agent_video,
    run_video_path,
)
from rlstruct.seeding import check_seed

__all__ = [
    "VIDEO_SUFFIXES",
    "VideoResult",
    "record_policy_video",
    "record_checkpoint_video",
    "check_video_path",
    "run_video_path",
]


def record_policy_video(
    path: str | os.PathLike,
    *,
    algo: str,
    config: Mapping[str, Any],
    env_spec: EnvSpec | Mapping[str, Any],
    model_state: Mapping[str, Any],
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    backend: str | None = None,
    fps: float | None = None,
    policy: str | None = None,
) -> VideoResult:
    """Records ``episodes`` episodes of a policy, one env on the CPU, to ``path`` (``.mp4`` or ``.gif``).

    The agent is the one the algorithm's evaluation builds (greedy: ``stochastic=False``, DQN's ``epsilon=0``; or
    as the run's ``evaluation_policy="sample"`` says) with ``model_state`` loaded. Episode ``k`` runs on env seed
    ``seed + k``. Each episode contributes its first frame and one frame per step, up to ``max_steps`` steps (so at
    most ``max_steps + 1`` frames). It runs in the calling
    process and leaves torch's global random state as it found it, so a training loop can call it between
    iterations (``--video-every``) without changing the run: the loop passes its config, env spec and the CPU
    ``state_dict`` it sends to its evaluation batcher, with :func:`run_video_path` as ``path``.

    Args:
        path: the video file; its suffix picks the format (:data:`VIDEO_SUFFIXES`). Parent folders are created.
        algo: the algorithm that trained the weights (``"a2c"``, ``"ppo"``, ``"dqn"``, ...).
        config: the run's config as a dict (``dataclasses.asdict`` of the algorithm's config, or a checkpoint's
            ``config``): ``env``, ``backend``, ``hidden_sizes`` and the network settings are read.
        env_spec: the run's :class:`~rlstruct.algos.run.EnvSpec` (or its dict).
        model_state: the policy's CPU ``state_dict``, as ``batcher.update`` sends it.
        episodes: episodes to record (``>= 1``).
        max_steps: steps per episode at most (``None``: the env's time limit).
        seed: the first episode's env seed.
        backend: env backend (default: the config's); see the module docstring for where frames come from. The
            run's evaluation env arguments (``evaluation_env_kwargs``) apply on its own backend only.
        fps: frames per second written (default: the env's ``render_fps``, 15 for ale-py's agent steps).
        policy: ``"greedy"`` or ``"sample"`` (``None``: the run's ``evaluation_policy``).

    Returns:
        A :class:`VideoResult`.

    Raises:
        VideoError: an unknown suffix, or a backend without frames.
        MissingDependencyError: imageio, imageio-ffmpeg (``.mp4``) or pygame (classic control) is missing.
        ValueError: ``episodes < 1``, ``max_steps < 1`` or ``fps <= 0``.
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be an int >= 1, got {episodes!r}; pass e.g. episodes=1")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be an int >= 1 or None (the env's time limit), got {max_steps!r}")
    if fps is not None and not fps > 0:
        raise ValueError(f"fps must be > 0 or None (the env's render_fps), got {fps!r}")
    seed = check_seed(seed)
    video_path = check_video_path(path)
    name = config["env"]
    resolved = check_renderable(name, backend or config.get("backend", "auto"))
    spec = env_spec if isinstance(env_spec, EnvSpec) else EnvSpec.from_dict(dict(env_spec))
    # Building the agent initialises a network from torch's global generator: a video recorded during training must
    # leave the run's random stream as it found it (the same seed gives the same run with and without videos).
    with torch.random.fork_rng(devices=[]):
        create_agent, agent_args, agent_info = evaluation_agent(algo, config, spec, policy=policy)
        agent = create_agent(**agent_args)
        agent.update(model_state)
        return record_agent_video(video_path, name=name, backend=resolved, spec=spec, agent=agent,
                                  agent_info=agent_info, episodes=episodes, max_steps=max_steps, seed=seed,
                                  physics_dtype=str(config.get("physics_dtype", "float64")), fps=fps,
                                  env_kwargs=saved_evaluation_env_kwargs(config, backend))


def record_checkpoint_video(
    checkpoint: str | os.PathLike,
    path: str | os.PathLike,
    *,
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    backend: str | None = None,
    fps: float | None = None,
    policy: str | None = None,
) -> VideoResult:
    """:func:`record_policy_video` of a ``checkpoint.pt`` written by ``rlstruct train`` (or its run's folder).

    Raises:
        FileNotFoundError: no such checkpoint.
        ValueError: the file is not an rlstruct checkpoint; the errors of :func:`record_policy_video`.
    """
    check_video_path(path)  # before reading the checkpoint
    ckpt = load_checkpoint(checkpoint)
    return record_policy_video(path, algo=ckpt["algo"], config=ckpt["config"], env_spec=ckpt["env_spec"],
                               model_state=ckpt["model"], episodes=episodes, max_steps=max_steps, seed=seed,
                               backend=backend, fps=fps, policy=policy)
