"""The family as a contract: a description carries its loop, learners declare the state they own, and what is written
outside the package on the public face gets what the built-in families get.

(a) a PPO with an adaptive KL coefficient, defined here on ``rlstruct.algos.harness`` alone: its coefficient survives
``--resume``; (b) a new family, the cross-entropy method of ``tutorials/mylab/cem.py``, trains, evaluates, resumes and
profiles in other processes; (c) the harness asks descriptions, never their type; and ``rlstruct profile`` times the
off-policy family.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from rlstruct.algos import ppo
from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    ActorCriticLearner,
    Algorithm,
    Batch,
    LearnerState,
    LearnFn,
    OnPolicyAlgorithm,
    minibatch_epochs,
    reads,
    setting,
    trainer,
)
from rlstruct.algos.policies import critic_values, policy_actions
from rlstruct.algos.returns import gae_advantages
from rlstruct.errors import ConfigError
from rlstruct.structures import Trajectories
from tests.algos.test_outside_algorithms import RLSTRUCT, _run, forget_mylab, forked

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- (a) a learn step's own state
@dataclasses.dataclass
class KLPPOConfig(ppo.PPOConfig):
    """PPO's settings and the adaptive KL penalty's (Schulman et al. 2017, section 4)."""

    kl_target: float = setting(1e-5, "the KL per update the coefficient steers to")
    kl_coef_init: float = setting(1.0, "the KL penalty's first coefficient")


@reads("frame", "action", "old_log_prob", "advantage", "returns")
def kl_penalty_loss(model: torch.nn.Module, config: KLPPOConfig, kl_coef: torch.Tensor,
                    batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-mean(r A) + kl_coef * KL + value_coef * value loss`` of a minibatch of flat steps."""
    dist, value = model.policy_value(batch["frame"])
    log_ratio = dist.log_prob(batch["action"]) - batch["old_log_prob"]
    ratio = log_ratio.exp()
    kl = ((ratio - 1.0) - log_ratio).mean()
    value_loss = 0.5 * ((value - batch["returns"]) ** 2).mean()
    loss = -(ratio * batch["advantage"]).mean() + kl_coef * kl + config.value_coef * value_loss
    return loss, {"kl": kl.detach()}


def kl_learn_step(config: KLPPOConfig, learner: ActorCriticLearner) -> LearnFn:
    """A KL-penalised policy gradient whose coefficient doubles after an update past ``1.5 * kl_target`` and halves
    after one under ``kl_target / 1.5``; the coefficient is the learn step's own state, declared to the harness."""
    model = learner.model
    kl_coef = torch.tensor(config.kl_coef_init, device=learner.device)
    learner.state.add(kl_coef=kl_coef)
    shuffle = torch.Generator(device=learner.device).manual_seed(learner.seed)
    update = learner.update_step(functools.partial(kl_penalty_loss, model, config, kl_coef), config,
                                 max_grad_norm=config.max_grad_norm, per_network=False)

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        frame = tt["observation/frame"]
        with torch.no_grad():
            values, next_values = (v.unflatten(0, frame.shape[:2]) for v in critic_values(
                model, frame.flatten(0, 1), tt["_observation/frame"].flatten(0, 1)))
            advantages = gae_advantages(loss_rewards * config.reward_scale, values, next_values,
                                        tt["_observation/terminated"], tt["_observation/done"], config.gamma,
                                        config.gae_lambda)
        steps = {"frame": frame, "action": policy_actions(tt), "old_log_prob": tt["action/log_prob"],
                 "advantage": advantages, "returns": advantages + values}
        before = kl_coef.clone()
        stats, _ = minibatch_epochs(update, {k: v.flatten(0, 1) for k, v in steps.items()}, n_epochs=config.n_epochs,
                                    n_minibatches=config.n_minibatches, shuffle=shuffle)
        kl = float(stats["kl"])
        if kl > 1.5 * config.kl_target:
            kl_coef.mul_(2.0)
        elif kl < config.kl_target / 1.5:
            kl_coef.div_(2.0)
        return {**stats, "kl_coef/before": before, "kl_coef": kl_coef.clone()}

    return learn


KL_PPO = OnPolicyAlgorithm(name="klppo", title="KL-PPO", config_cls=KLPPOConfig, description="PPO, adaptive KL",
                           model=ACTOR_CRITIC, make_learn=kl_learn_step)
train_kl_ppo = trainer(KL_PPO)

#: four envs, eight steps a collection; no learning-rate schedule, which would follow each session's budget
KL_SMALL = {"n_envs": 4, "n_steps": 8, "n_epochs": 2, "n_minibatches": 2, "hidden_sizes": (8,), "anneal_lr": False,
            "progress": False, "tensorboard": False, "n_evaluation_envs": 2, "evaluation_max_steps": 20,
            "eval_every": 100, "log_every": 1, "stop_at_reward_threshold": False, "time_limit": 100.0,
            "preset": "none"}
PER_ITERATION = 4 * 8


def _training_rows(history: list[dict]) -> list[dict]:
    """The training rows, without what the wall clock decides (nan, no episode ended, as None: comparable)."""
    return [{k: None if v != v else v for k, v in row.items() if "time" not in k and not k.endswith("per_s")}
            for row in history if "kl_coef" in row]


@pytest.mark.slow  # three short training runs
def test_a_learn_steps_own_state_survives_resume_as_the_uninterrupted_run_has_it(tmp_path):
    """Trained 6 iterations at once, or 3, interrupted (its checkpoint), then resumed to 6: the first 3 rows are the
    same, the checkpoint holds the coefficient the uninterrupted run had after iteration 3, and the resumed session's
    first update starts from it (a fresh learn step would start from ``kl_coef_init`` again). The resumed session's
    envs and agents draw other seeds, so its rows after that are its own."""
    config = KLPPOConfig(**KL_SMALL)
    whole = train_kl_ppo(dataclasses.replace(config, logdir=str(tmp_path / "whole"), max_env_steps=6 * PER_ITERATION))
    first = train_kl_ppo(dataclasses.replace(config, logdir=str(tmp_path / "cut"), max_env_steps=3 * PER_ITERATION))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    resumed = train_kl_ppo(dataclasses.replace(config, resume=str(tmp_path / "cut"), max_env_steps=6 * PER_ITERATION))

    rows, cut, both = _training_rows(whole.history), _training_rows(first.history), _training_rows(resumed.history)
    assert len(rows) == 6 and len(cut) == 3 and len(both) == 6
    assert cut == rows[:3] == both[:3]
    after_three = rows[2]["kl_coef"]
    assert after_three != config.kl_coef_init  # it moved: a reset would show
    assert list(saved["learner"]) == ["optimizer", "normalization", "kl_coef"]
    assert float(saved["learner"]["kl_coef"]) == after_three == rows[3]["kl_coef/before"]
    assert both[3]["kl_coef/before"] == after_three


def test_a_learner_state_restores_every_kind_it_declares_and_names_what_does_not_fit():
    net, coef = torch.nn.Linear(2, 1), torch.tensor(0.5)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.ones(1, 2)).sum().backward()
    opt.step()

    class Learner:
        n_updates = 3

    learner = Learner()
    owned = LearnerState(net=net, optimizer=opt, coef=coef)
    owned.counters(learner, "n_updates")
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in owned.state_dict().items()}
    saved["net"] = {k: v.clone() for k, v in saved["net"].items()}
    with torch.no_grad():
        net.weight.zero_()
    coef.fill_(9.0)
    learner.n_updates = 0
    opt.param_groups[0]["lr"] = 0.01  # the new command's rate
    owned.load_state_dict(saved)
    assert torch.equal(net.weight, saved["net"]["weight"]) and float(coef) == 0.5 and learner.n_updates == 3
    assert opt.param_groups[0]["lr"] == 0.01 and float(opt.state[net.weight]["step"]) == 1.0
    with pytest.raises(ConfigError, match=r"resume='run': the checkpoint's learner state has no 'coef', which this "
                                          r"learner owns .*; resume it with that version, or start a new run"):
        owned.load_state_dict({k: v for k, v in saved.items() if k != "coef"}, path="run")
    with pytest.raises(ConfigError, match=r"resume='run': the learner's 'coef' in the checkpoint does not fit this "
                                          r"run's \(shape \(2,\) against \(\)\); pass an undamaged checkpoint"):
        owned.load_state_dict({**saved, "coef": torch.zeros(2)}, path="run")
    with pytest.raises(ValueError, match="LearnerState entry 'coef' is declared already"):
        owned.add(coef=torch.zeros(()))
    with pytest.raises(TypeError, match=r"LearnerState entry 'lr' must be an nn.Module, an optimizer, a tensor or "
                                        r"have state_dict\(\) and load_state_dict\(\), got float"):
        owned.add(lr=0.1)
    with pytest.raises(TypeError, match=r"counters\(\) takes attributes that hold an int or a float, got "
                                        r"name='x'"):
        learner.name = "x"
        owned.counters(learner, "name")


# --------------------------------------------------------------------------- (b) a new family from outside
def write_cem(folder: Path) -> Path:
    """``folder/mylab/cem.py``: the extending page's cross-entropy method, outside the package; returns ``folder``."""
    (folder / "mylab").mkdir(parents=True, exist_ok=True)
    (folder / "mylab" / "__init__.py").write_text("")
    shutil.copy(ROOT / "tutorials" / "mylab" / "cem.py", folder / "mylab" / "cem.py")
    return folder


def test_the_cem_module_is_a_new_family_written_on_the_public_face():
    source = (ROOT / "tutorials" / "mylab" / "cem.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    private = [m for m in imported if m.startswith("rlstruct") and any(p.startswith("_") for p in m.split("."))]
    assert not private and "rlstruct.algos.harness" in imported, imported
    forget_mylab()
    sys.path.insert(0, str(ROOT / "tutorials"))
    try:
        from mylab import cem

        assert type(cem.ALGORITHM) is Algorithm and cem.ALGORITHM.loop is cem.train_cem
        assert cem.ALGORITHM.steps_setting == "n_steps"
    finally:
        sys.path.remove(str(ROOT / "tutorials"))
        forget_mylab()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_new_family_from_outside_trains_evaluates_resumes_and_profiles_in_other_processes(tmp_path, monkeypatch):
    """Training runs in a fresh interpreter through the console script (whose ``sys.path`` lacks the current folder):
    the new family's module imports by its ``MODULE:ATTRIBUTE`` where nothing imported it. Eval, the resume and
    profile run in children forked from this process (``mylab`` not imported, the lab the current folder), each
    importing it by the same source, without an interpreter's start each."""
    lab = write_cem(tmp_path / "lab")
    forget_mylab()
    monkeypatch.setattr(sys, "path", list(sys.path))  # the commands' own search of the current folder is undone
    tiny = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "16", "--elite-fraction", "0.5", "--eval-every", "2",
            "--n-evaluation-envs", "2", "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard",
            "--time-limit", "120"]
    trained = _run(str(RLSTRUCT), "train", "mylab.cem:ALGORITHM", *tiny, "--max-env-steps", "192", "--logdir", "run",
                   cwd=lab)
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout.splitlines()[-1])["env_steps"] == 192
    config = json.loads((lab / "run" / "config.json").read_text())
    assert (config["algo"], config["algorithm"]) == ("cem", "mylab.cem:ALGORITHM")
    saved = torch.load(lab / "run" / "checkpoint.pt", weights_only=True)
    assert set(saved["model"]) == {"mean", "population"} and list(saved["learner"]) == ["std"]

    monkeypatch.chdir(lab)
    evaluated = forked(["eval", "run", "--episodes", "2", "--max-steps", "20", "--trust-code"], tmp_path / "eval")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.splitlines()[-1])["algo"] == "cem"

    resumed = forked(["train", "mylab.cem:ALGORITHM", "--resume", "run", "--max-env-steps", "384"],
                     tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["env_steps"] == 384
    final = torch.load(lab / "run" / "checkpoint.pt", weights_only=True)
    assert final["iteration"] == 6 and not torch.equal(final["learner"]["std"], saved["learner"]["std"])

    profiled = forked(["profile", "--algo", "mylab.cem:ALGORITHM", "--n-envs", "4", "--n-timesteps", "8",
                       "--iterations", "2", "--png", ""], tmp_path / "profiled")
    assert profiled.returncode == 0, profiled.stderr
    report = json.loads(profiled.stdout.splitlines()[-1])
    assert report["env_steps"] == 2 * 4 * 8 and report["config"]["algo"] == "mylab.cem:ALGORITHM"
    assert report["seconds"]["learn"] > 0 and report["seconds"]["update_weights"] > 0


# --------------------------------------------------------------------------- (c) ask the description
def test_the_harness_dispatches_on_no_description_family():
    """The harness asks a description (its ``loop``, its ``steps_setting``), never which family's class it is (that
    an object is a description at all, ``isinstance(x, Algorithm)``, is no family)."""
    families = {"OnPolicyAlgorithm", "OffPolicyAlgorithm"}
    found = []
    for path in sorted((ROOT / "algos" / "_train").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "isinstance", "issubclass") and len(node.args) == 2:
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if named & families:
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, f"isinstance on a description's family in the harness: {found}"


def test_every_built_in_description_names_its_familys_loop():
    from rlstruct.algos._train import loops
    from rlstruct.algos._train.registry import ALGORITHMS, algorithm

    loops_of = {name: algorithm(name).loop for name in ALGORITHMS}
    assert {name for name, loop in loops_of.items() if loop is loops.train_on_policy} == {
        "reinforce", "a2c", "ppo", "pqn"}
    assert {name for name, loop in loops_of.items() if loop is loops.train_off_policy} == {"dqn", "sac", "td3"}


# --------------------------------------------------------------------------- rlstruct profile, every family
@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_profile_times_the_off_policy_loop(algo, env, capsys):
    from rlstruct.algos._train.cli import main

    argv = ["profile", "--algo", algo, "--env", env, "--n-envs", "2", "--n-timesteps", "4", "--iterations", "2",
            "--png", ""]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    seconds = report["seconds"]
    assert report["env_steps"] == 2 * 2 * 4 and report["iterations"] == 2 and report["config"]["algo"] == algo
    for phase in ("env_step", "agent_forward", "push", "learn", "record"):
        assert seconds[phase] > 0, phase
    assert seconds["normalize"] == 0  # an on-policy phase
    assert main([*argv, "--overlap"]) == 2
    assert f"error: overlap is not a setting of {algo.upper()}, got overlap=True" in capsys.readouterr().err
