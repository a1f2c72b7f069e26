"""DQN's learner: its gradient step's forwards (double DQN's three, Mnih et al.'s two with ``double=False``), the
loss it reports against :func:`~rlstruct.algos.dqn.dqn_loss` on the same Q-values, and ``autocast``: the forwards
in bfloat16, the loss, the weights and Adam's state in float32, and the training agent given the dtype.
"""

from __future__ import annotations

import pytest
import torch

from rlstruct.algos import describe_env, dqn
from rlstruct.algos._train.session import validate
from rlstruct.algos.dqn import DQNConfig, DQNLearner, dqn_loss
from rlstruct.algos.replay import ReplayBuffer
from rlstruct.errors import ConfigError
from tests.helpers import bare_run

SPEC = describe_env("CartPole-v1", "torch", None)
BATCH = 16


class _Buffer:
    """A replay buffer of one fixed batch (``sample`` returns it whatever the size asked)."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.batch = {"obs": torch.randn(BATCH, 4, generator=g), "next_obs": torch.randn(BATCH, 4, generator=g),
                      "action": torch.randint(0, 2, (BATCH,), generator=g), "ret": torch.rand(BATCH, generator=g),
                      "discount": torch.where(torch.rand(BATCH, generator=g) < 0.2, 0.0, 0.99)}

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        return self.batch

    update_priorities = ReplayBuffer.update_priorities  # a uniform buffer's: it keeps no priorities


def _learner(**settings) -> DQNLearner:
    config = DQNConfig(env="CartPole-v1", batch_size=BATCH, hidden_sizes=(32,), **settings)
    return DQNLearner(config, SPEC, None, device=torch.device("cpu"), seed=0, n_rows=1)


def _recorded(module: torch.nn.Module, into: list) -> None:
    module.register_forward_hook(lambda _m, args, out: into.append((args[0], out.detach())))


@pytest.mark.parametrize("double, online_calls", [(True, 2), (False, 1)])
def test_a_gradient_step_reports_the_loss_of_its_targets_and_runs_the_online_network_as_its_targets_need(
        double, online_calls):
    learner, buffer = _learner(double=double), _Buffer()
    online, target = [], []
    _recorded(learner.policy, online)
    _recorded(learner.target, target)
    stats = learner.gradient_step(buffer)
    assert len(online) == online_calls and len(target) == 1
    batch = buffer.batch
    assert torch.equal(online[0][0], batch["obs"]) and torch.equal(target[0][0], batch["next_obs"])
    next_online = online[1][1] if double else None
    expected, _ = dqn_loss(online[0][1], batch["action"], batch["ret"], batch["discount"], next_online, target[0][1])
    assert float(stats["loss/q"]) == pytest.approx(float(expected), rel=1e-6)


def test_plain_and_double_targets_differ_where_the_online_argmax_is_not_the_targets():
    returns, discounts = torch.tensor([0.0]), torch.tensor([1.0])
    online, target = torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 5.0]])
    q, action = torch.tensor([[0.0, 0.0]]), torch.tensor([0])
    double, _ = dqn_loss(q, action, returns, discounts, online, target, kind="mse")
    plain, _ = dqn_loss(q, action, returns, discounts, None, target, kind="mse")
    assert (float(double), float(plain)) == (4.0, 25.0)  # online picks action 0 (worth 2); the max is 5


def test_under_autocast_the_forwards_run_in_bfloat16_and_the_loss_weights_and_adam_stay_float32():
    learner = _learner(autocast="bfloat16")
    outputs = []
    _recorded(learner.policy, outputs)
    _recorded(learner.target, outputs)
    before = [p.detach().clone() for p in learner.policy.parameters()]
    stats = learner.gradient_step(_Buffer())
    assert [out.dtype for _, out in outputs] == [torch.bfloat16] * 3
    assert stats["loss/q"].dtype == torch.float32 and torch.isfinite(stats["loss/q"])
    assert all(p.dtype == torch.float32 for p in learner.policy.parameters())
    assert all(v.dtype == torch.float32 for s in learner.optimizer.state.values() for v in s.values()
               if torch.is_tensor(v) and v.is_floating_point())
    assert any(not torch.equal(a, p) for a, p in zip(before, learner.policy.parameters()))


def test_without_autocast_the_forwards_run_in_float32():
    learner = _learner()
    outputs = []
    _recorded(learner.policy, outputs)
    learner.gradient_step(_Buffer())
    assert {out.dtype for _, out in outputs} == {torch.float32}


@pytest.mark.parametrize("autocast, expected", [("none", None), ("bfloat16", torch.bfloat16)])
def test_the_training_agent_acts_under_the_runs_autocast_and_the_evaluation_agent_in_float32(
        tmp_path, monkeypatch, autocast, expected):
    from rlstruct.algos import qnetworks

    built = []

    class Recording(qnetworks.QAgent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.autocast)

    monkeypatch.setattr(qnetworks, "QAgent", Recording)
    dqn.train(DQNConfig(**bare_run(tmp_path, env="CartPole-v1", n_envs=2, rollout_steps=4, max_env_steps=64,
                                   learning_starts=16, gradient_steps=1, batch_size=8, hidden_sizes=(8,),
                                   n_evaluation_envs=1, evaluation_max_steps=8, autocast=autocast)))
    assert built[0] == expected  # the training batcher's agent, built first
    assert set(built[1:]) == {None}  # the evaluation's


def test_autocast_is_checked_for_dqn_as_for_the_on_policy_algorithms():
    with pytest.raises(ValueError, match=r"autocast must be one of \['none', 'bfloat16'\], got 'float16'; pass"):
        validate(dqn.ALGORITHM, DQNConfig(autocast="float16"))
    with pytest.raises(ConfigError, match=r"DQN: autocast='bfloat16' does not support check_devices=True"):
        validate(dqn.ALGORITHM, DQNConfig(autocast="bfloat16", check_devices=True))


def test_the_command_line_offers_autocast_and_double_to_dqn_and_not_autocast_to_sac(capsys):
    from rlstruct.algos._train.cli import main

    for algo, has in (("dqn", True), ("sac", False)):
        with pytest.raises(SystemExit):
            main(["train", algo, "--help"])
        out = capsys.readouterr().out
        assert ("--autocast" in out) == has and ("--no-double" in out) == has, algo
