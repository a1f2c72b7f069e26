"""Videos of a policy (``rlstruct eval RUN --video PATH``): the file decodes back to the frames
that were written, at the env's frame size, and shows motion."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

iio = pytest.importorskip("imageio.v3", reason="videos need imageio: pip install 'rlstruct[video]'")

from rlstruct.algos._train.session import describe_env  # noqa: E402
from rlstruct.algos._train.video import (  # noqa: E402
    VideoResult,
    check_video_path,
    record_policy_video,
    run_video_path,
)
from rlstruct.algos.a2c import A2CConfig  # noqa: E402
from rlstruct.algos.dqn import DQNConfig  # noqa: E402
from rlstruct.algos.networks import build_actor_critic  # noqa: E402
from rlstruct.errors import MissingDependencyError, VideoError  # noqa: E402
from tests.helpers import rlstruct_in_process  # noqa: E402


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


needs_ffmpeg = pytest.mark.skipif(not _has("imageio_ffmpeg"), reason=".mp4 needs imageio-ffmpeg: "
                                  "pip install 'rlstruct[video]'")
needs_pygame = pytest.mark.skipif(not _has("pygame"), reason="gymnasium's classic-control frames need pygame: "
                                  "pip install 'rlstruct[video]'")
needs_ale = pytest.mark.skipif(not _has("ale_py"), reason="Atari needs ale-py: pip install 'rlstruct[atari]'")


def policy(env: str, backend: str) -> dict:
    """The arguments of record_policy_video for an untrained A2C policy (random weights: a policy all the same)."""
    config = dataclasses.asdict(A2CConfig(env=env, backend=backend, hidden_sizes=(16,)))
    spec = describe_env(env, backend, None)
    model = build_actor_critic(spec, config["hidden_sizes"])
    return {"algo": "a2c", "config": config, "env_spec": spec, "model_state": model.state_dict()}


def decoded(path: str) -> np.ndarray:
    return iio.imread(path, index=None)


def check_video(result: VideoResult, shape: tuple[int, int], episodes: int) -> np.ndarray:
    """Every frame written decodes back, at ``shape``, and they are not all the same picture."""
    frames = decoded(result.path)
    assert len(result.lengths) == episodes and all(n >= 1 for n in result.lengths)
    assert result.frames == sum(result.lengths) + episodes  # each episode's first frame, then one a step
    assert frames.shape == (result.frames, *shape, 3) and frames.dtype == np.uint8
    assert result.frame_shape == shape
    assert (frames != frames[:1]).any(axis=(1, 2, 3)).any(), "every frame is the same picture"
    return frames


@needs_pygame
@needs_ffmpeg
@pytest.mark.timeout(120)
def test_cartpole_torch_simulator_through_gymnasiums_renderer_to_mp4(tmp_path):
    args = policy("CartPole-v1", "torch")
    result = record_policy_video(tmp_path / "cartpole.mp4", **args, max_steps=15, seed=3)
    check_video(result, (400, 600), 1)
    assert result.lengths[0] <= 15 and result.returns[0] == result.lengths[0]  # CartPole: 1 a step
    assert result.fps == 50  # gymnasium's render_fps for CartPole
    again = record_policy_video(tmp_path / "again.mp4", **args, max_steps=15, seed=3)
    assert again.returns == result.returns and again.lengths == result.lengths, "greedy episodes must replay"


@needs_pygame
@needs_ffmpeg
@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", ["Acrobot-v1", "MountainCar-v0", "Pendulum-v1"])
def test_the_other_torch_simulators_render(tmp_path, env):
    result = record_policy_video(tmp_path / "episode.mp4", **policy(env, "torch"), max_steps=6)
    check_video(result, (500, 500) if env != "MountainCar-v0" else (400, 600), 1)
    assert result.lengths == (6,)


@needs_pygame
@pytest.mark.timeout(120)
def test_cartpole_gymnasium_backend_to_gif_two_episodes(tmp_path):
    from PIL import Image

    result = record_policy_video(tmp_path / "sub" / "cartpole.gif", **policy("CartPole-v1", "gymnasium"),
                                 episodes=2, max_steps=8, seed=0)
    assert len(result.lengths) == 2 and result.frames == sum(result.lengths) + 2
    frames = decoded(result.path)
    assert frames.shape[1:] == (400, 600, 3)
    assert (frames != frames[:1]).any(axis=(1, 2, 3)).any()
    # A GIF holds consecutive identical frames as one longer frame (pillow): the playing time is every frame's.
    with Image.open(result.path) as gif:
        durations = [gif.seek(k) or gif.info["duration"] for k in range(gif.n_frames)]
        assert gif.n_frames == frames.shape[0] <= result.frames
    assert sum(durations) == pytest.approx(result.frames * 1000 / result.fps)


@needs_ale
@needs_ffmpeg
@pytest.mark.timeout(120)
def test_atari_pong_ale_backend_records_the_agents_view(tmp_path):
    result = record_policy_video(tmp_path / "pong.mp4", **policy("ALE/Pong-v5", "ale"), max_steps=10)
    check_video(result, (168, 168), 1)  # ale-py's 84x84 scaled up twice
    assert result.lengths == (10,) and result.fps == 15


@pytest.mark.slow
@needs_ale
@needs_ffmpeg
@pytest.mark.timeout(180)
def test_atari_pong_gymnasium_backend_renders_rgb(tmp_path):
    result = record_policy_video(tmp_path / "pong.mp4", **policy("ALE/Pong-v5", "gymnasium"), max_steps=8)
    frames = check_video(result, (210, 160), 1)
    assert (frames[..., 0] != frames[..., 2]).any(), "gymnasium's Atari frames are in colour"


@pytest.mark.skipif(not _has("minatar"), reason="MinAtar needs minatar: pip install 'rlstruct[minatar]'")
@needs_ffmpeg
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gymnasium", "auto"])  # auto trains on the torch game, drawn by the reference
def test_minatar_float_grids_become_legible_uint8_frames(tmp_path, backend):
    import rlstruct.envs  # noqa: F401  (registers the MinAtar ids)

    result = record_policy_video(tmp_path / "breakout.mp4", **policy("MinAtar/Breakout-v1", backend), max_steps=6)
    check_video(result, (160, 160), 1)  # the 10x10 grid, 16 pixels a cell


@needs_pygame
@pytest.mark.skipif(not _has("minatar"), reason="MinAtar needs minatar: pip install 'rlstruct[minatar]'")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("env, backend", [("CartPole-v1", "torch"), ("MinAtar/Breakout-v1", "gymnasium")])
def test_recording_on_a_machine_without_display_prints_nothing(tmp_path, monkeypatch, capfd, env, backend):
    """Neither SDL's note on a missing display (printed from C while gymnasium's renderer starts pygame) nor
    gymnasium's notes on minatar's frames (no frame rate, float pixels), which the recorder handles, reach the
    console."""
    import rlstruct.envs  # noqa: F401  (registers the MinAtar ids)

    for variable in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.setenv(variable, "")  # restored after the test, set or not
        monkeypatch.delenv(variable)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record_policy_video(tmp_path / "episode.gif", **policy(env, backend), max_steps=3)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    assert capfd.readouterr().err == ""


@needs_pygame
@needs_ffmpeg
@pytest.mark.timeout(120)
def test_a_dqn_policy_records_greedy(tmp_path):
    from rlstruct.algos.dqn import q_network

    config = dataclasses.asdict(DQNConfig(env="CartPole-v1", hidden_sizes=(16,)))
    spec = describe_env("CartPole-v1", "torch", None)
    model = q_network(spec, config["hidden_sizes"])
    result = record_policy_video(tmp_path / "dqn.mp4", algo="dqn", config=config, env_spec=spec,
                                 model_state=model.state_dict(), max_steps=5)
    check_video(result, (400, 600), 1)


@needs_pygame
@pytest.mark.timeout(120)
def test_a_training_loop_can_record_between_iterations_without_changing_its_random_stream(tmp_path):
    import torch

    args = policy("CartPole-v1", "torch")
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    path = run_video_path(tmp_path / "run", 12800, suffix=".gif")
    assert path == tmp_path / "run" / "videos" / "step_000012800.gif"
    result = record_policy_video(path, **args, max_steps=4)
    assert torch.equal(torch.rand(3), expected), "recording a video moved torch's global generator"
    assert path.is_file() and result.frames == result.lengths[0] + 1
    with pytest.raises(VideoError, match=r"suffix must end in one of"):
        run_video_path(tmp_path, 0, suffix=".avi")


@needs_pygame
@pytest.mark.timeout(120)
def test_a_runs_videos_follow_its_evaluation_event_and_are_written_whole(tmp_path, monkeypatch):
    """Every second evaluation announced gives a video, recorded into a file beside it of the same suffix (the
    writer picks the format by it) and renamed onto its name once whole: a kill while it records leaves no cut video
    under the run's names, and a recording that raises leaves none."""
    from rlstruct.algos._train import video
    from rlstruct.algos._train.events import Evaluated

    args = policy("CartPole-v1", "torch")
    monkeypatch.setattr(video, "video_suffix", lambda: ".gif")
    recorded = []
    real = video.record_policy_video

    def recording(path, **kwargs):
        recorded.append(path.name)
        if len(recorded) == 2:
            path.write_bytes(b"GIF89a")  # what a recording cut short leaves
            raise VideoError("the renderer failed")
        return real(path, **kwargs)

    monkeypatch.setattr(video, "record_policy_video", recording)
    videos = video.RunVideos(2, tmp_path, algo="a2c", config={**args["config"], "evaluation_max_steps": 4},
                             spec=args["env_spec"], seed=0)
    for env_steps in (64, 128):
        videos.after_evaluation(Evaluated(row={"eval/return": 9.0}, env_steps=env_steps,
                                          weights=lambda: args["model_state"]))
    assert recorded == ["step_000000128.partial.gif"] and videos.paths == [run_video_path(tmp_path, 128, suffix=".gif")]
    with pytest.raises(VideoError, match="the renderer failed"):
        videos.record(args["model_state"], 192)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["step_000000128.gif"]
    assert decoded(str(videos.paths[0])).shape[0] >= 2


def test_an_unknown_suffix_is_a_video_error_naming_the_argument(tmp_path):
    with pytest.raises(VideoError, match=r"path must end in one of \['\.mp4', '\.gif'\], got '.*episode\.avi'"):
        record_policy_video(tmp_path / "episode.avi", **policy("CartPole-v1", "torch"))
    with pytest.raises(VideoError, match=r"--video must end in one of .* got 'episode'"):
        check_video_path("episode", argument="--video")
    assert not list(tmp_path.iterdir())


def test_a_backend_without_frames_is_a_video_error(tmp_path):
    args = policy("CartPole-v1", "torch")
    args["config"]["backend"] = "gymnax"
    with pytest.raises(VideoError, match=r"backend must be one of \['torch', 'gymnasium', 'ale'\] to render frames, "
                                         r"got 'gymnax' .*pass backend='gymnasium'"):
        record_policy_video(tmp_path / "episode.gif", **args)
    with pytest.raises(VideoError, match=r"has no torch simulator.*backend='gymnasium'"):
        record_policy_video(tmp_path / "episode.gif", **{**policy("CartPole-v1", "torch"),
                                                         "config": {**args["config"], "env": "Taxi-v3",
                                                                    "backend": "torch"}})


@pytest.mark.parametrize("kwargs, message", [
    ({"episodes": 0}, r"episodes must be an int >= 1, got 0"),
    ({"max_steps": 0}, r"max_steps must be an int >= 1 or None .*got 0"),
    ({"fps": 0}, r"fps must be > 0 or None .*got 0"),
])
def test_bad_counts_are_value_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        record_policy_video(tmp_path / "episode.gif", **policy("CartPole-v1", "torch"), **kwargs)


def test_mp4_without_imageio_ffmpeg_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(MissingDependencyError, match=r"\.mp4 needs imageio-ffmpeg.*rlstruct\[video\].*\.gif"):
        check_video_path("episode.mp4")
    assert check_video_path("episode.gif").suffix == ".gif"


def rlstruct(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlstruct.algos", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@needs_pygame
@pytest.mark.timeout(400)
def test_cli_eval_video_of_a_tiny_trained_run(tmp_path, tiny_cartpole_run, capsys):
    run = tiny_cartpole_run
    video = tmp_path / "out.gif"
    ev = rlstruct("eval", str(run), "--episodes", "2", "--max-steps", "20", "--video", str(video),
                  "--video-episodes", "2")
    assert ev.returncode == 0, ev.stderr
    assert ev.stderr == ""  # the command's own output only: no torch or gymnasium warning, no SDL note
    result = json.loads(ev.stdout.splitlines()[-1])
    assert result["video"] == str(video) and f"video: {video} (" in ev.stdout
    assert 4 <= result["video_frames"] <= 2 * 21
    frames = decoded(str(video))
    assert frames.shape[1:] == (400, 600, 3) and 2 <= frames.shape[0] <= result["video_frames"]
    assert (frames != frames[:1]).any(axis=(1, 2, 3)).any()

    bad = rlstruct_in_process(capsys, "eval", str(run), "--video", str(tmp_path / "out.avi"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "--video must end in one of ['.mp4', '.gif']" in bad.stderr
    bad = rlstruct_in_process(capsys, "eval", str(run), "--video", str(video), "--video-episodes", "0")
    assert bad.returncode == 2 and "--video-episodes must be >= 1, got 0" in bad.stderr
    bad = rlstruct_in_process(capsys, "eval", str(run), "--video", str(video), "--backend", "gymnax")
    assert bad.returncode == 2 and "backend must be one of ['torch', 'gymnasium', 'ale'] to render" in bad.stderr


# --------------------------------------------------------------------------- --video-every: videos during training
def _rows(path) -> list[dict[str, str]]:
    import csv

    with open(path) as f:
        return [{k: v for k, v in r.items() if k not in ("wall_time_s", "eval/blocked_s")} for r in csv.DictReader(f)]


@pytest.mark.slow
@needs_pygame
@needs_ffmpeg
@pytest.mark.timeout(180)
def test_video_every_records_after_every_nth_evaluation_and_the_final_policy_without_changing_the_run(tmp_path,
                                                                                                        capsys):
    """Both runs in this process, one after the other: each seeds itself, so rows equal to the bit say the videos
    drew nothing from the run's random streams."""
    flags = ["train", "ppo", "--env", "CartPole-v1", "--max-env-steps", "1024", "--n-envs", "8", "--n-steps", "32",
             "--eval-every", "2", "--n-evaluation-envs", "2", "--evaluation-max-steps", "30", "--no-progress",
             "--no-tensorboard", "--no-stop-at-reward-threshold", "--preset", "none"]
    plain = rlstruct_in_process(capsys, *flags, "--logdir", str(tmp_path / "plain"))
    filmed = rlstruct_in_process(capsys, *flags, "--logdir", str(tmp_path / "filmed"), "--video-every", "2")
    assert plain.returncode == 0 and filmed.returncode == 0, filmed.stderr
    rows = _rows(tmp_path / "filmed" / "progress.csv")
    assert rows == _rows(tmp_path / "plain" / "progress.csv"), "the videos changed the run"
    evaluations = [r for r in rows if r["eval/return"]]
    videos = sorted((tmp_path / "filmed" / "videos").iterdir())
    # every second evaluation (the untrained one counts), then the final policy's
    assert len(videos) == len(evaluations[:-1]) // 2 + 1 and videos[-1].name == "step_000001024.mp4"
    for video in videos:
        frames = decoded(str(video))
        assert frames.shape[1:] == (400, 600, 3) and 2 <= frames.shape[0] <= 31
    assert not (tmp_path / "plain" / "videos").exists()


@pytest.mark.slow
@needs_ale
@needs_ffmpeg
@pytest.mark.timeout(180)
def test_video_every_records_an_atari_dqn_run_from_the_agents_view(tmp_path, capsys):
    """In this process; a few gradient steps of the Nature CNN after its first 32 env steps (the run's cost: what is
    checked is its videos, which the untrained evaluation and the final policy each give)."""
    out = rlstruct_in_process(capsys, "train", "dqn", "--env", "ALE/Pong-v5", "--backend", "ale", "--max-env-steps",
                              "48", "--n-envs", "2", "--learning-starts", "32", "--buffer-size", "64",
                              "--batch-size", "16", "--eval-every", "50", "--n-evaluation-envs", "1",
                              "--evaluation-max-steps", "12", "--no-progress", "--no-tensorboard", "--video-every",
                              "1", "--logdir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    videos = sorted((tmp_path / "run" / "videos").iterdir())
    assert videos and all(decoded(str(v)).shape[1:] == (168, 168, 3) for v in videos)
    assert 2 <= decoded(str(videos[-1])).shape[0] <= 13


@pytest.mark.parametrize("flags, message", [
    (["--video-every", "-1"], "video_every must be an int >= 0 (0: no videos), got -1"),
    (["--backend", "gymnax", "--video-every", "1"],
     "video_every=1: backend must be one of ['torch', 'gymnasium', 'ale'] to render frames, got 'gymnax'"),
])
def test_bad_video_every_is_one_line_before_training(tmp_path, flags, message, capsys):
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "CartPole-v1", "--logdir", str(tmp_path / "run"), *flags)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@needs_pygame
@needs_ffmpeg
@pytest.mark.timeout(180)
def test_a_sampled_policy_records_its_draws_and_replays_them_with_the_same_seed(tmp_path):
    """A policy whose network is all zeros: greedy, it pushes left every step (the first of two tied actions) and the
    pole falls within about ten steps; sampled, it acts at random."""
    args = policy("CartPole-v1", "torch")
    args["model_state"] = {k: torch.zeros_like(v) for k, v in args["model_state"].items()}
    greedy = [record_policy_video(tmp_path / f"g{s}.mp4", **args, seed=s).returns[0] for s in range(3)]
    sampled = [record_policy_video(tmp_path / f"s{s}.mp4", **args, seed=s, policy="sample").returns[0]
               for s in range(3)]
    assert max(greedy) <= 12 and greedy != sampled
    again = record_policy_video(tmp_path / "again.mp4", **args, seed=2, policy="sample")
    assert again.returns[0] == sampled[2], "a sampled episode must replay with its seed"


def test_a_vecenv_factory_of_ones_own_is_refused_in_one_line_before_anything_is_built():
    from rlstruct.algos._train.video import check_renderable

    with pytest.raises(VideoError, match=r"env 'mylab.envs:make' is a VecEnv factory of your own, which rlstruct "
                                         r"cannot draw frames of; .* drop --video"):
        check_renderable("mylab.envs:make", "auto")
