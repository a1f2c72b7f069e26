"""PQN: its Q(lambda) targets against a plain-Python loop, its loss by hand, its config checks, its network and
evaluation agent, and a short learning run on CartPole-v1 (the solve with its preset is in test_algos_learning.py).
"""

from __future__ import annotations

import pytest
import torch

from rlstruct.algos import EnvSpec, create_env, describe_env, pqn
from rlstruct.algos._train.evaluation import evaluation_agent
from rlstruct.algos._train.session import validate
from rlstruct.algos.dqn import QNetwork, create_q_agent, q_network
from rlstruct.algos.pqn import PQNConfig, pqn_loss, q_lambda_targets
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.errors import ConfigError, SpaceError
from rlstruct.structures import DictTensor
from tests.algos.test_learning import RANDOM_POLICY_RETURN, _common, _trained_evals, assert_learned


def _reference_targets(rewards, next_max_q, terminated, done, gamma, lam):
    """Peng's Q(lambda), one env and one step at a time: the n-step returns of the rollout's continuation, weighted
    (1 - lam) lam^(n-1), the remaining weight on the longest one (to the episode's or the rollout's end)."""
    B, T = rewards.shape
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            total, weight, ret, discount = 0.0, 1.0, 0.0, 1.0
            for k in range(t, T):
                ret += discount * float(rewards[b, k])
                if terminated[b, k]:  # the return ends here, with nothing to bootstrap
                    total += weight * ret
                    break
                discount *= gamma
                n_step = ret + discount * float(next_max_q[b, k])
                if done[b, k] or k == T - 1:  # a truncation or the rollout's end: bootstrap from s'_k alone
                    total += weight * n_step
                    break
                total += weight * (1 - lam) * n_step
                weight *= lam
            out[b][t] = total
    return torch.tensor(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_targets_match_a_plain_python_loop_with_terminations_and_truncations(seed, lam):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 12
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    next_max_q = torch.randn(B, T, generator=g, dtype=torch.float64)
    ends = torch.rand(B, T, generator=g) < 0.25
    truncated = ends & (torch.rand(B, T, generator=g) < 0.5)
    terminated, done = ends & ~truncated, ends
    assert terminated.any() and truncated.any()
    got = q_lambda_targets(rewards, next_max_q, terminated, done, 0.9, lam)
    torch.testing.assert_close(got, _reference_targets(rewards, next_max_q, terminated, done, 0.9, lam).double())


def test_q_lambda_zero_is_one_step_q_learning_and_a_truncation_bootstraps_from_its_terminal_observation():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    next_max_q = torch.tensor([[10.0, 20.0, 30.0]])
    terminated = torch.tensor([[False, True, False]])
    done = torch.tensor([[True, True, False]])  # step 0 truncated, step 1 terminated
    got = q_lambda_targets(rewards, next_max_q, terminated, done, 0.5, 0.0)
    torch.testing.assert_close(got, torch.tensor([[1.0 + 5.0, 2.0, 3.0 + 15.0]]))
    # lambda does not carry a trace across an episode end: the same targets with lambda 1.
    torch.testing.assert_close(q_lambda_targets(rewards, next_max_q, terminated, done, 0.5, 1.0), got)


def test_pqn_loss_by_hand_and_its_gradient_reaches_only_the_taken_action():
    q = torch.tensor([[0.0, 1.0], [2.0, 0.0]], requires_grad=True)
    loss, stats = pqn_loss(q, torch.tensor([1, 0]), torch.tensor([3.0, 1.0]))
    assert loss.item() == pytest.approx(0.5 * (4.0 + 1.0) / 2)
    assert stats["q/taken"].item() == pytest.approx(1.5)
    loss.backward()
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, -1.0], [0.5, 0.0]]))
    huber, _ = pqn_loss(q, torch.tensor([1, 0]), torch.tensor([3.0, 1.0]), kind="huber")
    assert huber.item() == pytest.approx((1.5 + 0.5) / 2)


def test_the_q_network_has_a_layer_norm_before_each_hidden_activation():
    net = QNetwork(4, 2, (8, 8), layer_norm=True, activation="relu")
    names = [type(m).__name__ for m in net.q]
    assert names == ["Linear", "LayerNorm", "ReLU", "Linear", "LayerNorm", "ReLU", "Linear"]


@pytest.mark.parametrize("change,error,match", [
    ({"n_epochs": 0}, ValueError, "n_epochs must be >= 1, got 0"),
    ({"n_minibatches": 100_000}, ValueError, "n_minibatches must be <= the steps per collection"),
    ({"q_lambda": 1.5}, ValueError, r"q_lambda must lie in \[0, 1\], got 1.5"),
    ({"epsilon_decay_fraction": 0.0}, ValueError, r"epsilon_decay_fraction must lie in \(0, 1\], got 0.0"),
    ({"loss": "l1"}, ValueError, "loss must be 'mse' or 'huber', got 'l1'"),
    ({"activation": "gelu"}, ValueError, "activation must be 'relu' or 'tanh', got 'gelu'"),
    ({"max_env_steps": None, "anneal_lr": False}, ConfigError, "PQN decays epsilon over the step budget"),
    ({"env": "Pendulum-v1"}, SpaceError, "PQN takes discrete actions"),
])
def test_bad_settings_are_refused_before_anything_starts(change, error, match):
    with pytest.raises(error, match=match):
        validate(pqn.ALGORITHM, PQNConfig(**change))


def test_the_evaluation_agent_is_the_greedy_q_network_the_run_trained():
    spec = EnvSpec((4,), "float32", 2, 500)
    config = PQNConfig(hidden_sizes=(8,)).to_dict()
    create, kwargs, info = evaluation_agent("pqn", config, spec)
    agent = create(**kwargs)
    assert [type(m).__name__ for m in agent.model.q][:3] == ["Linear", "LayerNorm", "ReLU"]
    assert info["epsilon"].tolist() == [0.0]
    _, _, sampled = evaluation_agent("pqn", {**config, "evaluation_policy": "sample"}, spec)
    assert sampled["epsilon"].tolist() == [pytest.approx(config["epsilon_end"])]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("overlap", [False, True])
def test_each_collection_acts_with_the_epsilon_the_pipeline_is_given(overlap):
    spec = describe_env("CartPole-v1", "torch", None)
    model = q_network(spec, (8,), layer_norm=True, activation="relu")
    agent_args = {"spec": spec, "hidden_sizes": (8,), "layer_norm": True, "activation": "relu"}
    env_args = {"name": "CartPole-v1", "n_envs": 64, "autoreset": True}
    with RL_Batcher(8, create_q_agent, agent_args, create_env, env_args, 0, [0], agent_info=DictTensor(
            {"epsilon": torch.tensor([0.0])}), zero_copy=overlap) as batcher:
        pipe = Pipeline(batcher, WeightSync(batcher, model, "cpu", mode="copy"), overlap=overlap)
        pipe.start()
        greedy = []  # the fraction of greedy actions of each collection, read before the buffer is reused
        for epsilon in (0.0, 1.0, 1.0):
            tt = pipe.next(DictTensor({"epsilon": torch.full((64,), epsilon)})).trajectories
            argmax = model(tt["observation/frame"].flatten(0, 1)).argmax(-1)
            greedy.append((tt["action/action"].flatten() == argmax).float().mean().item())
        pipe.close()
    # Overlapped, a collection was launched with the epsilon of the call before it.
    acted = [0.0, 0.0, 1.0] if overlap else [0.0, 1.0, 1.0]
    for fraction, epsilon in zip(greedy, acted):
        assert fraction == 1.0 if epsilon == 0.0 else 0.3 < fraction < 0.7, (greedy, acted)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pqn_learns_cartpole(tmp_path):
    """Seeds 0-9, 16k env steps (benchmarks/thresholds.py pqn-cartpole): with 1 torch thread best evaluations
    209.8-500 (seed 0: 440.7), final 79.6-500; with 2, best 209.0-500, final 77.8-500 (seed 0: 440.7 and 302.0 against
    275.3 with 1). The thresholds (88 and 44) are 58% and 43% under the lowest of each. That a run repeats itself
    (a second run of each seed and thread count, measured then, gave the first's evaluations) is
    test_pqn_runs_are_reproducible_in_process's claim, at a size where it costs a tenth."""
    cfg = dict(max_env_steps=16_384, n_envs=16, n_steps=32, eval_every=4, seed=0, preset="none")
    result = pqn.train(PQNConfig(**_common(tmp_path, **cfg)))
    assert_learned(result, best=4 * RANDOM_POLICY_RETURN, final=2 * RANDOM_POLICY_RETURN)
    epsilons = [r["epsilon"] for r in result.history if "epsilon" in r]
    assert epsilons[0] == 1.0 and epsilons[-1] == pytest.approx(0.05)


@pytest.mark.slow  # 1.5-2.1 CPU s at a load of 10 on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_pqn_runs_are_reproducible_in_process(tmp_path):
    """Two runs of one seed give the same rows: the epsilon-greedy draws, the minibatches, the losses, the episodes
    and the evaluations (what the seed fixes does not depend on the budget: 8 collections of 8 envs x 16 steps)."""
    cfg = dict(max_env_steps=1_024, n_envs=8, n_steps=16, n_minibatches=4, eval_every=2, n_evaluation_envs=4,
               evaluation_max_steps=100, hidden_sizes=(16,), seed=3, preset="none")
    first = pqn.train(PQNConfig(**_common(tmp_path / "a", **cfg)))
    second = pqn.train(PQNConfig(**_common(tmp_path / "b", **cfg)))
    keys = ("epsilon", "loss/td", "q/taken", "train/episode_return", "eval/return")
    rows_a = [{k: r[k] for k in keys if k in r} for r in first.history]
    rows_b = [{k: r[k] for k in keys if k in r} for r in second.history]
    assert repr(rows_a) == repr(rows_b)  # repr: nan (no episode ended yet) equals nan
    assert len(_trained_evals(first)) >= 3 and any("loss/td" in r for r in rows_a)
    assert first.eval_return == second.eval_return
