"""``rlstruct train ALGO --resume RUN``: a run continues from its checkpoint (tiny budgets, in this process).

Every algorithm trains a few iterations, then a second ``train`` with ``resume`` and a larger ``max_env_steps``
continues it: the counters, ``progress.csv``, the optimizers' state, the learning-rate schedule and the learner's
own state (targets, temperature, return statistics) go on from the checkpoint. What the resumed session restores is
read through a wrapper of ``restore_optimizer``, called where ``train`` restores its optimizers, and compared
with the checkpoint it resumed. ``checkpoint_every`` writes such checkpoints during the run: one taken mid-run (or
left by a SIGKILL) resumes too. Each algorithm's first session is trained once for the module and copied where a
test resumes it (``first_session``), and its resumed run is read by every test that checks what it restored
(``resumed``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import signal
import threading
import time

import pytest
import torch

from rlstruct.algos import a2c, describe_env, dqn, ppo, reinforce, sac, td3, twin_critic
from rlstruct.algos._normalization import LearnerNormalization
from rlstruct.algos._train import checkpoints as checkpoints_module
from rlstruct.algos._train import cli, loops
from rlstruct.algos._train import learner_state as learner_state_module
from rlstruct.algos._train import run_folder as record_module
from rlstruct.algos._train import session as algos_setup
from rlstruct.algos._train import update as update_module
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, load_resume
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.run_folder import CSV_NAME
from rlstruct.algos._train.seeds import session_seed, worker_seeds
from rlstruct.algos._train.session import validate
from rlstruct.devices import tree_copy
from rlstruct.errors import CheckpointError, ConfigError
from tests.helpers import ForkedCommand, wall_limit

pytestmark = pytest.mark.timeout(120)

SMALL = {"hidden_sizes": (8,), "progress": False, "tensorboard": False, "n_evaluation_envs": 2, "eval_every": 3,
         "max_episode_steps": 50, "log_every": 1, "stop_at_reward_threshold": False, "time_limit": 100.0,
         "preset": "none"}

# (module, config, env steps per iteration, steps of the first session, steps of the two sessions)
CASES = {
    "reinforce": (reinforce, reinforce.ReinforceConfig(n_envs=4, normalize_rewards=True, **SMALL), None, 150, 300),
    "a2c": (a2c, a2c.A2CConfig(n_envs=4, n_steps=8, normalize_rewards=True, **SMALL), 32, 32 * 4, 32 * 8),
    "ppo": (ppo, ppo.PPOConfig(n_envs=4, n_steps=8, n_epochs=2, n_minibatches=2, normalize_rewards=True, **SMALL), 32,
            32 * 4, 32 * 8),
    "dqn": (dqn, dqn.DQNConfig(n_envs=4, rollout_steps=4, learning_starts=32, gradient_steps=2, batch_size=16,
                               buffer_size=1000, target_update_interval=4, **SMALL), 16, 16 * 6, 16 * 12),
    "sac": (sac, sac.SACConfig(n_envs=2, rollout_steps=4, learning_starts=32, gradient_steps_per_env_step=0.25,
                               batch_size=16, buffer_size=1000, **SMALL), 8, 8 * 8, 8 * 16),
    "td3": (td3, td3.TD3Config(n_envs=2, rollout_steps=4, learning_starts=32, gradient_steps_per_env_step=0.25,
                               batch_size=16, buffer_size=1000, **SMALL), 8, 8 * 8, 8 * 16),
}


def _optimizer_keys(algo: str) -> list[str]:
    return {"sac": ["actor_optimizer", "critic_optimizer", "alpha_optimizer"],
            "td3": ["actor_optimizer", "critic_optimizer"]}.get(algo, ["optimizer"])


def assert_same_state(a, b, skip=("lr",)) -> None:
    """Two trees of plain values and tensors are equal (tensors exactly), keys in ``skip`` aside."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu()), (a, b)
    elif isinstance(a, dict):
        assert set(a) - set(skip) == set(b) - set(skip), (set(a), set(b))
        for k in a:
            if k not in skip:
                assert_same_state(a[k], b[k], skip)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y, skip)
    else:
        assert a == b, (a, b)


def record_restores(monkeypatch, module) -> list[dict]:
    """Wraps ``restore_optimizer`` where ``module``'s ``train`` calls it (the learners' declared state,
    ``learner_state``, for every algorithm; the twin-critic learner's critics' optimizer): each call appends the
    optimizer's state right after the restore."""
    restored: list[dict] = []
    real = checkpoints_module.restore_optimizer

    def restore(optimizer, state, lr):
        real(optimizer, state, lr)
        params = [p.detach().cpu().clone() for group in optimizer.param_groups for p in group["params"]]
        restored.append({**tree_copy(optimizer.state_dict()), "weights": params})

    for home in (module, twin_critic, update_module, learner_state_module):
        if hasattr(home, "restore_optimizer"):
            monkeypatch.setattr(home, "restore_optimizer", restore)
    return restored


def csv_rows(logdir) -> list[dict]:
    with open(os.path.join(logdir, CSV_NAME), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def first_session(tmp_path_factory):
    """``first_session(algo)``: the first session of ``CASES[algo]`` (its result and its folder), trained once for the
    module: read it, or copy the folder (``shutil.copytree``) to write into it."""
    folder = tmp_path_factory.mktemp("first-sessions")
    made: dict[str, tuple] = {}

    def first(algo: str) -> tuple:
        if algo not in made:
            module, config, _, first_steps, _ = CASES[algo]
            logdir = folder / algo
            made[algo] = (module.train(dataclasses.replace(config, logdir=str(logdir), max_env_steps=first_steps)),
                          logdir)
        return made[algo]

    return first


def copied_first_session(first_session, algo: str, to) -> tuple:
    """The first session of ``algo`` copied into the folder ``to``: its result and ``to``."""
    first, folder = first_session(algo)
    shutil.copytree(folder, to)
    return first, to


@pytest.fixture(scope="module")
def resumed(first_session, tmp_path_factory):
    """``resumed(algo)``: :func:`train_then_resume` of ``algo``, run once for the module (the tests that check what a
    resumed session restored read the same run)."""
    made: dict[str, dict] = {}

    def resume(algo: str) -> dict:
        if algo not in made:
            with pytest.MonkeyPatch.context() as monkeypatch:
                made[algo] = train_then_resume(tmp_path_factory.mktemp(f"resumed-{algo}"), monkeypatch, algo,
                                               first_session)
        return made[algo]

    return resume


def train_then_resume(tmp_path, monkeypatch, algo: str, first_session) -> dict:
    """The first session of ``algo`` (a copy of :func:`first_session`'s, in ``tmp_path / "run"``) resumed to its
    total budget: the first result, the checkpoint it resumed (``saved``), the optimizers' and the return statistics'
    states right after their restores, the second result, the final checkpoint, and the folder."""
    module, config, _, first_steps, total_steps = CASES[algo]
    first, _ = copied_first_session(first_session, algo, tmp_path / "run")
    logdir = str(tmp_path / "run")
    saved = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    restored = record_restores(monkeypatch, module)
    statistics: list[dict] = []
    real_load = LearnerNormalization.load_state_dict

    def load(self, state):
        real_load(self, state)
        statistics.append({"carry": self.returns.carry.clone(), **tree_copy(self.state_dict()["returns"])})

    monkeypatch.setattr(LearnerNormalization, "load_state_dict", load)
    seeds = []
    loop = loops  # the loop opens the batchers
    real_open = loop.open_batchers

    def open_batchers(*args, **kwargs):
        seeds.append(kwargs["seed"])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(loop, "open_batchers", open_batchers)
    # The log folder is the checkpoint's unless --logdir says otherwise.
    second = module.train(dataclasses.replace(config, max_env_steps=total_steps, resume=logdir, logdir=None))
    final = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    # The resumed session's envs and agents are seeded apart from the first session's.
    assert seeds == [session_seed(config.seed, first.iterations)] and seeds[0] != config.seed
    return {"first": first, "saved": saved, "restored": restored, "statistics": statistics, "second": second,
            "final": final, "logdir": logdir}


@pytest.mark.parametrize("algo", list(CASES))
def test_a_resumed_run_continues_counters_logs_and_optimizer_state(resumed, algo):
    run = resumed(algo)
    first, saved, restored, second, final = (run[k] for k in ("first", "saved", "restored", "second", "final"))
    total_steps = CASES[algo][4]
    assert saved["iteration"] == first.iterations > 0 and saved["env_steps"] == first.env_steps
    assert second.logdir == run["logdir"]
    assert second.iterations > first.iterations and total_steps <= second.env_steps
    assert final["iteration"] == second.iterations and final["env_steps"] == second.env_steps
    assert final["wall_time_s"] > saved["wall_time_s"]

    # progress.csv and the history: the first session's rows, then the resumed one's, numbered on.
    rows = csv_rows(second.logdir)
    training = [r for r in rows if r.get("train/episode_return", "") != ""]
    assert [int(r["iteration"]) for r in training] == list(range(1, second.iterations + 1))
    steps = [int(r["env_steps"]) for r in training]
    assert steps == sorted(steps) and steps[first.iterations - 1] == first.env_steps and steps[-1] == second.env_steps
    walls = [float(r["wall_time_s"]) for r in rows]
    assert walls == sorted(walls)
    # The summary's wall_time_s is this session's; run_wall_time_s counts both, as the rows and the checkpoint do.
    with open(os.path.join(second.logdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["run_wall_time_s"] == pytest.approx(final["wall_time_s"], abs=1e-3)
    assert summary["run_wall_time_s"] == pytest.approx(saved["wall_time_s"] + summary["wall_time_s"], abs=2e-3)
    assert summary["run_wall_time_s"] >= walls[-1] - 1e-3 and summary["wall_time_s"] < walls[-1]
    assert [h["iteration"] for h in second.history if "train/episode_return" in h] == list(
        range(1, second.iterations + 1))

    # The optimizers start the resumed session with the checkpoint's steps and moments ...
    keys = _optimizer_keys(algo)
    assert len(restored) == len(keys)
    for key, state in zip(keys, restored):
        assert_same_state({k: v for k, v in state.items() if k != "weights"}, saved["learner"][key])
    # ... and the weights are the checkpoint's (SAC: its actor is the checkpoint's model, its critics the learner's).
    models = [saved["model"], saved["learner"].get("critic", {})]
    for weights, model in zip([state["weights"] for state in restored], models):
        for w in weights:
            assert any(v.shape == w.shape and torch.equal(v, w) for v in model.values())
    # ... and go on from them: the final step counts add this session's updates to the first's.
    for key in keys:
        before = saved["learner"][key]["state"][0]["step"]
        after = final["learner"][key]["state"][0]["step"]
        assert after > before > 0, (key, before, after)
    opt_step = float(final["learner"][keys[0]]["state"][0]["step"])
    _, config, per_iteration = CASES[algo][:3]
    if algo in ("reinforce", "a2c"):  # one update per iteration
        assert opt_step == second.iterations
    elif algo == "ppo":
        assert opt_step == second.iterations * config.n_epochs * config.n_minibatches
    elif algo == "dqn":
        assert opt_step == final["learner"]["n_updates"] > saved["learner"]["n_updates"]
    if algo in ("a2c", "ppo"):
        # The annealed learning rate of the last iteration: lr * (1 - env steps before it / max_env_steps), counted
        # over both sessions.
        lr = final["learner"]["optimizer"]["param_groups"][0]["lr"]
        assert lr == pytest.approx(config.lr * (1 - (second.env_steps - per_iteration) / total_steps))


@pytest.mark.parametrize("algo", ["a2c", "ppo", "reinforce"])
def test_the_return_statistics_are_restored(resumed, algo):
    """The resumed run of :func:`test_a_resumed_run_continues_counters_logs_and_optimizer_state`, read again."""
    run = resumed(algo)
    restored, saved, second, final = run["statistics"], run["saved"], run["second"], run["final"]
    moments = saved["learner"]["normalization"]["returns"]
    assert len(restored) == 1 and moments["count"] > 0
    assert_same_state({k: restored[0][k] for k in moments}, moments)
    # The envs start fresh episodes: no return is carried over from the first session's.
    assert not restored[0]["carry"].any()
    # Every valid step of both sessions went into the moments (the auto-reset rows are full; REINFORCE's episodes
    # are its env steps).
    assert int(final["learner"]["normalization"]["returns"]["count"]) == second.env_steps


def test_dqn_restores_its_target_network(first_session, tmp_path):
    module, config, _, first_steps, total_steps = CASES["dqn"]
    logdir = str(copied_first_session(first_session, "dqn", tmp_path / "run")[1])
    saved = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    assert saved["learner"]["n_updates"] % config.target_update_interval != 0  # the target lags the Q network
    assert any(not torch.equal(saved["learner"]["target"][k], v) for k, v in saved["model"].items())
    # No hard update in the resumed session: its final target is the one it restored.
    module.train(dataclasses.replace(config, max_env_steps=total_steps, resume=logdir, target_update_interval=10**6))
    final = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    assert final["learner"]["n_updates"] > saved["learner"]["n_updates"]
    assert_same_state(final["learner"]["target"], saved["learner"]["target"])


@pytest.mark.slow  # 1.5 CPU s on the reference CPU: slow is 1.5 s or more
def test_sac_restores_its_target_critics_and_temperature(first_session, tmp_path, monkeypatch):
    module, config, _, first_steps, total_steps = CASES["sac"]
    logdir = str(copied_first_session(first_session, "sac", tmp_path / "run")[1])
    saved = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    restored = record_restores(monkeypatch, module)
    # A Polyak rate of 1e-9: the resumed session's target critics stay where it restored them.
    module.train(dataclasses.replace(config, max_env_steps=total_steps, resume=logdir, tau=1e-9))
    final = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    (log_alpha,) = restored[2]["weights"]  # the temperature's optimizer holds log alpha
    assert_same_state(log_alpha, saved["learner"]["log_alpha"])
    assert not torch.equal(final["learner"]["log_alpha"], saved["learner"]["log_alpha"])  # and it trained on
    for k, v in saved["learner"]["target_critic"].items():
        assert torch.allclose(final["learner"]["target_critic"][k], v, atol=1e-6), k
    assert any(not torch.allclose(saved["learner"]["critic"][k], v, atol=1e-3)
               for k, v in saved["learner"]["target_critic"].items())


def test_td3_restores_its_target_networks_and_the_phase_of_its_policy_delay(tmp_path):
    module, config, _, first_steps, total_steps = CASES["td3"]
    config = dataclasses.replace(config, gradient_steps_per_env_step=0.375)  # 3 critic updates an iteration
    logdir = str(tmp_path)
    module.train(dataclasses.replace(config, logdir=logdir, max_env_steps=first_steps))
    saved = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    # A Polyak rate of 1e-9: the resumed session's targets stay where it restored them.
    module.train(dataclasses.replace(config, max_env_steps=total_steps, resume=logdir, tau=1e-9))
    final = torch.load(os.path.join(logdir, CHECKPOINT_NAME), weights_only=True)
    for key in ("target_actor", "target_critic"):
        for k, v in saved["learner"][key].items():
            assert torch.allclose(final["learner"][key][k], v, atol=1e-6), (key, k)
    assert any(not torch.allclose(saved["model"][k], v, atol=1e-3) for k, v in saved["learner"]["target_actor"].items()
               if v.is_floating_point() and k in saved["model"] and "weight" in k)
    # The actor steps at critic updates 0, 2, 4, ... over both sessions: ceil(n / 2) of n. Odd counts in each session
    # tell this from a delay whose phase restarted with the resumed session.
    before, after = saved["learner"]["n_updates"], final["learner"]["n_updates"]
    assert before % 2 == 1 and (after - before) % 2 == 1, (before, after)
    assert float(saved["learner"]["actor_optimizer"]["state"][0]["step"]) == math.ceil(before / 2)
    assert float(final["learner"]["actor_optimizer"]["state"][0]["step"]) == math.ceil(after / 2)
    assert float(final["learner"]["critic_optimizer"]["state"][0]["step"]) == after


def test_the_replay_buffer_refills_before_learning_again(resumed):
    """DQN's resumed run of :func:`test_a_resumed_run_continues_counters_logs_and_optimizer_state`, read again."""
    _, config, per_iteration, first_steps, _ = CASES["dqn"]
    second = resumed("dqn")["second"]
    resumed = [r for r in second.history if r["iteration"] > first_steps // per_iteration and "buffer_size" in r]
    assert resumed[0]["buffer_size"] == per_iteration  # an empty buffer, refilled
    learning = [r for r in resumed if "loss/q" in r]
    assert learning and learning[0]["buffer_size"] >= config.learning_starts
    assert all("loss/q" not in r for r in resumed if r["buffer_size"] < config.learning_starts)


def test_a_resumed_session_draws_other_seeds():
    assert session_seed(3, 0) == 3
    seeds = {session_seed(3, k) for k in range(1, 200)}
    assert len(seeds) > 190 and 3 not in seeds
    assert all(0 <= s < 214_748 for s in seeds)
    assert worker_seeds(session_seed(3, 40), 2, 0) != worker_seeds(3, 2, 0)


def test_resuming_into_another_logdir_copies_the_history_and_keeps_the_first(first_session, tmp_path):
    module, config, _, first_steps, total_steps = CASES["a2c"]
    first_dir, second_dir = str(tmp_path / "first"), str(tmp_path / "second")
    first, _ = copied_first_session(first_session, "a2c", tmp_path / "first")
    with open(os.path.join(first_dir, CSV_NAME), "a") as f:  # a row past the checkpoint (a stale copy's)
        f.write("999,99999,1.0\n")
    before = open(os.path.join(first_dir, CSV_NAME)).read()
    second = module.train(dataclasses.replace(config, logdir=second_dir, max_env_steps=total_steps,
                                              resume=os.path.join(first_dir, CHECKPOINT_NAME)))
    assert open(os.path.join(first_dir, CSV_NAME)).read() == before
    rows = csv_rows(second_dir)
    assert int(rows[0]["iteration"]) == 1 and int(rows[-1]["iteration"]) == second.iterations > first.iterations
    assert all(int(r["iteration"]) <= second.iterations for r in rows)
    assert torch.load(os.path.join(second_dir, CHECKPOINT_NAME), weights_only=True)["iteration"] == second.iterations


# --------------------------------------------------------------------------- what cannot be resumed
@pytest.fixture(scope="module")
def a2c_checkpoint(first_session):
    """A2C's first session: read it, or copy it to write into it."""
    return first_session("a2c")[1]


@pytest.mark.parametrize("change, match", [
    ({"hidden_sizes": (16,)}, r"hidden_sizes must equal the checkpoint's to resume it .* got hidden_sizes=\[16\] and "
                              r"the checkpoint's \[8\] .* pass --hidden-sizes as the run was trained"),
    ({"env": "Acrobot-v1"}, r"a run's env cannot be changed at resume: resume='.*' is a run on 'CartPole-v1', got "
                            r"env='Acrobot-v1'"),
    ({"backend": "gymnasium"}, r"backend must equal the checkpoint's .* got backend='gymnasium' and the "
                               r"checkpoint's 'torch' \(its 'auto'\)"),
    ({"max_episode_steps": 60}, r"max_episode_steps must equal the checkpoint's .* got max_episode_steps=60"),
    ({"normalize_rewards": False}, r"normalize_rewards must equal the checkpoint's .* got normalize_rewards=False "
                                   r"and the checkpoint's True"),
    ({"normalize_observations": True}, r"normalize_observations must equal the checkpoint's"),
    ({"recurrent": True}, r"recurrent must equal the checkpoint's"),
    ({"env_kwargs": {"compile": False}}, r"env_kwargs must equal the checkpoint's .* got env_kwargs=\{'compile': "
                                         r"False\} and the checkpoint's None"),
])
def test_a_setting_that_shapes_the_networks_or_the_data_must_match(a2c_checkpoint, change, match):
    config = dataclasses.replace(CASES["a2c"][1], resume=str(a2c_checkpoint), **change)
    with pytest.raises(ConfigError, match=match):
        a2c.train(config)


def test_what_may_differ_on_resume(a2c_checkpoint):
    # The backend that "auto" picks, the budgets, the batch, the devices and the learning rate.
    config = dataclasses.replace(CASES["a2c"][1], resume=str(a2c_checkpoint), backend="torch", n_envs=8, lr=1e-4,
                                 max_env_steps=10**6, eval_every=7)
    assert load_resume("a2c", config).iteration > 0


def test_a_checkpoint_records_the_backend_its_auto_stepped(a2c_checkpoint, tmp_path):
    """"auto" may pick another simulator in a later release (MinAtar ids moved from minatar's games to the torch
    ones): a checkpoint records the backend it stepped, and one written before that record, of an "auto" MinAtar
    run, resumes on minatar's games only, not silently on the torch ones."""
    data = torch.load(a2c_checkpoint / CHECKPOINT_NAME, weights_only=True)
    assert data["backend"] == "torch" and data["config"]["backend"] == "auto"
    del data["backend"], data["digest"]
    data["config"]["env"] = "MinAtar/Breakout-v1"
    old = tmp_path / "old"
    old.mkdir()
    torch.save(data, old / CHECKPOINT_NAME)
    config = dataclasses.replace(CASES["a2c"][1], env="MinAtar/Breakout-v1", backend="auto", resume=str(old))
    with pytest.raises(ConfigError, match=r"backend must equal the checkpoint's .* got backend='auto' and the "
                                          r"checkpoint's 'gymnasium' \(its 'auto'\)"):
        load_resume("a2c", config)
    assert load_resume("a2c", dataclasses.replace(config, backend="gymnasium")).iteration > 0


def test_another_algorithm_or_a_dueling_head_cannot_resume(a2c_checkpoint, first_session, tmp_path):
    config = dataclasses.replace(CASES["ppo"][1], resume=str(a2c_checkpoint))
    with pytest.raises(ConfigError, match=r"holds a a2c run, got rlstruct train ppo; resume it with rlstruct train "
                                          r"a2c, or start a new ppo run without --resume"):
        ppo.train(config)
    config = CASES["dqn"][1]
    _, run = copied_first_session(first_session, "dqn", tmp_path / "run")
    with pytest.raises(ConfigError, match=r"dueling must equal the checkpoint's .* got dueling=True and the "
                                          r"checkpoint's False"):
        dqn.train(dataclasses.replace(config, resume=str(run), dueling=True))


def test_the_envs_own_time_limit_given_as_a_number_still_resumes(tmp_path):
    """A run trained with the env's own limit (None: CartPole-v1's 500) resumes with --max-episode-steps 500, not
    with another limit."""
    _, config, per_iteration, first_steps, _ = CASES["a2c"]
    config = dataclasses.replace(config, max_episode_steps=None)
    logdir = tmp_path / "run"
    a2c.train(dataclasses.replace(config, logdir=str(logdir), max_env_steps=first_steps))
    with pytest.raises(ConfigError, match=r"max_episode_steps must equal the checkpoint's .* got "
                                          r"max_episode_steps=400 and the checkpoint's 500 \(the env's own limit\)"):
        validate(a2c.ALGORITHM, dataclasses.replace(config, max_episode_steps=400, resume=str(logdir)))
    same = a2c.train(dataclasses.replace(config, max_episode_steps=500, resume=str(logdir),
                                         max_env_steps=first_steps + per_iteration))
    assert same.env_steps == first_steps + per_iteration


def test_a_missing_or_foreign_resume_path_is_an_error(tmp_path):
    config = dataclasses.replace(CASES["a2c"][1], resume=str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match=r"resume=.*nope' does not exist; pass the checkpoint.pt of an "
                                              r"earlier run, or its log folder"):
        a2c.train(config)
    with pytest.raises(CheckpointError, match="is a folder without a checkpoint.pt"):
        a2c.train(dataclasses.replace(config, resume=str(tmp_path)))
    with pytest.raises(CheckpointError, match="is not an rlstruct checkpoint"):
        a2c.train(dataclasses.replace(config, resume=__file__))


def test_a_mismatched_learner_state_is_an_error():
    norm = LearnerNormalization(torch.nn.Identity(), normalize_rewards=False, n_rows=2, gamma=0.9, device="cpu")
    with pytest.raises(ConfigError, match=r"normalize_rewards must match the saved learner state: this learner keeps "
                                          r"no return statistics, got a state with some; resume with the run's"):
        norm.load_state_dict({"returns": {}})


def test_a_resume_error_is_one_line_on_the_command_line(a2c_checkpoint, capsys):
    for args, needle in [
        (["train", "a2c", "--resume", str(a2c_checkpoint), "--max-episode-steps", "50", "--hidden-sizes", "16"],
         "hidden_sizes must equal the checkpoint's to resume it"),
        (["train", "dqn", "--resume", str(a2c_checkpoint)], "holds a a2c run, got rlstruct train dqn"),
        (["train", "a2c", "--resume", str(a2c_checkpoint / "missing.pt")], "does not exist"),
    ]:
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, (args, err)


def test_the_command_line_resumes_with_the_runs_own_settings(a2c_checkpoint, tmp_path, capsys):
    """`rlstruct train a2c --resume RUN` alone: the flags not given take the run's values (its hidden_sizes, time
    limit, normalisation... differ from the defaults, so taking the defaults would be a mismatch), the run's folder
    is written into, and a flag given (the budget) overrides the run's."""
    run = tmp_path / "run"
    shutil.copytree(a2c_checkpoint, run)
    before = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(before["env_steps"] + 64)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["logdir"] == str(run) and summary["env_steps"] >= before["env_steps"] + 64
    after = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    assert after["iteration"] > before["iteration"]
    for name, value in before["config"].items():
        if name not in ("resume", "max_env_steps", "logdir"):
            assert after["config"][name] == value, name
    assert after["config"]["max_env_steps"] == before["env_steps"] + 64


def test_a_resumed_command_reads_its_checkpoint_once_and_describes_its_env_once(a2c_checkpoint, tmp_path,
                                                                                monkeypatch, capsys):
    """The command line reads the checkpoint for the flags' defaults and hands it down: one read for the whole run
    (the final checkpoint's write aside), and one env built to describe it."""
    run = tmp_path / "run"
    shutil.copytree(a2c_checkpoint, run)
    # A checkpoint written before the command started (this test's process started before the fixture trained): one
    # written since is read again under the folder's lock, as another run may have written it.
    os.utime(run / CHECKPOINT_NAME, (0, 0))
    steps = torch.load(run / CHECKPOINT_NAME, weights_only=True)["env_steps"]
    loads, described = [], []
    real_load, real_describe = torch.load, algos_setup.describe_env
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    monkeypatch.setattr(algos_setup, "describe_env", lambda *a: described.append(a) or real_describe(*a))
    assert cli.main(["train", "a2c", "--resume", str(run), "--max-env-steps", str(steps + 32)]) == 0
    assert [str(p) for p in loads] == [str(run / CHECKPOINT_NAME)] and len(described) == 1, (loads, described)
    capsys.readouterr()


def test_an_old_checkpoint_still_evaluates_but_cannot_resume(a2c_checkpoint, tmp_path):
    data = torch.load(a2c_checkpoint / CHECKPOINT_NAME, weights_only=True)
    old = {k: v for k, v in data.items() if k not in ("learner", "iteration", "wall_time_s", "digest")}
    old["config"] = {k: v for k, v in old["config"].items() if k != "resume"}
    path = tmp_path / CHECKPOINT_NAME
    torch.save(old, path)
    result = evaluate_checkpoint(str(path), episodes=2)
    assert result["algo"] == "a2c" and 0 < result["eval_return"] <= 50
    with pytest.raises(ConfigError, match=r"is a checkpoint without the learner's state .* start a new run"):
        a2c.train(dataclasses.replace(CASES["a2c"][1], resume=str(path)))


# --------------------------------------------------------------------------- preemption and learning
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_run_stopped_by_sigterm_resumes(tmp_path, algo):
    module, config, *_ = CASES[algo]
    logdir = tmp_path / "run"
    done = threading.Event()

    def sigterm_once_training_runs() -> None:
        csv_path = logdir / CSV_NAME
        while not done.is_set():
            if csv_path.exists() and len(csv_path.read_text().splitlines()) >= 4:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=sigterm_once_training_runs)
    thread.start()
    try:
        first = module.train(dataclasses.replace(config, logdir=str(logdir), max_env_steps=10**7))
    finally:
        done.set()
        thread.join()
    assert first.interrupted and first.stop_signal == "SIGTERM"
    saved = torch.load(logdir / CHECKPOINT_NAME, weights_only=True)
    assert saved["interrupted"] is True and saved["iteration"] == first.iterations
    second = module.train(dataclasses.replace(config, max_env_steps=first.env_steps + 64, resume=str(logdir)))
    assert not second.interrupted and second.env_steps >= first.env_steps + 64
    assert second.iterations > first.iterations and math.isfinite(second.eval_return)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_command_line_story_sigterm_then_resume(tmp_path, capsys):
    """The README's: a run killed by SIGTERM (SLURM's preemption), then the same command with --resume. The run is a
    fork of this process, signalled as a scheduler signals a job (what is tested is how the command ends, not an
    interpreter's start); the resume is the same command line, in this process."""
    logdir = tmp_path / "run"
    argv = ["train", "ppo", "--n-envs", "4", "--hidden-sizes", "16", "--max-env-steps", "100000000", "--time-limit",
            "600", "--log-every", "1", "--eval-every", "5", "--n-evaluation-envs", "2", "--no-stop-at-reward-threshold",
            "--no-progress", "--no-tensorboard", "--logdir", str(logdir)]
    run = ForkedCommand(argv, tmp_path / "first")
    try:
        deadline = time.monotonic() + wall_limit(180)
        csv_path = logdir / CSV_NAME
        while not (csv_path.exists() and len(csv_path.read_text().splitlines()) >= 3):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr
            time.sleep(0.1)
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(timeout=60) == 143, run.stderr
    finally:
        run.kill()
    first = json.loads(run.stdout.strip().splitlines()[-1])
    assert first["interrupted"] is True
    capsys.readouterr()
    assert cli.main([*argv[:argv.index("100000000")], str(first["env_steps"] + 256),
                     *argv[argv.index("100000000") + 1:], "--resume", str(logdir)]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["logdir"] == str(logdir) and not second["interrupted"]
    assert second["env_steps"] >= first["env_steps"] + 256 and second["iterations"] > first["iterations"]
    rows = [r for r in csv_rows(logdir) if r.get("train/episode_return", "") != ""]
    assert [int(r["iteration"]) for r in rows] == list(range(1, second["iterations"] + 1))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ppo_trained_partway_then_resumed_learns_cartpole(tmp_path):
    """PPO's defaults on CartPole-v1, 3,000 env steps (a return near 40), then resumed: it reaches 400 within 60,000
    env steps in all (seed 0 does at about 50,000)."""
    common = {"progress": False, "tensorboard": False, "time_limit": 300.0, "seed": 0, "eval_every": 5}
    first = ppo.train(ppo.PPOConfig(max_env_steps=3_000, stop_at_reward_threshold=False, logdir=str(tmp_path),
                                    **common))
    assert first.env_steps < 4_000 and first.eval_return < 200
    second = ppo.train(ppo.PPOConfig(max_env_steps=60_000, target_return=400.0, resume=str(tmp_path), **common))
    evals = [(r["env_steps"], r["eval/return"]) for r in second.history if "eval/return" in r]
    assert second.reached_target and second.env_steps <= 60_000, evals


# --------------------------------------------------------------------------- periodic checkpoints
@pytest.mark.parametrize("algo", ["a2c", "ppo", "dqn", "sac", "td3"])
def test_checkpoint_every_writes_resumable_checkpoints_during_the_run(tmp_path, monkeypatch, algo):
    module, config, per_iteration, first_steps, _ = CASES[algo]
    written, snapshot = [], tmp_path / "at-2"
    save = record_module.save_checkpoint

    def save_and_keep(path, *args, **kwargs):
        out = save(path, *args, **kwargs)
        data = torch.load(out, weights_only=True)
        written.append((data["iteration"], sorted(data["learner"])))
        if data["iteration"] == 2:  # what a run killed outright after iteration 2 leaves behind
            shutil.copytree(os.path.dirname(out), snapshot)
        return out

    # The periodic checkpoints and the final one: the run folder writes both.
    monkeypatch.setattr(record_module, "save_checkpoint", save_and_keep)
    first = module.train(dataclasses.replace(config, logdir=str(tmp_path / "run"), max_env_steps=first_steps,
                                             checkpoint_every=2))
    periodic = [it for it, _ in written[:-1]]
    assert periodic == list(range(2, first.iterations + 1, 2)) and written[-1][0] == first.iterations
    assert all(keys == written[-1][1] for _, keys in written)  # the learner's whole state every time
    assert [int(r["iteration"]) for r in csv_rows(snapshot) if r.get("train/episode_return", "") != ""] == [1, 2]
    second = module.train(dataclasses.replace(config, max_env_steps=2 * per_iteration + 2 * per_iteration,
                                              resume=str(snapshot)))
    rows = [r for r in second.history if "train/episode_return" in r]
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 4] and second.env_steps == 4 * per_iteration


def test_a_bad_checkpoint_every_is_an_error():
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0, got -1"):
        validate(a2c.ALGORITHM, dataclasses.replace(CASES["a2c"][1], checkpoint_every=-1))


def test_a_checkpoint_is_replaced_whole(first_session, tmp_path, monkeypatch):
    """The file is written beside the checkpoint and renamed onto it: a write that fails leaves the previous one."""
    _, config, _, _, _ = CASES["a2c"]
    _, logdir = copied_first_session(first_session, "a2c", tmp_path / "run")
    before = (logdir / CHECKPOINT_NAME).read_bytes()

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoints_module.save_checkpoint(logdir / CHECKPOINT_NAME, "a2c", config, describe_env("CartPole-v1", "torch",
                                           50), torch.nn.Linear(1, 1))
    assert (logdir / CHECKPOINT_NAME).read_bytes() == before


@pytest.mark.timeout(240)
def test_a_run_killed_outright_resumes_from_its_last_periodic_checkpoint(tmp_path, capsys):
    """SIGKILL, which no handler sees, ends a fork of this process that runs the command (what is tested is what the
    periodic checkpoints leave, not an interpreter's start); the resume is the command, in this process."""
    logdir = tmp_path / "run"
    run = ForkedCommand(["train", "a2c", "--n-envs", "4", "--hidden-sizes", "16", "--max-env-steps", "100000000",
                         "--time-limit", "600", "--checkpoint-every", "5", "--n-evaluation-envs", "2",
                         "--no-stop-at-reward-threshold", "--no-progress", "--no-tensorboard", "--logdir", str(logdir)],
                        tmp_path / "first")
    try:
        deadline = time.monotonic() + wall_limit(180)
        while not (logdir / CHECKPOINT_NAME).exists():
            assert run.poll() is None and time.monotonic() < deadline, run.stderr
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        run.kill()  # SIGKILL: no checkpoint at exit, only the periodic ones
    assert run.returncode == -9, run.stderr
    saved = torch.load(logdir / CHECKPOINT_NAME, weights_only=True)
    assert saved["iteration"] % 5 == 0 and saved["iteration"] >= 5
    capsys.readouterr()
    assert cli.main(["train", "a2c", "--resume", str(logdir), "--max-env-steps", str(saved["env_steps"] + 64)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] >= saved["env_steps"] + 64
    rows = [r for r in csv_rows(logdir) if r.get("train/episode_return", "") != ""]
    assert [int(r["iteration"]) for r in rows] == list(range(1, summary["iterations"] + 1))
