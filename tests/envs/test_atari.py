"""Atari from the command line: PPO and DQN on Breakout's frames with the Nature-DQN CNN (skipped without ale-py).

``backend="ale"`` gives ale-py's preprocessed frames (``uint8 [4, 84, 84]``: 84x84 grayscale, 4 stacked); the
gymnasium backend's ``ALE/`` ids give gymnasium's raw RGB frames (``uint8 [210, 160, 3]``, channel-last), which the
CNN permutes. A few hundred steps each: the pipeline runs, checkpoints, and ``rlstruct eval`` reloads it. Without
``--max-episode-steps`` a run takes ALE's own episode cap (27,000 agent steps) and evaluates in acquisitions of
``--evaluation-chunk-steps`` steps.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("ale_py", reason="the atari extra is not installed: pip install 'rlstruct[atari]'")

from rlstruct.algos import describe_env  # noqa: E402
from rlstruct.algos._train.session import validate
from tests.helpers import rlstruct_in_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
# No --max-episode-steps: the episodes are capped by ALE (27,000 steps). The evaluations (an untrained greedy policy
# may never press FIRE) are cut by the run's own option, and their buffer holds 32 steps: a whole episode of frames
# would be 1.5 GB per env (observation and next observation).
SMALL = ["--n-envs", "4", "--n-evaluation-envs", "1", "--evaluation-max-steps", "40", "--evaluation-chunk-steps", "32",
         "--no-progress", "--no-tensorboard"]


def _cli(capsys, *args: str) -> dict:
    """``rlstruct *args`` through the entry point in this process (an interpreter fewer than a subprocess): the JSON
    summary it prints last."""
    out = rlstruct_in_process(capsys, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _last_value(args: list[str], flag: str) -> str:
    """The value of ``flag``'s last occurrence in ``args``: the one argparse keeps."""
    return args[len(args) - args[::-1].index(flag)]


@pytest.mark.parametrize(("algo", "backend", "flags"), [
    # The default backend ("auto") picks ale-py's vector env for ALE/ ids: `rlstruct train ppo --env ALE/...`.
    # One PPO iteration (4 envs x 32 steps); DQN's gradient steps start after 128 env steps, and 64 more follow.
    ("ppo", "auto", ["--n-steps", "32", "--max-env-steps", "128"]),
    ("dqn", "ale", ["--max-env-steps", "192", "--learning-starts", "128", "--buffer-size", "1000",
                    "--batch-size", "16", "--gradient-steps", "2"]),
    # gymnasium's raw 210x160 frames: a convolution over them costs 20 ms a call on a CPU and the encoder's first
    # linear layer holds 11M weights, so one iteration (2 envs x 8 steps) trains and checkpoints as four would, and
    # the evaluations (a forward per step: at launch, at the end, its confirmation, the eval command) stop after 8
    # steps, in two acquisitions of 4.
    pytest.param("a2c", "gymnasium", ["--n-envs", "2", "--max-env-steps", "16", "--evaluation-max-steps", "8",
                                      "--evaluation-chunk-steps", "4"], marks=pytest.mark.long(
        reason="gymnasium's Atari envs in worker processes, frame preprocessing in Python, raw frames through the "
               "CNN: 15-20 CPU seconds to train, checkpoint and evaluate here")),
])
def test_breakout_trains_from_frames_checkpoints_and_evaluates(algo, backend, flags, tmp_path, capsys):
    spec = describe_env("ALE/Breakout-v5", backend, None)
    assert spec.pixels and spec.obs_dtype == "uint8"
    assert spec.obs_shape == ((210, 160, 3) if backend == "gymnasium" else (4, 84, 84))
    backend_flag = [] if backend == "auto" else ["--backend", backend]
    summary = _cli(capsys, "train", algo, "--env", "ALE/Breakout-v5", *backend_flag, "--logdir", str(tmp_path), *SMALL,
                   *flags)
    assert summary["env_steps"] >= int(flags[flags.index("--max-env-steps") + 1])
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["env_spec"]["max_episode_steps"] == 27_000 and ckpt["config"]["max_episode_steps"] is None
    assert any(k.startswith("encoder.convs") for k in ckpt["model"])
    assert ckpt["model"]["encoder.convs.0.weight"].shape[-2:] == (8, 8)  # Nature-DQN's first conv
    result = _cli(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "1", "--max-steps",
                  _last_value([*SMALL, *flags], "--evaluation-max-steps"))
    assert result["algo"] == algo and result["episodes"] == 1


def test_training_envs_take_env_kwargs_and_evaluations_report_the_games_score(tmp_path, monkeypatch):
    """``--env-kwargs '{"life_loss_info": true}'`` reaches the training envs; the evaluation envs (and the videos)
    play whole games with unclipped rewards unless ``evaluation_env_kwargs`` says otherwise."""
    from rlstruct.algos import create_env, ppo
    from rlstruct.algos._train import session

    built = []

    def recording_create_env(*args, **kwargs):
        built.append((kwargs["n_envs"], kwargs["env_kwargs"]))
        return create_env(*args, **kwargs)

    monkeypatch.setattr(session, "create_env", recording_create_env)
    common = dict(env="ALE/Breakout-v5", n_envs=2, n_steps=8, max_env_steps=16, n_evaluation_envs=1,
                  evaluation_max_steps=8, eval_every=100, progress=False, tensorboard=False, preset="none")
    ppo.train(ppo.PPOConfig(**common, logdir=str(tmp_path / "a"), env_kwargs={"life_loss_info": True, "noop_max": 5}))
    assert built == [(2, {"life_loss_info": True, "noop_max": 5}),
                     (1, {"life_loss_info": False, "noop_max": 5, "reward_clipping": False, "episodic_life": False})]
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["env_kwargs"] == {"life_loss_info": True, "noop_max": 5} and saved["evaluation_env_kwargs"] is None
    built.clear()
    ppo.train(ppo.PPOConfig(**common, logdir=str(tmp_path / "b"), evaluation_env_kwargs={"reward_clipping": True}))
    assert built == [(2, None), (1, {"reward_clipping": True, "episodic_life": False, "life_loss_info": False})]


def test_evaluation_envs_must_keep_the_training_envs_spaces():
    from rlstruct.algos import ppo
    from rlstruct.errors import ConfigError

    with pytest.raises(ConfigError, match=r"evaluation_env_kwargs must leave the env's spaces as training has them, "
                                          r"got \{'stack_num': 2\}, which gives .*obs_shape=\(2, 84, 84\)"):
        validate(ppo.ALGORITHM, ppo.PPOConfig(env="ALE/Breakout-v5", evaluation_env_kwargs={"stack_num": 2},
                                             preset="none"))


@pytest.mark.parametrize("env_kwargs, lives_at_the_ends", [
    # Baselines' EpisodicLifeEnv: each lost life ends an episode and the game goes on, 4 lives left, then 3, ...;
    # the last life ends the game, and the step's info is the new game's (5 lives).
    ({"life_loss_info": True}, [4, 3, 2, 1, 5, 4]),
    # ale-py's episodic_life: the reset after a lost life starts a new game, so every episode is a first life.
    ({"episodic_life": True}, [4, 4, 4, 4, 4, 4]),
])
def test_a_lost_life_ends_the_training_episode(env_kwargs, lives_at_the_ends, monkeypatch):
    """A policy that always presses FIRE serves the ball at once and loses a life every couple of dozen steps."""
    from ale_py.vector_env import AtariVectorEnv

    from rlstruct.algos import create_env
    from rlstruct.structures import DictTensor

    lives = []
    step = AtariVectorEnv.step

    def recording_step(self, actions):
        out = step(self, actions)
        lives.append(int(out[4]["lives"][0]))
        return out

    monkeypatch.setattr(AtariVectorEnv, "step", recording_step)
    env = create_env("ALE/Breakout-v5", 1, seed=0, backend="ale", autoreset=True, env_kwargs=env_kwargs)
    env.reset()
    ends = []
    for _ in range(400):
        (obs, _), _ = env.step(DictTensor({"action": torch.ones(1, dtype=torch.int64)}))
        if obs["done"][0]:
            ends.append(lives[-1])
            if len(ends) == len(lives_at_the_ends):
                break
    env.close()
    assert ends == lives_at_the_ends


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_the_time_limit_of_an_atari_id_is_ales_episode_cap(backend):
    import inspect

    from ale_py.vector_env import AtariVectorEnv

    if backend == "ale":
        params = inspect.signature(AtariVectorEnv).parameters
        frames, skip = params["max_num_frames_per_episode"].default, params["frameskip"].default
    else:
        import gymnasium as gym

        kwargs = gym.spec("ALE/Breakout-v5").kwargs
        frames, skip = kwargs["max_num_frames_per_episode"], kwargs["frameskip"]
    assert (frames, skip) == (108_000, 4)  # v5: 30 minutes of emulation at 60 frames per second
    assert describe_env("ALE/Breakout-v5", backend, None).max_episode_steps == 27_000
    assert describe_env("ALE/Breakout-v5", backend, 100).max_episode_steps == 100

