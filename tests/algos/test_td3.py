"""TD3 (rlstruct.algos.td3): its losses against plain loops, its actor and agent, the delayed updates of its learner,
its settings, the command line, and a short learning run."""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct.algos import EnvSpec, load, td3
from rlstruct.algos._train.session import validate
from rlstruct.algos.qnetworks import TwinQNetwork
from rlstruct.algos.replay import ReplayBuffer
from rlstruct.algos.td3 import (
    DeterministicActor,
    TD3Config,
    TD3Learner,
    create_td3_agent,
    smoothed_target_actions,
    td3_actor_loss,
    td3_critic_loss,
    td3_targets,
)
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor
from tests.algos.test_cli import last_json
from tests.helpers import assert_learned_within_budget, rlstruct_in_process

SPEC = EnvSpec((3,), "float32", None, 200, action_shape=(2,), action_low=(-2.0, 0.0), action_high=(2.0, 1.0))


# --------------------------------------------------------------------------- losses, against plain loops
def _smoothed_by_hand(action, noise, low, high, target_noise, clip):
    out = []
    for a_row, e_row in zip(action.tolist(), noise.tolist()):
        row = []
        for a, e, lo, hi in zip(a_row, e_row, low, high):
            scale = (hi - lo) / 2
            eps = min(max(target_noise * e, -clip), clip)
            row.append(min(max(a + eps * scale, lo), hi))
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(3))
def test_target_smoothing_is_the_clipped_noise_scaled_to_the_bounds_then_clipped_to_them(seed):
    g = torch.Generator().manual_seed(seed)
    action = torch.rand(64, 2, generator=g) * torch.tensor([4.0, 1.0]) + torch.tensor([-2.0, 0.0])
    noise = torch.randn(64, 2, generator=g) * 3
    got = smoothed_target_actions(action, noise, torch.tensor([2.0, 0.5]), torch.tensor([0.0, 0.5]),
                                  target_noise=0.2, noise_clip=0.5)
    torch.testing.assert_close(got, _smoothed_by_hand(action, noise, (-2.0, 0.0), (2.0, 1.0), 0.2, 0.5))
    assert (got[:, 0].abs() <= 2).all() and ((got[:, 1] >= 0) & (got[:, 1] <= 1)).all()


def test_targets_take_the_smaller_target_critic_and_stop_at_terminations():
    returns, discounts = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0.99, 0.0, 0.9])
    next_q = torch.tensor([[5.0, 7.0, -1.0], [3.0, 9.0, -4.0]])
    by_hand = [r + d * min(q1, q2) for r, d, q1, q2 in zip(returns.tolist(), discounts.tolist(), *next_q.tolist())]
    torch.testing.assert_close(td3_targets(returns, discounts, next_q), torch.tensor(by_hand))


def test_critic_loss_sums_each_critics_mean_squared_error_and_ignores_the_targets_gradient():
    q = torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.0, -1.0]], requires_grad=True)
    y = torch.tensor([2.0, 2.0, 0.0], requires_grad=True)
    loss, stats = td3_critic_loss(q, y)
    by_hand = sum(sum((qi - yi) ** 2 for qi, yi in zip(row, y.tolist())) / 3 for row in q.tolist())
    assert float(loss.detach()) == pytest.approx(by_hand)
    loss.backward()
    assert y.grad is None
    torch.testing.assert_close(q.grad, 2 * (q - y).detach() / 3)
    assert float(stats["q_mean"]) == pytest.approx(5.5 / 6) and "td_error" not in stats


def test_critic_loss_with_weights_weighs_each_transition_and_gives_the_td_errors():
    q, y, w = torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([2.0, 2.0]), torch.tensor([0.5, 2.0])
    loss, stats = td3_critic_loss(q, y, weights=w)
    by_hand = sum(sum(wi * (qi - yi) ** 2 for qi, yi, wi in zip(row, y.tolist(), w.tolist())) / 2
                  for row in q.tolist())
    assert float(loss) == pytest.approx(by_hand)
    torch.testing.assert_close(stats["td_error"], torch.tensor([(1.0 + 1.0) / 2, (0.0 + 2.0) / 2]))


def test_actor_loss_is_the_first_critics_mean_and_flows_into_the_actor_only():
    torch.manual_seed(0)
    actor, critic = DeterministicActor(3, 2, (8,), SPEC.action_low, SPEC.action_high), TwinQNetwork(3, 2, (8,))
    obs = torch.randn(16, 3)
    critic.requires_grad_(False)
    q_pi = critic(obs, actor(obs))
    loss, stats = td3_actor_loss(q_pi)
    assert float(loss.detach()) == pytest.approx(-sum(q_pi[0].tolist()) / 16)
    assert torch.equal(stats["loss/actor"], loss.detach())
    loss.backward()
    assert all(p.grad is None for p in critic.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


# --------------------------------------------------------------------------- actor and agent
def test_the_actor_acts_within_the_bounds_and_clips_to_them():
    torch.manual_seed(0)
    actor = DeterministicActor(3, 2, (16,), SPEC.action_low, SPEC.action_high)
    action = actor(torch.randn(100, 3, dtype=torch.float64) * 100)
    assert action.dtype == torch.float32 and action.shape == (100, 2)
    assert (action[:, 0].abs() <= 2).all() and ((action[:, 1] >= 0) & (action[:, 1] <= 1)).all()
    torch.testing.assert_close(actor.clip(torch.tensor([[3.0, -1.0], [-0.5, 0.25]])),
                               torch.tensor([[2.0, 0.0], [-0.5, 0.25]]))


def _agent_actions(seed: int, frame: torch.Tensor, **info: bool | float) -> torch.Tensor:
    torch.manual_seed(0)  # the same weights
    agent = create_td3_agent(SPEC, (8,))
    agent.seed(seed)
    agent_info = DictTensor({k: torch.full((frame.shape[0],), v) for k, v in info.items()})
    return agent(None, DictTensor({"frame": frame}), agent_info)[0]["action"]


def test_the_agent_adds_seeded_noise_of_its_scale_acts_uniformly_when_asked_and_is_mu_without_noise():
    frame = torch.linspace(-1, 1, 3 * 4096).view(4096, 3)
    mu = _agent_actions(1, frame)
    torch.manual_seed(0)
    assert torch.equal(mu, create_td3_agent(SPEC, (8,)).deterministic(frame)[0])
    assert torch.equal(_agent_actions(2, frame, noise=0.0, random=False), mu)
    noisy = _agent_actions(1, frame, noise=0.1, random=False)
    assert torch.equal(noisy, _agent_actions(1, frame, noise=0.1, random=False))
    assert not torch.equal(noisy, _agent_actions(2, frame, noise=0.1, random=False))
    # The noise's std is 0.1 of each dimension's half-range (2 and 0.5); the untrained actor acts near the middle of
    # the range, where clipping to the bounds leaves it unchanged.
    std = (noisy - mu).std(0) / torch.tensor([2.0, 0.5])
    torch.testing.assert_close(std, torch.full_like(std, 0.1), rtol=0.05, atol=0)
    assert (noisy[:, 0].abs() <= 2).all() and ((noisy[:, 1] >= 0) & (noisy[:, 1] <= 1)).all()
    random = _agent_actions(1, frame, noise=0.1, random=True)
    assert (random[:, 0].abs() <= 2).all() and ((random[:, 1] >= 0) & (random[:, 1] <= 1)).all()
    assert float(random[:, 0].std()) == pytest.approx(4 / math.sqrt(12), rel=0.05)  # uniform over [-2, 2]


# --------------------------------------------------------------------------- the learner
class _OneBatch:
    """A replay buffer that gives the same batch every time."""

    def __init__(self, n: int = 32):
        g = torch.Generator().manual_seed(7)
        self.batch = {"obs": torch.randn(n, 3, generator=g), "next_obs": torch.randn(n, 3, generator=g),
                      "action": torch.rand(n, 2, generator=g) * torch.tensor([4.0, 1.0]) - torch.tensor([2.0, 0.0]),
                      "ret": torch.randn(n, generator=g),
                      "discount": torch.where(torch.rand(n, generator=g) < 0.2, 0.0, 0.99)}

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        assert batch_size == len(self.batch["ret"])
        return self.batch

    update_priorities = ReplayBuffer.update_priorities  # a uniform buffer's: it keeps no priorities


def _copy(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(b, p) for b, p in zip(before, module.parameters()))


def test_a_gradient_step_regresses_the_critics_on_the_smoothed_clipped_double_q_targets():
    config = TD3Config(hidden_sizes=(8,), batch_size=32, gamma=0.99)
    learner = TD3Learner(config, SPEC, None, device=torch.device("cpu"), seed=5, n_rows=2)
    buffer = _OneBatch()
    b = buffer.batch
    eps = torch.randn(32, 2, generator=torch.Generator().manual_seed(5))  # the learner's generator, seeded alike
    with torch.no_grad():
        next_action = _smoothed_by_hand(learner.target_policy(b["next_obs"]), eps, SPEC.action_low, SPEC.action_high,
                                        config.target_noise, config.target_noise_clip)
        next_q = learner.target_critic(b["next_obs"], next_action).tolist()
        y = [r + d * min(q1, q2) for r, d, q1, q2 in zip(b["ret"].tolist(), b["discount"].tolist(), *next_q)]
        q = learner.critic(b["obs"], b["action"]).tolist()
    by_hand = sum(sum((qi - yi) ** 2 for qi, yi in zip(row, y)) / 32 for row in q)
    stats = learner.gradient_step(buffer)
    assert float(stats["loss/critic"]) == pytest.approx(by_hand, rel=1e-5)


def test_the_actor_and_the_targets_move_every_policy_delay_critic_updates_from_the_first():
    config = TD3Config(hidden_sizes=(8,), batch_size=32, policy_delay=3)
    learner = TD3Learner(config, SPEC, None, device=torch.device("cpu"), seed=0, n_rows=2)
    buffer, moves = _OneBatch(), []
    for _ in range(7):
        before = [_copy(m) for m in (learner.critic, learner.policy, learner.target_critic, learner.target_policy)]
        stats = learner.gradient_step(buffer)
        moved = [_moved(b, m) for b, m in zip(before, (learner.critic, learner.policy, learner.target_critic,
                                                       learner.target_policy))]
        moves.append(moved)
        assert ("loss/actor" in stats) == moved[1]
    assert [m[0] for m in moves] == [True] * 7
    assert [m[1] for m in moves] == [m[2] for m in moves] == [m[3] for m in moves] == [
        True, False, False, True, False, False, True]
    assert learner.state.state_dict()["n_updates"] == 7


def test_the_targets_start_as_copies_and_move_by_tau():
    config = TD3Config(hidden_sizes=(8,), batch_size=32, tau=0.25, policy_delay=1)
    learner = TD3Learner(config, SPEC, None, device=torch.device("cpu"), seed=0, n_rows=2)
    for net, target in ((learner.policy, learner.target_policy), (learner.critic, learner.target_critic)):
        assert all(torch.equal(a, b) for a, b in zip(net.parameters(), target.parameters()))
        assert not any(p.requires_grad for p in target.parameters())
    before = _copy(learner.target_critic)
    learner.gradient_step(_OneBatch())
    for b, t, s in zip(before, learner.target_critic.parameters(), learner.critic.parameters()):
        torch.testing.assert_close(t, 0.75 * b + 0.25 * s)


def test_a_fresh_run_acts_uniformly_until_learning_starts_then_with_noise():
    config = TD3Config(learning_starts=100, exploration_noise=0.3)
    learner = TD3Learner(config, SPEC, None, device=torch.device("cpu"), seed=0, n_rows=3)
    early, late = learner.agent_info(99)[0], learner.agent_info(100)[0]
    assert early["random"].all() and not late["random"].any()
    assert torch.equal(late["noise"], torch.full((3,), 0.3))
    assert TD3Learner.exploration(config) == {"noise": 0.3, "random": True}
    assert td3.ALGORITHM.evaluation_agent_info({"exploration_noise": 0.3}) == {"noise": 0.0, "random": False}
    assert td3.ALGORITHM.evaluation_agent_info({"exploration_noise": 0.3}, "sample") == {"noise": 0.3, "random": False}


# --------------------------------------------------------------------------- config and spaces
def test_td3_refuses_discrete_actions():
    with pytest.raises(SpaceError, match="TD3 takes continuous actions, got env='CartPole-v1'"):
        validate(td3.ALGORITHM, TD3Config(env="CartPole-v1"))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("tau", 0.0, r"tau must lie in \(0, 1\], got 0.0"),
    ("policy_delay", 0, "policy_delay must be >= 1, got 0"),
    ("exploration_noise", -0.1, "exploration_noise must be >= 0, got -0.1"),
    ("target_noise_clip", -1.0, "target_noise_clip must be >= 0, got -1.0"),
    ("gradient_steps_per_env_step", -1.0, "gradient_steps_per_env_step must be >= 0, got -1.0"),
])
def test_bad_settings_name_the_setting(field, value, match):
    with pytest.raises(ValueError, match=match):
        validate(td3.ALGORITHM, TD3Config(**{field: value}))


def test_the_defaults_are_the_papers_and_cleanrls():
    config = TD3Config()
    assert (config.lr, config.batch_size, config.tau, config.policy_delay) == (3e-4, 256, 0.005, 2)
    assert (config.exploration_noise, config.target_noise, config.target_noise_clip) == (0.1, 0.2, 0.5)
    assert config.learning_starts == td3.TD3Config.learning_starts == 1_000


# --------------------------------------------------------------------------- the command line
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rlstruct_train_td3_checkpoints_evaluates_resumes_and_loads(tmp_path, capsys):
    tiny = ["--env", "Pendulum-v1", "--learning-starts", "64", "--batch-size", "32", "--hidden-sizes", "16", "16",
            "--n-envs", "2", "--rollout-steps", "8", "--n-evaluation-envs", "2", "--evaluation-max-steps", "50",
            "--eval-every", "10", "--no-progress", "--no-tensorboard"]
    out = rlstruct_in_process(capsys, "train", "td3", *tiny, "--max-env-steps", "256", "--logdir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert summary["env_steps"] == 256 and summary["preset"] == "td3-pendulum" and math.isfinite(
        summary["eval_return"])
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    # One critic update per env step from the acquisition that reaches learning_starts (the 4th of 16 env steps) on.
    assert ckpt["algo"] == "td3" and "net.0.weight" in ckpt["model"] and ckpt["learner"]["n_updates"] == 256 - 48
    assert set(ckpt["learner"]) == {"critic", "target_actor", "target_critic", "actor_optimizer", "critic_optimizer",
                                    "n_updates"}
    ev = rlstruct_in_process(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0 and last_json(ev.stdout)["algo"] == "td3", ev.stderr
    resumed = rlstruct_in_process(capsys, "train", "td3", "--resume", str(tmp_path), "--max-env-steps", "320",
                                  "--no-progress", "--no-tensorboard")
    assert resumed.returncode == 0, resumed.stderr
    assert last_json(resumed.stdout)["env_steps"] == 320
    policy = load(tmp_path)
    frame = torch.rand(5, 3) * 2 - 1
    action = policy.predict(frame)
    assert action.shape == (5, 1) and (action.abs() <= 2).all()
    assert torch.equal(action, policy.predict(frame))  # deterministic: mu(s)
    assert not torch.equal(action, policy.predict(frame, deterministic=False, seed=0))


# --------------------------------------------------------------------------- learning
@pytest.mark.long(reason="a learning proof: about 6,500 env steps of TD3 updates (seed 2 stops there; the budget is "
                         "9,600) take 30-40 CPU seconds on one thread, and at 6,400 some seeds' returns had not left a "
                         "random policy's")
@pytest.mark.timeout(900)  # about 45 s on two idle cores; a safety net for a loaded machine
def test_td3_learns_pendulum(tmp_path):
    # A random policy scores about -1200 on Pendulum-v1 (-1,199 to -1,834 at seeds 0 and 3's first evaluations); -200
    # is solved. The default config, in process, on an env-step budget of 9,600 steps. Seeds 0-4 with 1 and 2 torch
    # threads (benchmarks/thresholds.py td3-pendulum): best and final evaluations -159.2 to -130.6, the same with
    # either thread count; seeds 1-4 stop at the preset's -200 (8,064-8,864 env steps), seed 0 spends the budget.
    # TD3 leaves a random policy's returns late and abruptly (at 6,400 env steps seed 3 was still at -915 best and
    # -1,155 final), so the thresholds (-400 and -600) sit 240 and 440 under the lowest, far above random. The test
    # runs seed 2, which stopped at the preset's -200 at 8,064 env steps with either thread count (-146.8 best and
    # final), and stops the run at the best threshold instead (target_return, the only setting changed): a run is
    # the same until it stops, and an evaluation at or over -200 is one at or over -400, so the run stops no later
    # than the preset's would. Seed 2 stops at about 6,500 env steps (its evaluation at 6,400: -340.6), a fifth of
    # the gradient steps fewer.
    cfg = TD3Config(max_env_steps=9_600, seed=2, target_return=-400.0, progress=False, tensorboard=False,
                    logdir=str(tmp_path))
    result = td3.train(cfg)
    # It spends its budget, or stops before it where an evaluation and its confirmation on fresh episodes reach -400,
    # reporting the confirmation.
    assert_learned_within_budget(result, tmp_path, best=-400.0, final=-600.0, budget=9_600, target=-400.0)
