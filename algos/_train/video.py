"""Videos of a policy: one episode rendered while the agent acts (:func:`record_agent_video`), the videos a
training run writes (:class:`RunVideos`), and those of a saved run (:func:`record_checkpoint_video`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import gymnasium as gym
import numpy as np
import torch

from rlstruct._sources import is_source
from rlstruct.algos._env_spec import EnvSpec, create_env, saved_evaluation_env_kwargs
from rlstruct.algos._train.checkpoints import load_checkpoint
from rlstruct.algos._train.durable import make_folder, written_whole
from rlstruct.algos._train.evaluation import evaluation_agent
from rlstruct.algos._train.registry import saved_algorithm
from rlstruct.envs import GymEnv, make_env
from rlstruct.envs.factory import TORCH_ENVS, resolve_backend
from rlstruct.errors import MissingDependencyError, VideoError
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor

if TYPE_CHECKING:
    from rlstruct.algos._train.events import Evaluated

__all__ = [
    "VIDEO_SUFFIXES",
    "RunVideos",
    "VideoOptions",
    "VideoResult",
    "check_renderable",
    "check_video_path",
    "check_videos",
    "record_agent_video",
    "record_checkpoint_video",
    "record_policy_video",
    "run_video_path",
    "video_suffix",
]


#: the formats written, by the path's suffix
VIDEO_SUFFIXES = (".mp4", ".gif")
#: backends whose envs give frames
_RENDERING_BACKENDS = ("torch", "gymnasium", "ale")
#: the gymnasium id whose renderer draws a torch simulator (CartPoleNoVel hides velocities, not the picture)
_RENDER_ID = {"CartPoleNoVel-v1": "CartPole-v1"}
#: frames whose shorter side is smaller are scaled up by a whole factor to reach it
_MIN_SIDE = 160
_INSTALL = "install it with `pip install 'rlstruct[video]'`"
#: gymnasium's notes on a renderer's frames that this module handles itself
_HANDLED_RENDER_NOTES = (r".*No render fps was declared in the environment",
                         r".*RGB-array rendering should return a numpy array with dtype uint8")


@dataclasses.dataclass(frozen=True)
class VideoResult:
    """What :func:`record_policy_video` wrote.

    Attributes:
        path: the video file.
        frames: frames written (each episode's first observation, then one per step).
        frame_shape: ``(height, width)`` of every frame.
        returns: each episode's undiscounted return (partial when cut at ``max_steps``).
        lengths: each episode's steps.
        fps: the frame rate written.
    """

    path: str
    frames: int
    frame_shape: tuple[int, int]
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    fps: float


def check_video_path(path: str | os.PathLike, *, argument: str = "path") -> Path:
    """``path`` as a :class:`~pathlib.Path` when its suffix is one of :data:`VIDEO_SUFFIXES` and what that format
    needs is installed; checked before anything is built.

    Raises:
        VideoError: another suffix.
        MissingDependencyError: imageio (or, for ``.mp4``, imageio-ffmpeg) is not installed.

    >>> check_video_path("runs/demo/episode.gif").suffix
    '.gif'
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise VideoError(f"{argument} must end in one of {list(VIDEO_SUFFIXES)}, got {str(path)!r}; "
                         "name the file e.g. episode.mp4 (ffmpeg) or episode.gif (pillow)")
    try:
        import imageio  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError(f"recording a video needs imageio; {_INSTALL}") from e
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            raise MissingDependencyError(f"{argument} {str(path)!r}: .mp4 needs imageio-ffmpeg (it ships ffmpeg); "
                                         f"{_INSTALL}, or write a .gif") from e
    return p


def _open_writer(path: Path, fps: float):
    import imageio.v2 as iio

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        # Pillow's GIF writer: duration per frame in milliseconds, loop forever.
        return iio.get_writer(path, format="GIF", mode="I", duration=1000.0 / fps, loop=0)
    # libx264 with yuv420p wants even sizes: every frame rendered here has them (a macro block of 16 would rescale
    # CartPole's 600x400).
    return iio.get_writer(path, format="FFMPEG", mode="I", fps=fps, macro_block_size=2)


def _gym_renderer(render_id: str, max_episode_steps: int | None,
                  env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    if render_id.startswith("ALE/"):
        from rlstruct.envs._imports import import_ale

        gym.register_envs(import_ale())
    kwargs = dict(env_kwargs or {})
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    _headless_sdl()
    env = gym.make(render_id, render_mode="rgb_array", **kwargs)
    if "rgb_array" not in env.metadata.get("render_modes", ()):
        env.close()
        raise VideoError(f"env {render_id!r} has no rgb_array render mode (it has "
                         f"{list(env.metadata.get('render_modes', ()))}); a video needs rgb_array frames")
    return env


def _headless_sdl() -> None:
    """Points SDL at its ``dummy`` video driver on a machine without a display (no ``DISPLAY``, ``WAYLAND_DISPLAY``
    or ``SDL_VIDEODRIVER``). Gymnasium's classic-control renderers initialise pygame's display even for
    ``rgb_array`` frames, drawn on an off-screen surface; there, SDL probes its X11 and Wayland drivers and prints
    ``error: XDG_RUNTIME_DIR is invalid or not set`` from C before it falls back. No window could open on such a
    machine anyway, so the variable stays set for the process."""
    if not any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")):
        os.environ["SDL_VIDEODRIVER"] = "dummy"


def _render(env: gym.Env, name: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            # Gymnasium's env checker notes, at the first frame, what minatar's renderer leaves out; both are handled
            # here: the frame rate is the caller's (30 by default) and float frames are converted below.
            for note in _HANDLED_RENDER_NOTES:
                warnings.filterwarnings("ignore", message=note, category=UserWarning)
            frame = env.render()
    except gym.error.DependencyNotInstalled as e:
        raise MissingDependencyError(f"rendering {name!r} needs a package that is not installed "
                                     f"({str(e).splitlines()[0]}); {_INSTALL}") from e
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
        raise VideoError(f"env {name!r} must render rgb_array frames [H, W, 3], got "
                         f"{type(frame).__name__} {getattr(frame, 'shape', '')}")
    if frame.dtype != np.uint8:  # MinAtar renders floats in [0, 1]
        frame = (np.clip(frame, 0.0, 1.0) * 255).round().astype(np.uint8)
    return _legible(frame)


def _legible(frame: np.ndarray) -> np.ndarray:
    """Frames as small as MinAtar's 10x10 grid or ale-py's 84x84 scaled up by whole pixels (nearest), so that a
    player shows them sharp."""
    scale = -(-_MIN_SIDE // min(frame.shape[:2]))
    return frame.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else frame


def _frame_source(name: str, backend: str, seed: int, max_episode_steps: int | None, physics_dtype: str,
                  env_kwargs: Mapping[str, Any] | None = None):
    """``(env, render, fps)``: one episodic env on the CPU (built with the constructor arguments ``env_kwargs``) and
    ``render(observation) -> uint8 [H, W, 3]``, called after ``reset`` and after each ``step`` with the env's newest
    observation."""
    if backend == "torch":
        env = create_env(name, 1, seed=seed, backend="torch", max_episode_steps=max_episode_steps,
                         physics_dtype=physics_dtype, env_kwargs=env_kwargs)
        viewer = _gym_renderer(_RENDER_ID.get(name, name), None)
        viewer.reset(seed=seed)
        inner = viewer.unwrapped

        def render(observation: DictTensor) -> np.ndarray:
            state = env.get_state()
            inner.state = state["physics"][0].to(torch.float64).numpy()
            if hasattr(inner, "last_u"):  # Pendulum draws the torque it was given
                inner.last_u = state["last_action"][0].to(torch.float64).numpy().reshape(-1)[0]
            return _render(viewer, name)

        env.close = _closing(env.close, viewer.close)
        return env, render, viewer.metadata.get("render_fps", 30)
    if backend == "gymnasium":
        viewer = _gym_renderer(name, max_episode_steps, env_kwargs)
        env = GymEnv([viewer], seed)
        return env, lambda observation: _render(viewer, name), viewer.metadata.get("render_fps", 30)
    env = make_env(name, 1, seed=seed, backend="ale", max_episode_steps=max_episode_steps, backend_kwargs=env_kwargs)

    def agent_view(observation: DictTensor) -> np.ndarray:
        grey = observation["frame"][0]
        grey = grey[-1] if grey.dim() == 3 else grey  # the newest of the stacked frames
        return _legible(grey.numpy()[:, :, None].repeat(3, axis=2))

    # ale-py steps 4 emulator frames per agent step at 60 frames a second.
    return env, agent_view, 15


def _closing(*closers: Callable[[], None]) -> Callable[[], None]:
    def close() -> None:
        for c in closers:
            c()

    return close


def check_renderable(name: str, backend: str) -> str:
    """The backend that renders env ``name`` (``backend`` resolved), checked before anything is built. ``"auto"``
    renders the MinAtar games, which its torch simulators step without drawing, through their reference game (the
    same rules and frames, minatar's palette).

    Raises:
        VideoError: a backend without frames, ``torch`` for an id rlstruct does not simulate, or a ``VecEnv`` factory
            of the user's own (``MODULE:CALLABLE``), whose frames rlstruct cannot draw.
    """
    if is_source(name):
        raise VideoError(f"env {name!r} is a VecEnv factory of your own, which rlstruct cannot draw frames of; a video "
                         "needs a gymnasium id, one of rlstruct's torch simulators or an ALE game: drop --video, and "
                         "render your env yourself")
    resolved = resolve_backend(name, backend)
    if backend == "auto" and resolved == "torch" and name not in TORCH_ENVS:
        resolved = "gymnasium"
    if resolved not in _RENDERING_BACKENDS:
        fix = ("pass backend='gymnasium'" if name in gym.registry else "record an env that gymnasium or ale-py has")
        raise VideoError(f"backend must be one of {list(_RENDERING_BACKENDS)} to render frames, got {resolved!r} "
                         f"for env {name!r}; {fix}")
    if resolved == "torch" and name not in TORCH_ENVS:
        raise VideoError(f"env {name!r} has no torch simulator to render; pass backend='gymnasium'")
    return resolved


def video_suffix() -> str:
    """``".mp4"`` when imageio-ffmpeg is installed, else ``".gif"``: the format of a run's videos."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return ".gif"
    return ".mp4"


def record_agent_video(video_path: Path, *, name: str, backend: str, spec: EnvSpec, agent: Any,
                       agent_info: DictTensor, episodes: int = 1, max_steps: int | None = None, seed: int = 0,
                       physics_dtype: str = "float64", fps: float | None = None,
                       env_kwargs: Mapping[str, Any] | None = None) -> VideoResult:
    """Records ``episodes`` episodes of ``agent`` (built and loaded, on the CPU; closed here) on env ``name`` stepped
    by ``backend`` (one of the rendering backends, resolved), to ``video_path`` (checked by
    :func:`check_video_path`). Episode ``k`` runs on env seed ``seed + k``, and the agent's draws are seeded by
    ``seed``; ``agent_info`` is one row; ``env_kwargs``
    are the env constructor's arguments (a run's evaluation envs').

    Raises:
        VideoError: frames of two sizes, or an env without ``rgb_array`` frames.
        MissingDependencyError: what the renderer needs is not installed.
    """
    limit = spec.max_episode_steps if max_steps is None else min(max_steps, spec.max_episode_steps)

    returns: list[float] = []
    lengths: list[int] = []
    frames, shape, writer, rate = 0, None, None, 0.0

    def write(frame: np.ndarray) -> None:
        nonlocal frames, shape
        if shape is None:
            shape = frame.shape[:2]
        elif frame.shape[:2] != shape:
            raise VideoError(f"env {name!r} rendered frames of two sizes, {shape} then {frame.shape[:2]}")
        writer.append_data(frame)
        frames += 1

    agent.seed(seed)  # a sampling policy's draws: the same for the same seed, like the env's
    try:
        with torch.no_grad():
            for k in range(episodes):
                env, render, env_fps = _frame_source(name, backend, (seed + k) % 2**31, spec.max_episode_steps,
                                                     physics_dtype, env_kwargs)
                try:
                    if writer is None:
                        rate = float(fps if fps is not None else env_fps)
                        writer = _open_writer(video_path, rate)
                    observation, _ = env.reset()
                    state = agent.initial_state(agent_info, 1)
                    write(render(observation))
                    total = torch.zeros(())
                    steps = 0
                    while steps < limit:
                        action, state = agent(state, observation, agent_info)
                        (step_obs, _), (observation, running) = env.step(action)
                        write(render(step_obs))
                        total += step_obs["reward"].sum()
                        steps += 1
                        if running.numel() == 0:
                            break
                finally:
                    env.close()
                returns.append(float(total))
                lengths.append(steps)
    finally:
        agent.close()
        if writer is not None:
            writer.close()
    return VideoResult(str(video_path), frames, (int(shape[0]), int(shape[1])), tuple(returns), tuple(lengths), rate)


def run_video_path(logdir: str | os.PathLike, env_steps: int, *, suffix: str = ".mp4") -> Path:
    """Where a training run keeps the video recorded at ``env_steps``: ``logdir/videos/step_<env_steps>.<suffix>``
    (zero-padded, so that the files sort in training order).

    >>> run_video_path("runs/demo", 12800, suffix=".gif").as_posix()
    'runs/demo/videos/step_000012800.gif'
    """
    return check_video_path(Path(logdir) / "videos" / f"step_{int(env_steps):09d}{suffix}", argument="suffix")


def check_videos(config: Any) -> None:
    """Checks a run's ``video_every`` before anything is built: ``>= 0``, and when set, an env whose backend renders
    frames and imageio installed.

    Raises:
        ValueError: ``video_every < 0``.
        VideoError: the env's backend gives no frames.
        MissingDependencyError: imageio is not installed.
    """
    if isinstance(config.video_every, bool) or not isinstance(config.video_every, int) or config.video_every < 0:
        raise ValueError(f"video_every must be an int >= 0 (0: no videos), got {config.video_every!r}; pass e.g. "
                         "--video-every 5 for a video every 5 evaluations")
    if config.video_every:
        try:
            check_renderable(config.env, config.backend)
        except VideoError as e:
            raise VideoError(f"video_every={config.video_every}: {e}; or pass --video-every 0") from e
        check_video_path(f"video{video_suffix()}", argument="video_every's video")


class RunVideos:
    """The videos of a training run (``--video-every N``): one episode of the evaluation's policy after every
    ``N``-th evaluation, with the weights the loop holds when its result arrives, and one of the final policy, into
    ``logdir/videos/`` (:func:`run_video_path`), each by :func:`record_policy_video`.

    Args:
        every: evaluations between two videos.
        logdir: the run's folder.
        algo: the algorithm's name.
        config: the run's config as a dict.
        spec: the env's description.
        seed: the env seed of the episodes.
    """

    def __init__(self, every: int, logdir: Path, *, algo: str, config: Mapping[str, Any], spec: EnvSpec, seed: int):
        check_renderable(config["env"], config["backend"])
        self.every, self.logdir, self.algo, self.config, self.spec, self.seed = every, Path(logdir), algo, config, \
            spec, seed
        self.suffix = video_suffix()
        self.evaluations = 0
        #: the videos written, in order
        self.paths: list[Path] = []

    def record(self, state_dict: Mapping[str, Any], env_steps: int) -> Path:
        """Records one episode of the policy with ``state_dict`` at ``env_steps``, written whole (the file a kill
        cuts short is a temporary one beside it), neither it nor ``videos`` a symbolic link; returns its path."""
        path = run_video_path(self.logdir, env_steps, suffix=self.suffix)
        make_folder(path.parent)
        # the temporary file keeps the suffix: the writer picks the format by it
        with written_whole(path, partial=path.with_name(f"{path.stem}.partial{path.suffix}")) as partial:
            record_policy_video(partial, algo=self.algo, config=self.config, env_spec=self.spec,
                                model_state=state_dict, max_steps=self.config.get("evaluation_max_steps"),
                                seed=self.seed)
        self.paths.append(path)
        return path

    def after_evaluation(self, evaluated: Evaluated) -> None:
        """Counts an evaluation of the run's evaluation event; records a video after every ``every``-th, with the
        weights the loop holds then."""
        self.evaluations += 1
        if self.evaluations % self.every == 0:
            self.record(evaluated.weights(), evaluated.env_steps)


class VideoOptions(TypedDict, total=False):
    """The keywords of a video of a policy that :func:`record_policy_video` takes and the functions that record
    through it pass on (each one's meaning and default are :func:`record_policy_video`'s)."""

    episodes: int
    max_steps: int | None
    seed: int
    backend: str | None
    fps: float | None
    policy: str | None


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
        env_spec: the run's :class:`~rlstruct.algos.EnvSpec` (or its dict).
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


def record_checkpoint_video(checkpoint: str | os.PathLike, path: str | os.PathLike,
                            **options: Unpack[VideoOptions]) -> VideoResult:
    """:func:`record_policy_video` of a ``checkpoint.pt`` written by ``rlstruct train`` (or its run's folder).

    Args:
        checkpoint: the checkpoint file, or its run's folder.
        path: the video file, as for :func:`record_policy_video`.
        **options: the keywords of :class:`VideoOptions`, with :func:`record_policy_video`'s defaults.

    Raises:
        CheckpointError: ``checkpoint`` is missing, unreadable or not an rlstruct checkpoint.
        ValueError: the errors of :func:`record_policy_video`.
    """
    check_video_path(path)  # before reading the checkpoint
    ckpt = load_checkpoint(checkpoint, argument="checkpoint")
    return record_policy_video(path, algo=saved_algorithm(ckpt), config=ckpt["config"], env_spec=ckpt["env_spec"],
                               model_state=ckpt["model"], **options)
