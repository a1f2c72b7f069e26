"""Prioritized replay (rlstruct.algos.replay.PrioritizedReplayBuffer and its sum tree), tested against a reference:
the draws follow the priorities, the weights are Schaul et al.'s formula (normalised over the batch), and DQN
and SAC train with it."""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct.algos import EnvSpec, dqn, sac, td3
from rlstruct.algos._replay_priority import SumTree
from rlstruct.algos.replay import PrioritizedReplayBuffer


def _filled(n: int, priorities: torch.Tensor, *, alpha: float = 1.0, beta0: float = 0.4) -> PrioritizedReplayBuffer:
    buf = PrioritizedReplayBuffer(n, 1, "cpu", alpha=alpha, beta0=beta0, seed=3, eps=0.0)
    ids = torch.arange(n)
    buf.push(ids.float()[:, None], ids, ids.float(), ids.float()[:, None], torch.ones(n))
    buf.update_priorities(ids, priorities)
    return buf


def test_the_sum_tree_sums_and_finds_like_a_prefix_sum():
    g = torch.Generator().manual_seed(0)
    for capacity in (1, 2, 5, 64, 1000):
        p = torch.rand(capacity, generator=g, dtype=torch.float64) * (torch.rand(capacity, generator=g) > 0.3)
        p[0] = 0.5  # at least one positive leaf
        tree = SumTree(capacity, "cpu")
        tree.update(torch.arange(capacity), p)
        assert math.isclose(float(tree.total), float(p.sum()), rel_tol=1e-12)
        mass = torch.rand(500, generator=g, dtype=torch.float64) * p.sum()
        reference = torch.searchsorted(torch.cumsum(p, 0), mass, right=True).clamp(max=capacity - 1)
        found = tree.find(mass)
        assert torch.equal(found, reference) and bool((p[found] > 0).all())
        tree.update(torch.tensor([0, 0]), torch.tensor([2.0, 2.0]))  # a repeated index
        assert math.isclose(float(tree.total), float(p[1:].sum()) + 2.0, rel_tol=1e-12)


def test_draws_follow_the_priorities():
    """A chi-square test of 40,000 draws over 20 transitions of priorities 1..20 (alpha 0.7): the statistic stays
    well below the 0.1% quantile of chi-square with 19 degrees of freedom (43.8)."""
    n, draws = 20, 40_000
    td = torch.arange(1, n + 1, dtype=torch.float32)
    buf = _filled(n, td, alpha=0.7)
    counts = torch.zeros(n)
    for _ in range(draws // 500):
        counts += torch.bincount(buf.sample(500)["action"], minlength=n)
    expected = td.double().pow(0.7) / td.double().pow(0.7).sum() * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8, chi2


def test_weights_are_schauls_formula():
    n = 8
    td = torch.tensor([0.5, 1.0, 2.0, 4.0, 0.25, 3.0, 1.5, 0.75])
    buf = _filled(n, td, alpha=0.6, beta0=0.4)
    for fraction, beta in ((0.0, 0.4), (0.5, 0.7), (1.0, 1.0), (2.0, 1.0)):
        buf.anneal(fraction)
        batch = buf.sample(64)
        p = td.double().pow(0.6)
        prob = p / p.sum()
        w = (n * prob).pow(-beta)
        expected = (w[batch["index"]] / w[batch["index"]].max()).float()
        assert buf.beta == pytest.approx(beta)
        torch.testing.assert_close(batch["weight"], expected)
        assert torch.equal(batch["action"], batch["index"])  # the rows the weights are for


def test_a_transition_of_td_error_zero_leaves_the_other_weights_at_one():
    """The weights are normalised over the batch: a transition at the priority floor eps^alpha (TD error 0, which a
    fitted network keeps somewhere in its buffer) does not shrink the updates of the batches it is not in."""
    buf = PrioritizedReplayBuffer(64, 1, "cpu", alpha=0.6, beta0=1.0, seed=0)
    ids = torch.arange(64)
    buf.push(ids.float()[:, None], ids, ids.float(), ids.float()[:, None], torch.ones(64))
    buf.update_priorities(ids, (ids > 0).float())
    batch = buf.sample(32)
    assert not bool((batch["index"] == 0).any())
    assert torch.equal(batch["weight"], torch.ones(32))


def test_new_transitions_get_the_largest_priority_so_far():
    buf = _filled(4, torch.tensor([1.0, 9.0, 1.0, 1.0]))
    buf.push(torch.zeros(1, 1), torch.tensor([7]), torch.zeros(1), torch.zeros(1, 1), torch.ones(1))
    assert buf.tree.get(torch.tensor([0])).item() == 9.0  # row 0 overwritten by the new transition


def test_a_bad_exponent_is_an_error():
    with pytest.raises(ValueError, match=r"beta0 in \[0, 1\], got alpha=0.6, beta0=1.5"):
        PrioritizedReplayBuffer(4, 1, "cpu", beta0=1.5)


def test_priorities_of_no_rows_or_no_td_errors_are_an_error():
    buf = _filled(4, torch.ones(4))
    with pytest.raises(ValueError, match=r"^index must be a tensor of the sampled rows' index, got None; pass"):
        buf.update_priorities(None, torch.ones(4))
    with pytest.raises(ValueError, match=r"^td_error must be a tensor of the sampled rows' td_error, got None"):
        buf.update_priorities(torch.arange(4), None)


@pytest.mark.parametrize("module", [sac, td3])
def test_a_twin_critic_gradient_step_gives_the_sampled_rows_their_td_errors_as_priorities(module):
    spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
    config = module.ALGORITHM.config_cls(hidden_sizes=(8,), batch_size=8)
    learner = module.ALGORITHM.make_learner(config, spec, None, device=torch.device("cpu"), seed=0, n_rows=1)
    buf = PrioritizedReplayBuffer.for_spec(spec, 16, "cpu", alpha=1.0, eps=0.0)
    g = torch.Generator().manual_seed(0)
    buf.push(torch.randn(16, 3, generator=g), torch.rand(16, 1, generator=g) * 4 - 2, torch.randn(16, generator=g),
             torch.randn(16, 3, generator=g), torch.full((16,), 0.9))
    sampled, updates = [], []
    sample, update = buf.sample, buf.update_priorities
    buf.sample = lambda n: sampled.append(sample(n)) or sampled[-1]
    buf.update_priorities = lambda index, td_error: updates.append((index, td_error)) or update(index, td_error)
    stats = learner.gradient_step(buf)
    ((index, td_error),) = updates
    assert index is sampled[0]["index"] and td_error.shape == (8,) and not td_error.requires_grad
    assert "td_error" not in stats and bool((td_error > 0).all())
    torch.testing.assert_close(buf.tree.get(index), td_error.double())


@pytest.mark.slow  # 5.0 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(300)
def test_dqn_and_sac_train_with_prioritized_replay_on_disk(tmp_path):
    common = {"progress": False, "tensorboard": False, "time_limit": 120.0, "prioritized_replay": True,
              "replay_storage": "disk", "seed": 0}
    result = dqn.train(dqn.DQNConfig(**common, logdir=str(tmp_path / "dqn"), max_env_steps=1_024, n_envs=4,
                                     learning_starts=128, gradient_steps=4, batch_size=16, buffer_size=512,
                                     hidden_sizes=(16,)))
    losses = [r["loss/q"] for r in result.history if "loss/q" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    assert all("td_error" not in r for r in result.history)
    result = sac.train(sac.SACConfig(**common, env="Pendulum-v1", logdir=str(tmp_path / "sac"), max_env_steps=512,
                                     n_envs=2, learning_starts=128, batch_size=16, buffer_size=512,
                                     hidden_sizes=(16,)))
    losses = [r["loss/critic"] for r in result.history if "loss/critic" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    assert not any((tmp_path / "dqn" / "replay").glob("*.bin"))  # the buffer's files are gone with the run
