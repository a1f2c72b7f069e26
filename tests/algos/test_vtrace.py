"""V-trace (Espeholt et al. 2018) and IMPALA's loss: against a float64 oracle written from the paper's sum, against
the on-policy returns it reduces to, and for what the loss lets the gradient through."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct.algos.losses import masked_policy_value_loss, vtrace_policy_value_loss
from rlstruct.algos.returns import discounted_returns, gae_advantages, vtrace
from rlstruct.errors import BatchSizeError, ConfigError
from tests.conftest import device_params


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-9) -> None:
    # torch.testing.assert_close would import torch.distributed on its first call: seconds of CPU for one comparison
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    assert torch.allclose(got, want, rtol=tol, atol=tol), f"max difference {(got - want).abs().max()}:\n{got}\n{want}"


def random_batch(B, T, seed, *, p_done=0.25, spread=1.0, on_policy=False):
    """A float64 batch of auto-reset rows with terminations, truncations and an unfinished last step.

    ``next_values`` is ``values`` one step on inside an episode (both are the critic's value of one observation), and
    independent elsewhere: the terminal observation of a truncation, the bootstrap at a row's end, and an arbitrary
    number after a termination, which no target may read.
    """
    rng = np.random.default_rng(seed)
    done = rng.random((B, T)) < p_done
    terminated = done & (rng.random((B, T)) < 0.5)
    values = rng.normal(size=(B, T))
    next_values = rng.normal(size=(B, T))
    inside = ~done[:, :-1]
    next_values[:, :-1][inside] = values[:, 1:][inside]
    behaviour = np.log(rng.uniform(0.05, 1.0, size=(B, T)))
    target = behaviour if on_policy else behaviour + spread * rng.normal(size=(B, T))
    arrays = {"behaviour_log_probs": behaviour, "target_log_probs": target, "rewards": rng.normal(size=(B, T)),
              "values": values, "next_values": next_values, "terminated": terminated, "done": done}
    return {k: torch.tensor(v) for k, v in arrays.items()}


def oracle_vtrace(blp, tlp, r, V, Vn, term, done, gamma, rho_bar, c_bar, lam):
    """The paper's n-step definition, one row and one step at a time:
    ``v_s = V(x_s) + sum_{t=s}^{end} gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t (r_t + gamma V(x_{t+1}) - V(x_t))``,
    ``end`` the episode's last step in the row, ``V(x_{t+1})`` zero after a termination and the recorded next value
    after a truncation or at the row's end; the advantage ``rho_s (r_s + gamma v_{s+1} - V(x_s))``."""
    targets, advantages = [], []
    for b in range(len(r)):
        T = len(r[b])
        ratio = [math.exp(tlp[b][t] - blp[b][t]) for t in range(T)]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lam * min(c_bar, x) for x in ratio]

        def next_value(t, b=b, T=T):
            if term[b][t]:
                return 0.0
            return Vn[b][t] if done[b][t] or t == T - 1 else V[b][t + 1]

        def end(s, b=b, T=T):
            return next((t for t in range(s, T) if done[b][t]), T - 1)

        v = [V[b][s] + sum(gamma ** (t - s) * math.prod(c[s:t]) * rho[t] * (r[b][t] + gamma * next_value(t) - V[b][t])
                           for t in range(s, end(s) + 1))
             for s in range(T)]
        adv = [rho[s] * (r[b][s] + gamma * (v[s + 1] if s < end(s) else next_value(s)) - V[b][s]) for s in range(T)]
        targets.append(v)
        advantages.append(adv)
    return targets, advantages


def call(batch, gamma, **kw):
    return vtrace(batch["behaviour_log_probs"], batch["target_log_probs"], batch["rewards"], batch["values"],
                  batch["next_values"], batch["terminated"], batch["done"], gamma, **kw)


finite_or_inf = st.one_of(st.floats(0.05, 4.0), st.just(math.inf))
at_least_one = st.one_of(st.floats(1.0, 4.0), st.just(math.inf))


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 10), seed=st.integers(0, 2**32 - 1), gamma=st.floats(0.0, 1.0),
       rho_bar=finite_or_inf, c_raw=st.one_of(st.floats(0.0, 4.0), st.just(math.inf)), lam=st.floats(0.0, 1.0))
def test_vtrace_equals_the_papers_sum(B, T, seed, gamma, rho_bar, c_raw, lam):
    c_bar = min(c_raw, rho_bar)
    batch = random_batch(B, T, seed)
    targets, advantages, _, _ = call(batch, gamma, rho_bar=rho_bar, c_bar=c_bar, lambda_=lam)
    lists = {k: v.tolist() for k, v in batch.items()}
    want_targets, want_advantages = oracle_vtrace(
        lists["behaviour_log_probs"], lists["target_log_probs"], lists["rewards"], lists["values"],
        lists["next_values"], lists["terminated"], lists["done"], gamma, rho_bar, c_bar, lam)
    assert_close(targets, torch.tensor(want_targets, dtype=torch.float64))
    assert_close(advantages, torch.tensor(want_advantages, dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 10), seed=st.integers(0, 2**32 - 1), gamma=st.floats(0.0, 1.0),
       rho_bar=at_least_one, c_raw=at_least_one,
       lam=st.floats(0.0, 1.0))
def test_on_policy_vtrace_is_the_bootstrapped_return_and_gae(B, T, seed, gamma, rho_bar, c_raw, lam):
    """On-policy, no weight is clipped: every rho and c is 1, the targets are GAE's (lambda) and, at lambda 1, the
    discounted returns bootstrapped at truncations and the row's end; there, the advantage
    ``r_s + gamma v_{s+1} - V(x_s)`` is that return less ``V(x_s)``."""
    c_bar = min(c_raw, rho_bar)
    b = random_batch(B, T, seed, on_policy=True)
    r, v, nv, term, done = b["rewards"], b["values"], b["next_values"], b["terminated"], b["done"]
    targets, advantages, rhos, cs = call(b, gamma, rho_bar=rho_bar, c_bar=c_bar, lambda_=lam)
    assert torch.equal(rhos, torch.ones_like(rhos)) and torch.allclose(cs, torch.full_like(cs, lam))
    assert_close(targets - v, gae_advantages(r, v, nv, term, done, gamma, lam))

    targets, advantages, _, _ = call(b, gamma, rho_bar=rho_bar, c_bar=c_bar)
    cut = done.clone()
    cut[:, -1] = True
    returns = discounted_returns(r, done, gamma, bootstrap=nv * (cut & ~term))
    assert_close(targets, returns)
    assert_close(advantages, returns - v)
    assert_close(advantages, gae_advantages(r, v, nv, term, done, gamma, 1.0))


def test_weights_above_the_clips_are_clipped_and_those_below_are_not():
    ratios = torch.tensor([[0.25, 0.9, 1.5, 3.0]], dtype=torch.float64)
    b = random_batch(1, 4, 0)
    b["target_log_probs"] = b["behaviour_log_probs"] + ratios.log()
    _, _, rhos, cs = call(b, 0.9, rho_bar=2.0, c_bar=1.0, lambda_=0.5)
    assert_close(rhos, torch.tensor([[0.25, 0.9, 1.5, 2.0]], dtype=torch.float64))
    assert_close(cs, 0.5 * torch.tensor([[0.25, 0.9, 1.0, 1.0]], dtype=torch.float64))

    _, stats = vtrace_policy_value_loss(b["target_log_probs"], torch.zeros(1, 4), b["values"],
                                        b["behaviour_log_probs"], b["rewards"], b["next_values"], b["terminated"],
                                        b["done"], torch.ones(1, 4), gamma=0.9, value_coef=0.5, entropy_coef=0.0,
                                        rho_bar=2.0)
    assert stats["rho"].item() == pytest.approx((0.25 + 0.9 + 1.5 + 2.0) / 4)
    assert stats["rho_clipped"].item() == pytest.approx(0.25)


def test_c_bar_zero_gives_one_step_targets():
    b = random_batch(3, 6, 1)
    targets, _, rhos, _ = call(b, 0.9, c_bar=0.0)
    nv = b["next_values"] * ~b["terminated"]
    assert_close(targets, b["values"] + rhos * (b["rewards"] + 0.9 * nv - b["values"]))


def loss_inputs(seed=0, B=3, T=6):
    b = random_batch(B, T, seed, spread=0.5)
    g = torch.Generator().manual_seed(seed)
    leaves = {"log_probs": b["target_log_probs"], "entropy": torch.rand(B, T, generator=g, dtype=torch.float64),
              "values": b["values"], "behaviour_log_probs": b["behaviour_log_probs"], "rewards": b["rewards"],
              "next_values": b["next_values"]}
    leaves = {k: v.clone().requires_grad_(True) for k, v in leaves.items()}
    mask = (torch.rand(B, T, generator=g) < 0.8).double()
    return leaves, b["terminated"], b["done"], mask


def impala_loss(leaves, terminated, done, mask, **kw):
    kw = {"gamma": 0.9, "value_coef": 0.5, "entropy_coef": 0.01, "rho_bar": 1.0, "c_bar": 0.8, **kw}
    return vtrace_policy_value_loss(leaves["log_probs"], leaves["entropy"], leaves["values"],
                                    leaves["behaviour_log_probs"], leaves["rewards"], leaves["next_values"],
                                    terminated, done, mask, **kw)


def test_the_gradient_reaches_log_probs_values_and_entropy_never_the_targets():
    leaves, terminated, done, mask = loss_inputs()
    loss, stats = impala_loss(leaves, terminated, done, mask)
    loss.backward()
    targets, advantages, _, _ = vtrace(leaves["behaviour_log_probs"], leaves["log_probs"], leaves["rewards"],
                                       leaves["values"], leaves["next_values"], terminated, done, 0.9, c_bar=0.8)
    assert not (targets.requires_grad or advantages.requires_grad)
    n = mask.sum()
    # the gradient of a loss whose targets are constants: any path through them would add to these
    assert_close(leaves["log_probs"].grad, -advantages * mask / n)
    assert_close(leaves["values"].grad, 0.5 * (leaves["values"].detach() - targets) * mask / n)
    assert_close(leaves["entropy"].grad, -0.01 * mask / n)
    for name in ("behaviour_log_probs", "rewards", "next_values"):
        assert leaves[name].grad is None, name
    assert all(s.dim() == 0 and not s.requires_grad for s in stats.values())
    want, _ = masked_policy_value_loss(leaves["log_probs"], leaves["entropy"], leaves["values"], targets, advantages,
                                       mask, value_coef=0.5, entropy_coef=0.01, normalize_advantages=False)
    assert_close(loss, want)


def test_padding_after_an_episode_end_changes_neither_the_loss_nor_its_gradient():
    leaves, terminated, done, _ = loss_inputs(seed=3, B=2, T=6)
    done, terminated = done.clone(), terminated.clone()
    done[0, 2] = terminated[0, 2] = True
    mask = torch.ones(2, 6, dtype=torch.float64)
    mask[0, 3:] = 0.0
    loss, _ = impala_loss(leaves, terminated, done, mask)
    grads = torch.autograd.grad(loss, [leaves["log_probs"], leaves["values"]])

    garbage = {k: v.detach().clone() for k, v in leaves.items()}
    for v in garbage.values():
        v[0, 3:] = 1e3
    garbage = {k: v.requires_grad_(True) for k, v in garbage.items()}
    other, _ = impala_loss(garbage, terminated, done, mask)
    other_grads = torch.autograd.grad(other, [garbage["log_probs"], garbage["values"]])
    assert_close(other, loss)
    for g, h in zip(grads, other_grads):
        assert_close(g[mask.bool()], h[mask.bool()])


def test_an_all_zero_mask_gives_a_zero_loss():
    leaves, terminated, done, mask = loss_inputs()
    loss, stats = impala_loss(leaves, terminated, done, torch.zeros_like(mask))
    assert loss.item() == 0.0 and all(math.isfinite(s.item()) for s in stats.values())


@pytest.mark.parametrize("device", device_params())
def test_vtrace_on_a_device_equals_the_cpu(device):
    b = random_batch(4, 8, 5)
    want = call(b, 0.95, rho_bar=1.5, c_bar=0.9, lambda_=0.9)
    got = call({k: v.to(device) for k, v in b.items()}, 0.95, rho_bar=1.5, c_bar=0.9, lambda_=0.9)
    for g, w in zip(got, want):
        assert g.device.type == torch.device(device).type
        assert_close(g.cpu(), w)


@pytest.mark.parametrize(("change", "kw", "error", "match"), [
    ("values", {}, BatchSizeError, r"values must have the shape of rewards \(2, 5\) \(\[B, T\]\), got \(2, 4\)"),
    ("done", {}, BatchSizeError, r"done must have the shape of rewards"),
    ("rewards", {}, BatchSizeError, r"rewards must be \[B, T\] \(rows, steps\), got shape \(10,\)"),
    (None, {"rho_bar": 0.0}, ConfigError, r"rho_bar must be > 0 .*, got 0.0; pass e.g. 1.0"),
    (None, {"rho_bar": math.nan}, ConfigError, r"rho_bar must be > 0"),
    (None, {"rho_bar": 1.0, "c_bar": 2.0}, ConfigError,
     r"c_bar must be in \[0, rho_bar=1.0\] \(V-trace assumes rho_bar >= c_bar\), got 2.0; pass c_bar <= rho_bar"),
    (None, {"c_bar": -0.5}, ConfigError, r"c_bar must be in \[0, rho_bar=1.0\]"),
    (None, {"lambda_": 1.5}, ConfigError, r"lambda_ must be in \[0, 1\], got 1.5"),
])
def test_bad_input_names_the_argument(change, kw, error, match):
    b = random_batch(2, 5, 0)
    if change == "values":
        b["values"] = b["values"][:, :4]
    elif change == "done":
        b["done"] = b["done"].T
    elif change == "rewards":
        b["rewards"] = b["rewards"].flatten()
    with pytest.raises(error, match=match):
        call(b, 0.9, **kw)


def test_the_loss_checks_its_own_tensors_and_accepts_c_bar_up_to_rho_bar():
    leaves, terminated, done, mask = loss_inputs()
    with pytest.raises(BatchSizeError, match=r"mask must have the shape of rewards \(3, 6\)"):
        impala_loss(leaves, terminated, done, mask[:, :5])
    with pytest.raises(ConfigError, match=r"c_bar must be in \[0, rho_bar=0.5\]"):
        impala_loss(leaves, terminated, done, mask, rho_bar=0.5, c_bar=0.8)
    loss, _ = impala_loss(leaves, terminated, done, mask, rho_bar=0.8, c_bar=0.8)
    assert torch.isfinite(loss)
