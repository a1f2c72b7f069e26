"""Tutorial 6: A2C from the library, configured in code.

``rlstruct.algos`` holds one file per algorithm with the same anatomy: a ``@dataclass`` config (one
documented field per setting), the loss as a function, and ``train(config) -> TrainResult``. The
command line (``rlstruct train a2c --n-envs 32 ...``) is built from the same config, so everything
shown here can also be typed in a shell.

A2C here is n-step advantage actor-critic with GAE(lambda): the training batcher steps auto-reset
envs ``n_steps`` at a time and carries them over from one ``execute`` to the next; targets bootstrap
through time limits (truncation) and not through terminations.

Run it with ``python tutorials/06_a2c.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the training budget (env steps); the tests
run every tutorial with a small value.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import torch

from rlstruct.algos.a2c import A2CConfig, a2c_loss, train
from rlstruct.algos.distributions import Categorical

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


def the_loss() -> None:
    print("== 1. The loss is a plain function of [B, T] tensors")
    # a2c_loss(log_probs, entropy, values, advantages, mask, ...) averages over the valid steps only:
    # whatever sits in the padding of a batch (mask 0) does not change the loss or its gradient. It takes
    # the log-probabilities and entropies of the policy's distribution (a Categorical here, a DiagGaussian
    # for continuous actions: see tutorial 9), so one loss serves both kinds of action.
    torch.manual_seed(0)
    B, T, A = 4, 6, 2
    logits = torch.randn(B, T, A, requires_grad=True)
    values = torch.randn(B, T, requires_grad=True)
    actions = torch.randint(0, A, (B, T))
    advantages = torch.randn(B, T)
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(T) < lengths.unsqueeze(1)).float()
    kwargs = {"value_coef": 0.5, "entropy_coef": 0.01, "normalize_advantages": True}
    dist = Categorical(logits)
    loss, stats = a2c_loss(dist.log_prob(actions), dist.entropy(), values, advantages, mask, **kwargs)
    loss.backward()
    print("   loss terms:", {k: round(float(v), 4) for k, v in stats.items()})
    assert logits.grad[mask == 0].abs().max() == 0 and values.grad[mask == 0].abs().max() == 0
    garbage = torch.where(mask.bool(), advantages, torch.full_like(advantages, 1e6))
    loss2, _ = a2c_loss(dist.log_prob(actions), dist.entropy(), values, garbage, mask, **kwargs)
    assert torch.allclose(loss, loss2)


def train_a2c() -> None:
    print("== 2. Train A2C on CartPole-v1")
    budget = max(5_000, int(100_000 * SCALE))
    with tempfile.TemporaryDirectory() as logdir:
        config = A2CConfig(
            env="CartPole-v1",
            backend="torch",  # the torch simulator; "gymnasium" runs gymnasium's own CartPole
            n_envs=32,
            n_steps=8,  # one update per 8 steps of the 32 envs
            n_processes=0,  # collect in this process: small batches, nothing to overlap with
            gamma=0.99,
            gae_lambda=0.95,
            lr=1e-3,
            max_env_steps=budget,
            time_limit=600.0,  # the env-step budget ends the run; this is only a safety net
            eval_every=20,
            n_evaluation_envs=16,
            seed=0,
            logdir=logdir,
            progress=False,
            tensorboard=False,
            preset="none",  # these settings as written: a field equal to its default would take the env's preset
        )
        # A config is a plain dataclass: print it, copy it with changes, store it with the run.
        print("   changed from the defaults:",
              {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default and f.name != "logdir"})
        result = train(config)

        evaluations = [(int(r["env_steps"]), r["eval/return"]) for r in result.history if "eval/return" in r]
        train_returns = [r["train/episode_return"] for r in result.history if "train/episode_return" in r]
        for steps, ret in evaluations:
            print(f"   {steps:>8} env steps: greedy evaluation return {ret:7.1f}")
        print(f"   final: {result.eval_return:.1f} after {result.env_steps} env steps, {result.iterations} updates, "
              f"{result.wall_time_s:.1f} s")
        # Every update consumes n_steps steps of every env.
        assert result.env_steps == result.iterations * config.n_envs * config.n_steps >= budget
        assert len(evaluations) >= 2 and len(train_returns) > 0
        # The run leaves its config, its per-iteration CSV and a CPU checkpoint in logdir.
        assert {"config.json", "progress.csv", "checkpoint.pt"} <= set(os.listdir(logdir))
        # A uniformly random policy scores about 22. Already 10k steps of A2C (40 updates, the tests' scale)
        # take the greedy policy well past that (seeds 0-2 reach 60-280); 100k steps go further.
        assert result.eval_return > 50, result.eval_return

    print("== 3. Bad configs fail before anything starts")
    try:
        train(dataclasses.replace(config, n_envs=0))
    except ValueError as e:
        print("  ", e)
    else:
        raise AssertionError("n_envs=0 must be refused")


def main() -> None:
    the_loss()
    train_a2c()
    print("tutorial 06: all claims hold")


if __name__ == "__main__":
    main()
