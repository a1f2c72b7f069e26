"""SAC (rlstruct.algos.sac): its losses against references, its agent, its transitions, and a short learning run."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from rlstruct.algos import EnvSpec, sac
from rlstruct.algos._replay_transitions import one_step_transitions
from rlstruct.algos._train.session import validate
from rlstruct.algos.harness import Resume
from rlstruct.algos.networks import polyak_update
from rlstruct.algos.sac import (
    SACConfig,
    SquashedGaussianActor,
    TwinQNetwork,
    create_sac_agent,
    sac_actor_loss,
    sac_critic_loss,
    sac_temperature_loss,
    soft_q_targets,
    squashed_gaussian_log_prob,
)
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor, TemporalDictTensor
from tests.helpers import assert_learned_within_budget

SPEC = EnvSpec((3,), "float32", None, 200, action_shape=(2,), action_low=(-2.0, 0.0), action_high=(2.0, 1.0))


# --------------------------------------------------------------------------- the squashed Gaussian
@pytest.mark.parametrize("seed", range(3))
def test_log_prob_matches_torch_transformed_distribution(seed):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(64, 2, generator=g, dtype=torch.float64)
    log_std = torch.randn(64, 2, generator=g, dtype=torch.float64) * 0.5
    low, high = torch.tensor([-2.0, 0.0], dtype=torch.float64), torch.tensor([2.0, 1.0], dtype=torch.float64)
    scale, bias = (high - low) / 2, (high + low) / 2
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(cache_size=1),
                                                                 AffineTransform(bias, scale)])
    with torch.random.fork_rng():  # rsample draws from the global generator: seeded here, whatever ran before
        torch.manual_seed(seed)
        action = dist.rsample()  # the transforms cache u, so log_prob does not invert tanh numerically
    pre_tanh = dist.transforms[0]._cached_x_y[0]
    expected = dist.log_prob(action).sum(-1)
    torch.testing.assert_close(squashed_gaussian_log_prob(pre_tanh, mean, log_std, scale), expected)


def test_log_prob_stays_finite_where_tanh_saturates():
    u = torch.tensor([[30.0], [-30.0]])
    lp = squashed_gaussian_log_prob(u, torch.zeros(2, 1), torch.zeros(2, 1), torch.ones(1))
    assert torch.isfinite(lp).all()
    # log(1 - tanh(u)^2) ~ log 4 - 2|u| for large |u|
    torch.testing.assert_close(lp, Normal(0.0, 1.0).log_prob(u).squeeze(-1) - (math.log(4) - 60.0))


def test_actor_samples_within_bounds_and_its_log_prob_is_the_distributions():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, (16,), SPEC.action_low, SPEC.action_high)
    obs, noise = torch.randn(100, 3), torch.randn(100, 2) * 3
    action, log_prob = actor.sample(obs, noise)
    assert action.shape == (100, 2) and log_prob.shape == (100,)
    assert (action[:, 0].abs() <= 2).all() and ((action[:, 1] >= 0) & (action[:, 1] <= 1)).all()
    mean, log_std = actor(obs)
    torch.testing.assert_close(log_prob, squashed_gaussian_log_prob(mean + log_std.exp() * noise, mean, log_std,
                                                                    actor.scale))
    torch.testing.assert_close(actor.deterministic(obs), torch.tanh(mean) * actor.scale + actor.bias)
    assert (log_std >= sac.LOG_STD_MIN).all() and (log_std <= sac.LOG_STD_MAX).all()
    log_prob.sum().backward()
    assert actor.mean.weight.grad is not None and actor.log_std.weight.grad is not None


# --------------------------------------------------------------------------- losses
def test_soft_q_targets_take_the_smaller_critic_and_stop_at_terminations():
    targets = soft_q_targets(torch.tensor([1.0, 1.0]), torch.tensor([0.99, 0.0]),
                             torch.tensor([[5.0, 5.0], [3.0, 9.0]]), torch.tensor([-1.0, -1.0]), 0.5)
    torch.testing.assert_close(targets, torch.tensor([1.0 + 0.99 * (3.0 + 0.5), 1.0]))


def test_critic_loss_is_half_the_summed_mse_and_ignores_the_targets_gradient():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)
    y = torch.tensor([2.0, 2.0], requires_grad=True)
    loss, stats = sac_critic_loss(q, y)
    assert float(loss.detach()) == pytest.approx(0.5 * ((1 + 0) / 2 + (1 + 4) / 2))
    loss.backward()
    assert y.grad is None
    torch.testing.assert_close(q.grad, (q - y).detach() / 2)
    assert float(stats["q_mean"]) == 1.5


def test_actor_loss_uses_the_smaller_critic_and_flows_into_the_actor_only():
    torch.manual_seed(0)
    actor, critic = SquashedGaussianActor(3, 2, (8,), (-1.0, -1.0), (1.0, 1.0)), TwinQNetwork(3, 2, (8,))
    obs = torch.randn(16, 3)
    action, log_prob = actor.sample(obs, torch.randn(16, 2))
    critic.requires_grad_(False)
    q_pi = critic(obs, action)
    loss, stats = sac_actor_loss(q_pi, log_prob, 0.2)
    torch.testing.assert_close(loss, (0.2 * log_prob - torch.minimum(q_pi[0], q_pi[1])).mean())
    loss.backward()
    assert all(p.grad is None for p in critic.parameters())
    assert all(p.grad is not None for p in actor.parameters())
    torch.testing.assert_close(stats["entropy"], -log_prob.detach().mean())


def test_temperature_loss_raises_alpha_while_the_entropy_is_below_target():
    for log_prob, direction in ((torch.tensor([2.0, 4.0]), 1.0), (torch.tensor([-3.0, -5.0]), -1.0)):
        log_alpha = torch.tensor(0.0, requires_grad=True)
        loss, stats = sac_temperature_loss(log_alpha, log_prob, target_entropy=-1.0)
        loss.backward()
        # d loss / d log_alpha = -mean(log_prob + target_entropy); gradient descent moves log_alpha against it.
        assert float(log_alpha.grad) == pytest.approx(-float((log_prob - 1.0).mean()))
        assert math.copysign(1.0, -float(log_alpha.grad)) == direction
        assert float(stats["alpha"]) == 1.0


def test_polyak_update_moves_every_parameter_by_tau():
    torch.manual_seed(0)
    target, source = TwinQNetwork(3, 1, (4,)), TwinQNetwork(3, 1, (4,))
    before = [p.clone() for p in target.parameters()]
    polyak_update(target, source, 0.1)
    for b, t, s in zip(before, target.parameters(), source.parameters()):
        torch.testing.assert_close(t, 0.9 * b + 0.1 * s)
    polyak_update(target, source, 1.0)
    for t, s in zip(target.parameters(), source.parameters()):
        torch.testing.assert_close(t, s)


def test_twin_critics_are_independent():
    torch.manual_seed(0)
    critic = TwinQNetwork(3, 1, (8, 8))
    q = critic(torch.randn(5, 3), torch.randn(5, 1))
    assert q.shape == (2, 5) and not torch.allclose(q[0], q[1])


class _SeparateCritics(nn.Module):
    """The critics as separate MLPs, as TwinQNetwork held them before the ensemble (the checkpoints' layout)."""

    def __init__(self, obs_dim, action_dim, hidden_sizes, n_critics=2):
        super().__init__()
        sizes = [obs_dim + action_dim, *hidden_sizes]
        self.critics = nn.ModuleList(
            nn.Sequential(*(m for a, b in zip(sizes[:-1], sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())),
                          nn.Linear(sizes[-1], 1))
            for _ in range(n_critics))

    def forward(self, frame, action):
        x = torch.cat([frame, action], -1)
        return torch.stack([q(x).squeeze(-1) for q in self.critics])


def test_ensemble_critics_equal_separate_mlps_in_init_values_and_gradients():
    torch.manual_seed(0)
    separate = _SeparateCritics(3, 2, (16, 8))
    torch.manual_seed(0)
    ensemble = TwinQNetwork(3, 2, (16, 8))
    for j, layer in enumerate(ensemble.layers):  # the same draws: the same initial weights
        torch.testing.assert_close(layer.weight, torch.stack([q[2 * j].weight for q in separate.critics]))
        torch.testing.assert_close(layer.bias, torch.stack([q[2 * j].bias for q in separate.critics]))
    frame, action = torch.randn(7, 3), torch.randn(7, 2, requires_grad=True)
    q_sep, q_ens = separate(frame, action), ensemble(frame, action)
    torch.testing.assert_close(q_ens, q_sep)
    weights = torch.randn(2, 7)
    grad_sep = torch.autograd.grad((q_sep * weights).sum(), [action, *separate.parameters()])
    grad_ens = torch.autograd.grad((q_ens * weights).sum(), [action, *ensemble.parameters()])
    torch.testing.assert_close(grad_ens[0], grad_sep[0])
    for j, layer in enumerate(ensemble.layers):
        per_critic = [grad_sep[1:][6 * k + 2 * j: 6 * k + 2 * j + 2] for k in range(2)]
        torch.testing.assert_close(grad_ens[1 + 2 * j], torch.stack([g[0] for g in per_critic]))
        torch.testing.assert_close(grad_ens[2 + 2 * j], torch.stack([g[1] for g in per_critic]))


def test_the_separate_critics_state_loads_into_the_ensemble():
    separate, ensemble = _SeparateCritics(3, 2, (8,)), TwinQNetwork(3, 2, (8,))
    ensemble.load_state_dict(separate.state_dict())
    frame, action = torch.randn(5, 3), torch.randn(5, 2)
    torch.testing.assert_close(ensemble(frame, action), separate(frame, action))


def test_a_checkpoint_of_separate_critics_resumes_with_their_weights_and_adam_moments(tmp_path):
    config = SACConfig(hidden_sizes=(8,), logdir=str(tmp_path))
    critic, target = _SeparateCritics(3, 2, (8,)), _SeparateCritics(3, 2, (8,))
    actor = SquashedGaussianActor(3, 2, (8,), SPEC.action_low, SPEC.action_high)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=config.critic_lr)
    critic(torch.randn(4, 3), torch.randn(4, 2)).square().sum().backward()
    critic_opt.step()
    log_alpha = torch.zeros((), requires_grad=True)
    learner_state = {"critic": critic.state_dict(), "target_critic": target.state_dict(),
                     "log_alpha": torch.tensor(0.0),
                     "actor_optimizer": torch.optim.Adam(actor.parameters()).state_dict(),
                     "critic_optimizer": critic_opt.state_dict(),
                     "alpha_optimizer": torch.optim.Adam([log_alpha]).state_dict()}
    resume = Resume(path=tmp_path / "checkpoint.pt", algo="sac", config={}, iteration=1, env_steps=10, wall_time_s=1.0,
                    model=actor.state_dict(), learner=learner_state)
    learner = sac.SACLearner(config, SPEC, resume, device=torch.device("cpu"), seed=0, n_rows=1)
    learner.state.load_state_dict(resume.learner, path=resume.path)  # what the loop restores from the declaration
    frame, action = torch.randn(5, 3), torch.randn(5, 2)
    torch.testing.assert_close(learner.critic(frame, action), critic(frame, action))
    torch.testing.assert_close(learner.target_critic(frame, action), target(frame, action))
    separate_params = list(critic.parameters())
    for i, p in enumerate(learner.critic.parameters()):
        saved = [critic_opt.state[separate_params[i + len(separate_params) // 2 * k]] for k in range(2)]
        torch.testing.assert_close(learner.critic_opt.state[p]["exp_avg"], torch.stack([s["exp_avg"] for s in saved]))
        torch.testing.assert_close(learner.critic_opt.state[p]["exp_avg_sq"],
                                   torch.stack([s["exp_avg_sq"] for s in saved]))
        assert float(learner.critic_opt.state[p]["step"]) == 1.0
    critic = learner.state.state_dict()["critic"]
    assert set(critic) == {f"layers.{j}.{n}" for j in range(2) for n in ("weight", "bias")}


# --------------------------------------------------------------------------- transitions
def test_transitions_bootstrap_through_truncations_and_not_through_terminations():
    frames = torch.arange(12, dtype=torch.float32).view(1, 4, 3)
    tt = TemporalDictTensor({
        "observation/frame": frames,
        "action/action": torch.zeros(1, 4, 1),
        "_observation/reward": torch.tensor([[1.0, 2.0, 3.0, 4.0]]),
        "_observation/terminated": torch.tensor([[False, True, False, False]]),
        "_observation/done": torch.tensor([[False, True, True, False]]),  # step 2 is a truncation
        "_observation/frame": frames + 100,  # the terminal observations, before the auto-reset
    })
    tr = one_step_transitions(tt, 0.9)
    torch.testing.assert_close(tr["discount"], torch.tensor([0.9, 0.0, 0.9, 0.9]))
    torch.testing.assert_close(tr["next_obs"], frames[0] + 100)
    torch.testing.assert_close(tr["ret"], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert tr["obs"].shape == (4, 3) and tr["action"].shape == (4, 1)


# --------------------------------------------------------------------------- agent
def _agent_actions(seed: int, **info: bool) -> torch.Tensor:
    agent = create_sac_agent(SPEC, (8,))
    agent.seed(seed)
    agent_info = DictTensor({k: torch.full((6,), v) for k, v in info.items()})
    obs = DictTensor({"frame": torch.linspace(-1, 1, 18).view(6, 3)})
    return agent(None, obs, agent_info)[0]["action"]


def test_agent_samples_from_its_seed_takes_the_mean_when_not_stochastic_and_acts_randomly_when_asked():
    torch.manual_seed(0)
    a = _agent_actions(1, stochastic=True)
    torch.manual_seed(0)
    assert torch.equal(a, _agent_actions(1, stochastic=True))
    torch.manual_seed(0)
    assert not torch.equal(a, _agent_actions(2, stochastic=True))
    torch.manual_seed(0)
    greedy = _agent_actions(1, stochastic=False)
    torch.manual_seed(0)
    assert torch.equal(greedy, _agent_actions(2, stochastic=False))  # the mean: no randomness
    torch.manual_seed(0)
    random = _agent_actions(1, stochastic=True, random=True)
    assert random.shape == (6, 2) and (random[:, 0].abs() <= 2).all() and (random[:, 1] >= 0).all()
    assert not torch.allclose(random, a)


# --------------------------------------------------------------------------- config and spaces
def test_sac_refuses_discrete_actions():
    with pytest.raises(SpaceError, match="SAC takes continuous actions, got env='CartPole-v1'"):
        validate(sac.ALGORITHM, SACConfig(env="CartPole-v1"))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("tau", 0.0, r"tau must lie in \(0, 1\], got 0.0"),
    ("gradient_steps_per_env_step", -1.0, "gradient_steps_per_env_step must be >= 0, got -1.0"),
    ("batch_size", 0, "batch_size must be >= 1, got 0"),
    ("init_temperature", 0.0, "init_temperature must be > 0"),
])
def test_bad_settings_name_the_setting(field, value, match):
    with pytest.raises(ValueError, match=match):
        validate(sac.ALGORITHM, SACConfig(**{field: value}))


# --------------------------------------------------------------------------- learning
@pytest.mark.long(reason="a learning proof: 5,000 env steps of SAC updates take 30-40 CPU seconds, and with fewer "
                         "a seed ends too close to the threshold")
@pytest.mark.timeout(900)  # about 40 s on two idle cores; a safety net for a loaded machine
def test_sac_learns_pendulum(tmp_path):
    # A random policy scores about -1200 on Pendulum-v1 (this run's first evaluations: -1190 to -1810); -200 is
    # solved. The default config, in process, on an env-step budget of 5,000 steps. Seeds 0-9 with 1 and 2 torch
    # threads (benchmarks/thresholds.py sac-pendulum): best evaluations -435.6 to -113.8, final -660.3 to -113.8
    # (the two lowest both with one thread: seed 4's best, seed 6's final; with two threads those seeds gave -152.1
    # and -428.8). The thresholds (-550 and -850) are 115 and 190 under the lowest of each, and far above random.
    cfg = SACConfig(max_env_steps=5_000, seed=0, progress=False, tensorboard=False, logdir=str(tmp_path))
    result = sac.train(cfg)
    # It spends its budget, or stops before it where an evaluation and its confirmation on fresh episodes reach the
    # target (Pendulum-v1's -200, its preset's), reporting the confirmation.
    assert_learned_within_budget(result, tmp_path, best=-550.0, final=-850.0, budget=5_000, target=-200.0)
