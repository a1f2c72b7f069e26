"""PPO: its loss against hand-computed values and a plain-Python reference, its config checks, and short
learning runs on CartPole-v1 (discrete) and Pendulum-v1 (continuous), from Python and from the command line.

A random policy scores about 22 on CartPole-v1 and about -1200 on Pendulum-v1. Budgets are env steps, every
seed is fixed and the batchers run in this process, so a run only fails when learning breaks.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct.algos import a2c, ppo, reinforce
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.session import validate
from rlstruct.algos.ppo import PPOConfig, ppo_loss
from tests.algos.shared_runs import WIDE_SOLVE, ppo_cartpole_wide_solve  # noqa: F401 (a fixture)
from tests.algos.test_cli import PLOT, TENSORBOARD, last_json
from tests.algos.test_learning import _common, _trained_evals, assert_learned
from tests.helpers import rlstruct_in_process

KW = {"clip_coef": 0.2, "value_clip": 0.0, "value_coef": 0.5, "entropy_coef": 0.01, "normalize_advantages": False}
# --------------------------------------------------------------------------- the loss
def test_ppo_loss_by_hand_clips_both_sides():
    # ratios 1.5 (A > 0: clipped to 1.2), 0.5 (A < 0: clipped to 0.8), 1.1 (A > 0, inside), 0.5 (A > 0: the
    # unclipped ratio is the smaller term and counts).
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.5])
    old = torch.tensor([-1.0, -2.0, -0.5, -0.3])
    new = (old + ratio.log()).requires_grad_()
    adv = torch.tensor([2.0, -1.0, 1.0, 3.0])
    values = torch.tensor([1.0, 0.0, 2.0, 0.0], requires_grad=True)
    returns = torch.tensor([0.0, 1.0, 2.0, 2.0])
    entropy = torch.tensor([0.5, 0.5, 1.0, 1.0], requires_grad=True)
    loss, stats = ppo_loss(new, old, adv, values, torch.zeros(4), returns, entropy, torch.ones(4), **KW)
    policy = -(1.2 * 2.0 + 0.8 * -1.0 + 1.1 * 1.0 + 0.5 * 3.0) / 4
    value = 0.5 * (1.0 + 1.0 + 0.0 + 4.0) / 4
    assert float(stats["loss/policy"]) == pytest.approx(policy, rel=1e-5)
    assert float(stats["loss/value"]) == pytest.approx(value, rel=1e-5)
    assert float(stats["loss/entropy"]) == pytest.approx(0.75, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(policy + 0.5 * value - 0.01 * 0.75, rel=1e-5)
    assert float(stats["ppo/clip_fraction"]) == pytest.approx(0.75)
    kl = sum((r - 1) - math.log(r) for r in ratio.tolist()) / 4
    assert float(stats["ppo/approx_kl"]) == pytest.approx(kl, rel=1e-5)
    loss.backward()
    # A clipped term passes no gradient to its log-probability; the others do.
    assert new.grad[0] == 0 and new.grad[1] == 0 and new.grad[2] < 0 and new.grad[3] < 0


def test_ppo_value_clipping_takes_the_larger_error():
    old_values = torch.tensor([0.0, 0.0, 0.0])
    values = torch.tensor([1.0, -0.1, 0.5], requires_grad=True)
    returns = torch.tensor([2.0, -1.0, 0.0])
    z = torch.zeros(3)
    _, stats = ppo_loss(z, z, z, values, old_values, returns, z, torch.ones(3), **{**KW, "value_clip": 0.2})
    # clipped values 0.2, -0.1, 0.2: errors max(1, 3.24), max(0.81, 0.81), max(0.25, 0.04)
    assert float(stats["loss/value"]) == pytest.approx(0.5 * (3.24 + 0.81 + 0.25) / 3, rel=1e-5)
    _, unclipped = ppo_loss(z, z, z, values, old_values, returns, z, torch.ones(3), **KW)
    assert float(unclipped["loss/value"]) == pytest.approx(0.5 * (1.0 + 0.81 + 0.25) / 3, rel=1e-5)


def _reference(new, old, adv, v, v_old, ret, ent, mask, clip, vclip, vcoef, ecoef, normalize):
    valid = [i for i in range(len(mask)) if mask[i] > 0]
    n = max(len(valid), 1)
    a = list(adv)
    if normalize and valid:
        mean = sum(adv[i] for i in valid) / n
        std = math.sqrt(sum((adv[i] - mean) ** 2 for i in valid) / n)
        a = [(x - mean) / (std + 1e-8) for x in adv]
    pol = val = h = 0.0
    for i in valid:
        r = math.exp(new[i] - old[i])
        pol += -min(r * a[i], min(max(r, 1 - clip), 1 + clip) * a[i])
        err = (v[i] - ret[i]) ** 2
        if vclip > 0:
            err = max(err, (v_old[i] + min(max(v[i] - v_old[i], -vclip), vclip) - ret[i]) ** 2)
        val += 0.5 * err
        h += ent[i]
    return (pol + vcoef * val - ecoef * h) / n


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("value_clip,normalize", [(0.0, False), (0.3, True)])
def test_ppo_loss_matches_a_plain_python_reference(seed, value_clip, normalize):
    g = torch.Generator().manual_seed(seed)
    n = 33
    t = [torch.randn(n, generator=g) for _ in range(7)]
    new, old = t[0] * 0.3, t[1] * 0.3
    mask = (torch.rand(n, generator=g) > 0.2).float()
    kw = {**KW, "value_clip": value_clip, "normalize_advantages": normalize}
    loss, _ = ppo_loss(new, old, t[2], t[3], t[4], t[5], t[6].abs(), mask, **kw)
    ref = _reference(*(x.tolist() for x in (new, old, t[2], t[3], t[4], t[5], t[6].abs(), mask)), 0.2, value_clip,
                     0.5, 0.01, normalize)
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-4, abs=1e-5)


def test_ppo_loss_of_an_all_zero_mask_is_zero_not_nan():
    x = torch.randn(5, requires_grad=True)
    loss, stats = ppo_loss(x, x.detach() + 1, x.detach(), x, x.detach(), x.detach(), x, torch.zeros(5),
                           **{**KW, "value_clip": 0.2, "normalize_advantages": True})
    assert float(loss.detach()) == 0.0 and all(math.isfinite(float(v)) for v in stats.values())
    loss.backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------------------- config checks
@pytest.mark.parametrize("change,match", [
    ({"n_minibatches": 10_000}, "n_minibatches must be <= the steps per collection"),
    ({"n_epochs": 0}, "n_epochs must be >= 1, got 0"),
    ({"clip_coef": 0.0}, "clip_coef must be > 0, got 0.0"),
    ({"value_clip": -1.0}, "value_clip must be >= 0"),
    ({"target_kl": 0.0}, "target_kl must be > 0 or None, got 0.0"),
])
def test_bad_settings_are_refused_before_anything_starts(change, match):
    with pytest.raises(ValueError, match=match):
        validate(ppo.ALGORITHM, PPOConfig(**change))


# --------------------------------------------------------------------------- learning
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_learns_cartpole(tmp_path):
    result = ppo.train(PPOConfig(**_common(tmp_path, max_env_steps=20_480, seed=0)))
    assert_learned(result, best=200.0, final=100.0)
    assert 0 < max(r["ppo/approx_kl"] for r in result.history if "ppo/approx_kl" in r) < 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group(WIDE_SOLVE)
def test_ppo_solves_cartpole_in_a_few_wide_iterations(ppo_cartpole_wide_solve):  # noqa: F811 (a fixture)
    """The GPU solve runs' settings (benchmarks/learning.py's ``ppo-cartpole-wide-torch``): 2,048 envs x 16 steps
    an iteration, overlapped, 2 epochs x 2 minibatches at lr 0.02 annealed over 100 iterations. The run is the
    session's (tests/algos/shared_runs.py), which test_policy_load.py's drive of gymnasium's CartPole loads."""
    result, _ = ppo_cartpole_wide_solve
    assert result.reached_target and result.iterations <= 45, (result.iterations, _trained_evals(result))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_learns_cartpole_stepped_by_gymnax(tmp_path):
    """The same task through the JAX adapter. gymnax draws its own initial states, so the run differs from the
    torch one: seeds 0-3 reach 164, 319, 486 and 344 (best), ending at 154 to 486; random scores about 22."""
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    result = ppo.train(PPOConfig(**_common(tmp_path, max_env_steps=20_480, seed=0, backend="gymnax")))
    assert_learned(result, best=130.0, final=90.0)


# PPO on Pendulum-v1 (continuous actions): the ppo-pendulum preset's test (tests/algos/test_presets.py) runs its
# settings (gamma 0.9, lr 2e-3, 16 envs x 250 steps, 10 epochs of 8 minibatches) towards -200 within 100k env steps,
# and tutorial 09's test (tests/project/test_tutorials.py) runs them to 100k; a third run here would prove nothing
# they do not.


@pytest.mark.timeout(300)
def test_target_kl_stops_the_epochs_early(tmp_path):
    cfg = PPOConfig(**_common(tmp_path, max_env_steps=4_096, n_epochs=8, target_kl=1e-6, lr=1e-2))
    epochs = [r["ppo/epochs"] for r in ppo.train(cfg).history if "ppo/epochs" in r]
    assert epochs and max(epochs) < 8


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overlap_with_a_worker_process_learns_and_is_reproducible(tmp_path):
    cfg = dict(max_env_steps=8_192, n_processes=1, overlap=True, hidden_sizes=(32,), eval_every=100)
    first = ppo.train(PPOConfig(**_common(tmp_path / "a", **cfg)))
    second = ppo.train(PPOConfig(**_common(tmp_path / "b", **cfg)))
    keys = ("loss/policy", "loss/value", "ppo/approx_kl")
    rows = [[{k: r[k] for k in keys if k in r} for r in res.history] for res in (first, second)]
    # The worker's timing does not matter: each collection's weights are fixed by the loop, not by the clock.
    assert repr(rows[0]) == repr(rows[1]) and first.env_steps >= 8_192
    assert all(math.isfinite(float(v)) for row in rows[0] for v in row.values())
    assert first.eval_return > 2 * 22.0


# --------------------------------------------------------------------------- continuous actions everywhere
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["reinforce", "a2c", "ppo"])
@pytest.mark.slow
def test_every_policy_gradient_algorithm_trains_pendulum_and_its_checkpoint_reloads(algo, tmp_path):
    """Continuous actions through each on-policy algorithm: 800 env steps (one iteration of REINFORCE's four
    200-step episodes), evaluated untrained and after training only (each evaluation is 200 steps of two envs);
    what learns Pendulum is the ppo-pendulum preset's test (tests/algos/test_presets.py)."""
    module, cfg_cls = {"reinforce": (reinforce, reinforce.ReinforceConfig), "a2c": (a2c, a2c.A2CConfig),
                       "ppo": (ppo, PPOConfig)}[algo]
    cfg = cfg_cls(**_common(tmp_path, env="Pendulum-v1", n_envs=4, n_evaluation_envs=2, max_env_steps=800,
                            eval_every=1_000, hidden_sizes=(16,)))
    result = module.train(cfg)
    assert result.env_steps >= 800 and -2_000 < result.eval_return < 0
    assert _trained_evals(result) and (tmp_path / "progress.csv").exists()
    ev = evaluate_checkpoint(result.checkpoint, episodes=2)
    assert ev["algo"] == algo and ev["env"] == "Pendulum-v1" and -2_000 < ev["eval_return"] < 0


@pytest.mark.learning_curve
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_trains_ppo_on_pendulum_and_eval_reads_its_checkpoint(tmp_path, capsys):
    """The console script's code in this process: its flags, files and checkpoint are what this test reads, and a
    fresh interpreter would add its imports and nothing this test checks."""
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "Pendulum-v1", "--max-env-steps", "2000", "--n-envs",
                              "4", "--n-steps", "100", "--n-minibatches", "4", "--n-evaluation-envs", "2", "--gamma",
                              "0.9", "--value-clip", "0.5", "--target-kl", "0.05", "--logdir", str(tmp_path),
                              "--no-progress")
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert summary["env_steps"] >= 2000 and -2_000 < summary["eval_return"] < 0
    assert (tmp_path / "learning_curve.png").exists() == PLOT
    assert bool(list(tmp_path.glob("events.out.tfevents.*"))) == TENSORBOARD
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["algo"] == "ppo" and "log_std" in ckpt["model"] and ckpt["config"]["value_clip"] == 0.5
    ev = rlstruct_in_process(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr
    assert last_json(ev.stdout)["algo"] == "ppo"
