"""rlstruct's Adam against torch.optim.Adam: the same parameters bit for bit, the same state dict, no dynamo import;
and ``adam_eps`` reaching every algorithm's optimizers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct.algos import dqn, ppo, sac
from rlstruct.algos._optim import Adam
from rlstruct.algos._train.checkpoints import load_checkpoint
from tests.helpers import bare_run


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(model: torch.nn.Module, opt, steps: int, seed: int, skip_last: bool = False) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 5, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if skip_last:  # a parameter without a gradient is skipped by both
            model[2].bias.grad = None
        opt.step()


@settings(max_examples=12, deadline=None)
@given(fused=st.sampled_from([True, None]), lr=st.floats(1e-4, 1e-1), weight_decay=st.sampled_from([0.0, 1e-2]),
       steps=st.integers(1, 12), seed=st.integers(0, 2**16), skip_last=st.booleans())
def test_steps_give_torchs_parameters_and_state_bit_for_bit(fused, lr, weight_decay, steps, seed, skip_last):
    ours, theirs = _model(seed), _model(seed)
    a = Adam(ours.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
    b = torch.optim.Adam(theirs.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
    _train(ours, a, steps, seed, skip_last)
    _train(theirs, b, steps, seed, skip_last)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            x, y = sa["state"][k][name], sb["state"][k][name]
            assert torch.equal(x, y) and x.dtype == y.dtype and x.device == y.device, (k, name)


@pytest.mark.parametrize("direction", ["torch-to-ours", "ours-to-torch"])
def test_a_state_dict_of_either_continues_in_the_other(direction):
    """A checkpoint written with torch.optim.Adam (earlier rlstruct runs) resumes into Adam, and back."""
    first, second = (torch.optim.Adam, Adam) if direction == "torch-to-ours" else (Adam, torch.optim.Adam)
    saved_model, straight_model = _model(1), _model(1)
    saved, straight = first(saved_model.parameters(), lr=0.01, fused=True), first(straight_model.parameters(),
                                                                                   lr=0.01, fused=True)
    _train(saved_model, saved, 3, seed=5)
    _train(straight_model, straight, 3, seed=5)
    resumed_model = _model(2)
    resumed_model.load_state_dict(saved_model.state_dict())
    resumed = second(resumed_model.parameters(), lr=0.5, fused=True)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.param_groups[0]["lr"] == 0.01  # the saved settings, as torch's load_state_dict does
    _train(resumed_model, resumed, 4, seed=6)
    _train(straight_model, straight, 4, seed=6)
    for p, q in zip(resumed_model.parameters(), straight_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_learning_rate_is_set_through_param_groups():
    p = torch.nn.Parameter(torch.ones(1))
    opt = Adam([p], lr=0.1)
    opt.param_groups[0]["lr"] = 0.0
    p.grad = torch.ones(1)
    opt.step()
    assert p.item() == 1.0


def test_zero_grad_keeps_or_drops_the_gradient():
    p = torch.nn.Parameter(torch.ones(2))
    opt = Adam([p])
    p.grad = torch.ones(2)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p.grad, torch.zeros(2))
    opt.zero_grad()
    assert p.grad is None


def test_a_state_dict_of_another_model_is_refused_naming_the_counts():
    opt = Adam(_model(0).parameters())
    other = torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
    with pytest.raises(ValueError, match="has 1 tensors, this optimizer's 4"):
        opt.load_state_dict(other.state_dict())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": -1.0}, r"lr must be >= 0, got -1.0"),
    ({"betas": (0.9, 1.0)}, r"betas must each be in \[0, 1\), got \(0.9, 1.0\)"),
    ({"eps": -1e-8}, r"eps must be >= 0"),
    ({"weight_decay": float("nan")}, r"weight_decay must be >= 0, got nan"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Adam([torch.nn.Parameter(torch.ones(1))], **kwargs)


def test_no_parameters_is_refused():
    with pytest.raises(ValueError, match="params must hold at least one tensor"):
        Adam([])


@pytest.mark.slow  # 4.5 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_a_training_run_never_imports_dynamo(tmp_path):
    """The reason this class exists: torch.optim's optimizers import torch._dynamo (about 1 s) at their first use."""
    code = ("import sys\n"
            "from rlstruct.algos.ppo import PPOConfig, train\n"
            "train(PPOConfig(env='CartPole-v1', max_env_steps=1024, logdir=sys.argv[1], progress=False,\n"
            "                tensorboard=False, n_evaluation_envs=2, evaluation_max_steps=20))\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, cls, extra", [
    (ppo, ppo.PPOConfig, {"n_steps": 8}),
    (dqn, dqn.DQNConfig, {"learning_starts": 16}),
    (sac, sac.SACConfig, {"env": "Pendulum-v1", "learning_starts": 16}),
])
def test_adam_eps_reaches_every_optimizer(tmp_path, module, cls, extra):
    result = module.train(cls(**bare_run(tmp_path, max_env_steps=64, n_envs=4, hidden_sizes=(8,), eval_every=100,
                                        adam_eps=1e-5, **extra)))
    assert result.env_steps == 64
    learner = load_checkpoint(str(tmp_path / "checkpoint.pt"))["learner"]
    groups = [g for key, state in learner.items() if key.endswith("optimizer")
              for g in state["param_groups"]]
    assert groups and all(g["eps"] == 1e-5 for g in groups)
