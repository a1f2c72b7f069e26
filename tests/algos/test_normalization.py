"""Observation and reward normalisation: the running statistics against numpy, their path from the learner to
every batcher's agent and into checkpoints, and the compiled update with them (learning with them: tutorial 09's
test)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rlstruct.algos import EnvSpec, a2c, create_env, describe_env, ppo, reinforce
from rlstruct.algos._normalization import ObservationNormalizer, ReturnNormalizer, RunningMoments
from rlstruct.algos._train.checkpoints import load_checkpoint
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.session import validate
from rlstruct.algos._train.update import UpdateStep, actor_critic_learner, clip_groups, reads
from rlstruct.algos.networks import ActorCritic, build_actor_critic, recurrent_actor_critic
from rlstruct.algos.policies import actor_critic_outputs, create_policy_agent
from rlstruct.batchers import RL_Batcher, WeightSync
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor
from tests.helpers import bare_run

SPEC = describe_env("CartPole-v1", "torch", None)


# ----------------------------------------------------------------------------------------------- the statistics
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 2**16)), min_size=1, max_size=5))
def test_running_moments_are_the_moments_of_every_valid_value_seen(batches):
    moments = RunningMoments((3,))
    seen = []
    for n, seed in batches:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 3, generator=g) * 5 + 2
        mask = (torch.rand(n, generator=g) < 0.7).float()
        moments.update(x, mask)
        seen.append(x[mask.bool()].double().numpy())
    values = np.concatenate(seen)
    assert int(moments.count) == len(values)
    if len(values):
        np.testing.assert_allclose(moments.mean.numpy(), values.mean(0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(moments.var.numpy(), values.var(0), rtol=1e-3, atol=1e-4)
    else:  # nothing valid yet: the initial moments
        assert torch.equal(moments.mean, torch.zeros(3)) and torch.equal(moments.var, torch.ones(3))


def test_observation_normalizer_standardises_clips_and_returns_float32():
    norm = ObservationNormalizer((2,), clip=3.0)
    assert torch.equal(norm(torch.tensor([[1.0, -5.0]])), torch.tensor([[1.0, -3.0]]))  # before any data: a clip
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1000, 2, generator=g, dtype=torch.float64) * torch.tensor([10.0, 0.1], dtype=torch.float64) + 7.0
    norm.update(x)
    y = norm(x)  # uniform values: within 1.8 standard deviations, none clipped
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(y.std(0, unbiased=False), torch.ones(2), atol=1e-4, rtol=0)
    assert torch.equal(norm(torch.tensor([[1e3, -1e3]])), torch.tensor([[3.0, -3.0]]))
    with pytest.raises(ValueError, match="clip must be > 0"):
        ObservationNormalizer((2,), clip=0.0)


def _reference_scaled_rewards(collections, gamma, clip, eps=1e-8):
    # Plain loops over rows and steps: each row's discounted return, carried across collections, reset after done.
    carry = [0.0] * collections[0][0].shape[0]
    returns, scaled = [], []
    for rewards, done in collections:
        for b in range(rewards.shape[0]):
            for t in range(rewards.shape[1]):
                carry[b] = carry[b] * gamma + float(rewards[b, t])
                returns.append(carry[b])
                if done[b, t]:
                    carry[b] = 0.0
        scaled.append((rewards / math.sqrt(np.var(returns) + eps)).clamp(-clip, clip))
    return scaled


@pytest.mark.parametrize("clip", [10.0, 1.5])
def test_return_normalizer_matches_per_row_loops_across_collections(clip):
    g = torch.Generator().manual_seed(3)
    collections = [(torch.rand(3, 5, generator=g) * 4 - 1, torch.rand(3, 5, generator=g) < 0.3) for _ in range(3)]
    norm = ReturnNormalizer(3, gamma=0.9, device="cpu", clip=clip)
    expected = _reference_scaled_rewards(collections, 0.9, clip)
    assert any(bool((want.abs() == clip).any()) for want in expected) == (clip == 1.5)  # the small bound binds
    for (rewards, done), want in zip(collections, expected):
        torch.testing.assert_close(norm(rewards, done, torch.ones(3, 5)), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="clip must be > 0"):
        ReturnNormalizer(3, gamma=0.9, device="cpu", clip=-1.0)


# ----------------------------------------------------------------------------------------------- the models
def test_models_without_normalisation_keep_their_weights_and_state_dict_keys():
    torch.manual_seed(0)
    plain = build_actor_critic(SPEC, (8,))
    torch.manual_seed(0)
    normed = build_actor_critic(SPEC, (8,), normalize_observations=True)
    assert plain.normalizer is None and not any(k.startswith("normalizer") for k in plain.state_dict())
    assert {k for k in normed.state_dict() if k.startswith("normalizer")} == {
        "normalizer.count", "normalizer.mean", "normalizer.var"}
    for k, v in plain.state_dict().items():  # same initial weights: the normalizer draws no random numbers
        assert torch.equal(v, normed.state_dict()[k])
    frame = torch.randn(5, 4)
    torch.testing.assert_close(normed.value(frame), plain.value(frame))  # initial statistics: identity within 10
    normed.normalizer.update(torch.randn(64, 4) * 3 + 1)
    assert not torch.allclose(normed.value(frame), plain.value(frame))


def test_normalisation_of_images_is_a_space_error():
    pixels = EnvSpec((4, 84, 84), "uint8", 4, 1000)
    with pytest.raises(SpaceError, match="normalize_observations takes flat observations.*drop normalize"):
        build_actor_critic(pixels, (8,), normalize_observations=True)
    with pytest.raises(SpaceError, match="normalize_observations takes flat observations"):
        recurrent_actor_critic(pixels, (8,), normalize_observations=True)
    pytest.importorskip("minatar", reason="the minatar extra is not installed: pip install 'rlstruct[minatar]'")
    with pytest.raises(SpaceError, match="normalize_observations takes flat observations"):
        validate(ppo.ALGORITHM, ppo.PPOConfig(env="MinAtar/Breakout-v1", normalize_observations=True))


@pytest.mark.parametrize("mode", ["shared", "copy", "cpu"])
def test_every_weight_sync_mode_gives_the_agent_the_learners_statistics(mode):
    agent_args = {"spec": SPEC, "hidden_sizes": (8,), "normalize_observations": True}
    with RL_Batcher(4, create_policy_agent, agent_args, create_env,
                    {"name": "CartPole-v1", "backend": "torch", "n_envs": 3, "autoreset": True}, 0, [0],
                    agent_info=DictTensor({"stochastic": torch.tensor([True])})) as batcher:
        model = build_actor_critic(SPEC, (8,), normalize_observations=True)
        sync = WeightSync(batcher, model, "cpu", mode)
        sync.push()
        model.normalizer.update(torch.randn(50, 4) * 2 + 3)
        sync.push()
        agent_norm = batcher.local_agent().model.normalizer
        for name in ("count", "mean", "var"):
            assert torch.equal(getattr(agent_norm, name), getattr(model.normalizer, name)), name


def _update_step(model, compile):
    @reads("frame", "next_frame", "action", "advantage", "mask")
    def loss_fn(batch):
        out = actor_critic_outputs(model, batch["frame"], batch["next_frame"], batch["action"])
        return a2c.a2c_loss(out["log_prob"], out["entropy"], out["value"], batch["advantage"], batch["mask"],
                            value_coef=0.5, entropy_coef=0.01, normalize_advantages=True)
    return UpdateStep(loss_fn, torch.optim.Adam(model.parameters(), lr=1e-2), clip_groups(model), max_grad_norm=0.5,
                      device="cpu", compile=compile, backend="aot_eager")


@pytest.mark.timeout(300)
def test_compiled_update_reads_the_statistics_updated_between_calls():
    torch.manual_seed(0)
    eager_model = ActorCritic(4, 2, (16,), normalize_observations=True)
    compiled_model = copy.deepcopy(eager_model)
    eager, compiled = _update_step(eager_model, False), _update_step(compiled_model, True)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        frame = torch.randn(6, 5, 4, generator=g) * 4 + 2
        batch = {"frame": frame, "next_frame": frame + 0.1, "action": torch.randint(0, 2, (6, 5), generator=g),
                 "advantage": torch.randn(6, 5, generator=g), "mask": torch.ones(6, 5)}
        for model in (eager_model, compiled_model):  # what the learner does before each update
            model.normalizer.update(frame.flatten(0, 1))
        a, b = eager(batch), compiled(batch)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    for p, q in zip(eager_model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------- training
@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, cls, extra", [
    (a2c, a2c.A2CConfig, {"n_steps": 8}),
    (ppo, ppo.PPOConfig, {"n_steps": 8, "n_epochs": 2}),
    (a2c, a2c.A2CConfig, {"n_steps": 8, "recurrent": True, "env": "CartPoleNoVel-v1"}),
])
def test_worker_processes_act_with_the_learners_statistics(tmp_path, module, cls, extra):
    """A worker's agent acting with other statistics than the learner's would sample other actions: the run
    through a worker process logs what the in-process run logs (same seeds), and every step counted."""
    cfg = dict(max_env_steps=8 * 8 * 4, n_envs=8, eval_every=100, hidden_sizes=(16,), log_every=1,
               normalize_observations=True, normalize_rewards=True, **extra)
    local = module.train(cls(**bare_run(tmp_path / "local", **cfg)))
    worker = module.train(cls(**bare_run(tmp_path / "worker", n_processes=1, **cfg)))
    updates = [[row for row in r.history if "train/episode_return" in row] for r in (local, worker)]
    assert len(updates[0]) == len(updates[1]) == 4
    for x, y in zip(*updates):
        for k in x:
            if k.startswith(("loss/", "train/")):
                assert (math.isnan(x[k]) and math.isnan(y[k])) or math.isclose(x[k], y[k], rel_tol=1e-5), k
    ckpt = load_checkpoint(str(tmp_path / "worker" / "checkpoint.pt"))
    assert int(ckpt["model"]["normalizer.count"]) == worker.env_steps


@pytest.mark.timeout(300)
@pytest.mark.parametrize("after", [False, True])
def test_statistics_merged_after_the_update_let_it_start_from_the_policy_that_acted(tmp_path, after):
    """One minibatch a collection: its update's ratios are those of the policy that acted against itself (an
    approximate KL of 0) when the statistics merge after the update, and off 1 when they merge before it (the
    first collection moves them most). Either way every valid step joins the statistics."""
    result = ppo.train(ppo.PPOConfig(**bare_run(
        tmp_path, env="Pendulum-v1", n_envs=4, n_steps=16, n_epochs=1, n_minibatches=1, log_every=1,
        max_env_steps=4 * 16 * 3, eval_every=100, hidden_sizes=(16,), log_std_init=-2.0,
        normalize_observations=True, obs_stats_after_update=after)))
    kl = [row["ppo/approx_kl"] for row in result.history if "ppo/approx_kl" in row]
    assert len(kl) == 3
    if after:
        assert kl == [0.0, 0.0, 0.0]
    else:
        assert kl[0] > 1e-4
    ckpt = load_checkpoint(str(tmp_path / "checkpoint.pt"))
    assert int(ckpt["model"]["normalizer.count"]) == result.env_steps


@pytest.mark.parametrize("returns_gamma, expected", [(None, 0.98), (0.99, 0.99)])
def test_the_rewards_scale_takes_the_discount_of_its_own_setting_or_the_runs(returns_gamma, expected):
    config = ppo.PPOConfig(normalize_rewards=True, gamma=0.98, normalize_rewards_gamma=returns_gamma)
    _, normalize = actor_critic_learner(nn.Linear(2, 2), config, n_rows=3, device="cpu")
    assert normalize.returns.gamma == expected


@pytest.mark.timeout(300)
def test_reinforce_counts_only_the_valid_steps_and_the_checkpoint_evaluates(tmp_path):
    result = reinforce.train(reinforce.ReinforceConfig(**bare_run(
        tmp_path, max_env_steps=300, n_envs=4, hidden_sizes=(8,), eval_every=100, normalize_observations=True,
        normalize_rewards=True)))
    ckpt = load_checkpoint(str(tmp_path / "checkpoint.pt"))
    assert int(ckpt["model"]["normalizer.count"]) == result.env_steps  # episodes' steps, not the padding
    assert ckpt["config"]["normalize_observations"] is True
    out = evaluate_checkpoint(str(tmp_path), episodes=2)
    assert out["episodes"] == 2 and math.isfinite(out["eval_return"])


# Learning with both normalisations (Pendulum's rewards of -16 to 0 a step, no hand-picked reward scale): tutorial 09's
# normalised_ppo runs these settings, seed 0, 60k env steps, and tests/project/test_tutorials.py checks it ends above
# -560 (its docstring gives the spread over seeds and torch threads).
