"""The algorithms' numerics against hand-computed values and plain Python loops."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from rlstruct.algos import EnvSpec
from rlstruct.algos.a2c import a2c_loss
from rlstruct.algos.distributions import Categorical
from rlstruct.algos.dqn import QNetwork, double_dqn_targets, dqn_loss, dueling_q, epsilon_at
from rlstruct.algos.policies import create_policy_agent
from rlstruct.algos.reinforce import reinforce_loss, reinforce_returns
from rlstruct.algos.replay import NStepWindow, window_transitions
from rlstruct.algos.returns import discounted_returns, episode_statistics, gae_advantages, n_step_returns
from rlstruct.structures import DictTensor, TemporalDictTensor


# --------------------------------------------------------------------------- plain-loop references
def ref_discounted(rewards, done, gamma, bootstrap=None):
    out = []
    for b in range(len(rewards)):
        row, g = [0.0] * len(rewards[b]), 0.0
        for t in reversed(range(len(rewards[b]))):
            nxt = 0.0 if done[b][t] else g
            if bootstrap is not None:
                nxt += bootstrap[b][t]
            g = rewards[b][t] + gamma * nxt
            row[t] = g
        out.append(row)
    return out


def ref_gae(rewards, values, next_values, terminated, done, gamma, lam):
    out = []
    for b in range(len(rewards)):
        T = len(rewards[b])
        row, a = [0.0] * T, 0.0
        for t in reversed(range(T)):
            delta = rewards[b][t] + gamma * (0.0 if terminated[b][t] else next_values[b][t]) - values[b][t]
            a = delta + (0.0 if done[b][t] else gamma * lam * a)
            row[t] = a
        out.append(row)
    return out


def ref_n_step(rewards, done, terminated, gamma, n):
    R, last, disc = [], [], []
    for b in range(len(rewards)):
        L = len(rewards[b])
        rr, ll, dd = [], [], []
        for t in range(L - n + 1):
            total, k = 0.0, 0
            while True:
                total += gamma**k * rewards[b][t + k]
                if done[b][t + k] or k == n - 1:
                    break
                k += 1
            end = t + k
            rr.append(total)
            ll.append(end)
            dd.append(0.0 if terminated[b][end] else gamma ** (k + 1))
        R.append(rr)
        last.append(ll)
        disc.append(dd)
    return R, last, disc


def random_episodes(B, T, seed, p_done=0.2):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g)
    done = torch.rand(B, T, generator=g) < p_done
    terminated = done & (torch.rand(B, T, generator=g) < 0.5)
    values = torch.randn(B, T, generator=g)
    next_values = torch.randn(B, T, generator=g)
    return rewards, done, terminated, values, next_values


def assert_close(x: torch.Tensor, ref, atol=1e-5):
    torch.testing.assert_close(x, torch.tensor(ref, dtype=x.dtype), atol=atol, rtol=1e-5)


# --------------------------------------------------------------------------- discounted returns
def test_discounted_returns_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    done = torch.tensor([[False, False, True, False]])
    # Episode ends at t=2: G2 = 3, G1 = 2 + 0.9 * 3, G0 = 1 + 0.9 * 4.7; t=3 starts a new episode.
    assert_close(discounted_returns(r, done, 0.9), [[5.23, 4.7, 3.0, 4.0]])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("with_bootstrap", [False, True])
def test_discounted_returns_match_a_plain_loop(seed, with_bootstrap):
    rewards, done, _, _, next_values = random_episodes(4, 13, seed)
    bootstrap = next_values * done if with_bootstrap else None
    got = discounted_returns(rewards, done, 0.97, bootstrap=bootstrap)
    ref = ref_discounted(rewards.tolist(), done.tolist(), 0.97, None if bootstrap is None else bootstrap.tolist())
    assert_close(got, ref)


def test_reinforce_returns_mask_padding_and_bootstrap_truncation():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1e6]])  # row 1: the last step is padding (stale data)
    next_values = torch.tensor([[0.0, 0.0, 10.0], [0.0, 10.0, 1e6]])
    terminated = torch.tensor([[False, False, False], [False, True, True]])
    lengths = torch.tensor([3, 2])
    got = reinforce_returns(rewards, next_values, terminated, lengths, 0.5)
    # Row 0 is truncated at t=2 (not terminated): G2 = 1 + 0.5 * 10 = 6; row 1 terminates at t=1.
    assert_close(got, [[3.0, 4.0, 6.0], [1.5, 1.0, 0.0]])
    no_boot = reinforce_returns(rewards, next_values, terminated, lengths, 0.5, bootstrap_truncated=False)
    assert_close(no_boot, [[1.75, 1.5, 1.0], [1.5, 1.0, 0.0]])


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_returns_match_a_plain_loop_per_episode(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    rewards = torch.randn(B, T, generator=g)
    next_values = torch.randn(B, T, generator=g)
    terminated = torch.rand(B, T, generator=g) < 0.5
    got = reinforce_returns(rewards, next_values, terminated, lengths, 0.9)
    for b in range(B):
        n = int(lengths[b])
        boot = [0.0] * n
        if not terminated[b, n - 1]:
            boot[-1] = float(next_values[b, n - 1])
        ref = ref_discounted([rewards[b, :n].tolist()], [[False] * (n - 1) + [True]], 0.9, [boot])[0]
        assert_close(got[b, :n], ref)
        assert (got[b, n:] == 0).all()


# --------------------------------------------------------------------------- GAE
def test_gae_bootstraps_at_truncation_and_not_at_termination():
    r = torch.ones(2, 3)
    values = torch.zeros(2, 3)
    next_values = torch.tensor([[1.0, 7.0, 1.0], [1.0, 7.0, 1.0]])  # 7 = V(terminal observation) at t=1
    done = torch.tensor([[False, True, False], [False, True, False]])
    terminated = torch.tensor([[False, False, False], [False, True, False]])  # row 0 truncated, row 1 terminated
    adv = gae_advantages(r, values, next_values, terminated, done, gamma=0.5, lam=1.0)
    # t=2: 1 + 0.5 * 1 = 1.5 (row end, bootstrap); t=1: truncated 1 + 0.5 * 7 = 4.5, terminated 1;
    # t=0: delta 1.5 plus 0.5 * A1 (the recursion does not cross t=1 -> t=2).
    assert_close(adv, [[1.5 + 0.5 * 4.5, 4.5, 1.5], [1.5 + 0.5 * 1.0, 1.0, 1.5]])
    assert float(adv[0, 1] - adv[1, 1]) == pytest.approx(0.5 * 7.0)


def test_gae_recursion_is_cut_at_episode_end():
    rewards, _, _, values, next_values = random_episodes(1, 6, 0)
    done = torch.tensor([[False, False, True, False, False, False]])
    terminated = torch.zeros_like(done)
    a = gae_advantages(rewards, values, next_values, terminated, done, 0.99, 0.95)
    rewards2, values2, next2 = rewards.clone(), values.clone(), next_values.clone()
    rewards2[:, 3:] += 100.0
    values2[:, 3:] -= 50.0
    next2[:, 3:] += 9.0
    b = gae_advantages(rewards2, values2, next2, terminated, done, 0.99, 0.95)
    torch.testing.assert_close(a[:, :3], b[:, :3])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_a_plain_loop(seed, lam):
    rewards, done, terminated, values, next_values = random_episodes(3, 11, seed)
    got = gae_advantages(rewards, values, next_values, terminated, done, 0.99, lam)
    ref = ref_gae(rewards.tolist(), values.tolist(), next_values.tolist(), terminated.tolist(), done.tolist(),
                  0.99, lam)
    assert_close(got, ref, atol=1e-4)


def test_gae_lambda_one_is_bootstrapped_returns_minus_values():
    rewards, done, terminated, values, next_values = random_episodes(3, 8, 7)
    # As in real trajectories: within an episode, the next observation is the next step's observation.
    next_values[:, :-1] = torch.where(done[:, :-1], next_values[:, :-1], values[:, 1:])
    adv = gae_advantages(rewards, values, next_values, terminated, done, 0.9, 1.0)
    # Bootstrap wherever a row is cut without terminating: truncations and the window's last step.
    cut = done.clone()
    cut[:, -1] = True
    bootstrap = next_values * (cut & ~terminated)
    ret = discounted_returns(rewards, cut, 0.9, bootstrap=bootstrap)
    torch.testing.assert_close(adv, ret - values, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- n-step returns and double DQN
def test_n_step_returns_by_hand():
    r = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0]])
    done = torch.tensor([[False, False, True, False, False]])
    term = torch.tensor([[False, False, True, False, False]])
    R, last, disc = n_step_returns(r, done, term, 0.5, 3)
    # t=0: 1 + 1 + 1 (ends at the termination, no bootstrap); t=1: 2 + 2; t=2: 4.
    assert_close(R, [[3.0, 4.0, 4.0]])
    assert last.tolist() == [[2, 2, 2]]
    assert_close(disc, [[0.0, 0.0, 0.0]])
    R1, last1, disc1 = n_step_returns(r, done, term, 0.5, 1)
    assert_close(R1, r.tolist())
    assert last1.tolist() == [[0, 1, 2, 3, 4]]
    assert_close(disc1, [[0.5, 0.5, 0.0, 0.5, 0.5]])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_n_step_returns_match_a_plain_loop(seed, n):
    rewards, done, terminated, _, _ = random_episodes(3, 9, seed, p_done=0.3)
    R, last, disc = n_step_returns(rewards, done, terminated, 0.9, n)
    ref_R, ref_last, ref_disc = ref_n_step(rewards.tolist(), done.tolist(), terminated.tolist(), 0.9, n)
    assert_close(R, ref_R)
    assert last.tolist() == ref_last
    assert_close(disc, ref_disc)


def test_n_step_returns_reject_a_window_shorter_than_n():
    with pytest.raises(ValueError, match="n must be in"):
        flags = torch.zeros(1, 2, dtype=torch.bool)
        n_step_returns(torch.zeros(1, 2), flags, flags, 0.9, 3)


def test_double_dqn_target_uses_the_online_argmax_and_the_target_value():
    returns = torch.tensor([1.0, 1.0, 2.0])
    discounts = torch.tensor([0.9, 0.0, 0.81])
    online = torch.tensor([[0.0, 5.0], [3.0, 0.0], [1.0, 2.0]])
    target = torch.tensor([[10.0, 2.0], [4.0, 8.0], [7.0, -1.0]])
    got = double_dqn_targets(returns, discounts, online, target)
    # Row 0: the online net picks action 1 (value 2 under the target net), not the target's own max (10).
    ref = [returns[i] + discounts[i] * target[i, int(online[i].argmax())] for i in range(3)]
    assert_close(got, [float(x) for x in ref])
    assert float(got[0]) == pytest.approx(1.0 + 0.9 * 2.0)


def test_dqn_loss_huber_and_mse():
    q = torch.tensor([[0.0, 3.0]], requires_grad=True)
    args = (torch.tensor([1]), torch.tensor([0.0]), torch.tensor([0.0]), torch.zeros(1, 2), torch.zeros(1, 2))
    mse, _ = dqn_loss(q, *args, kind="mse")
    huber, stats = dqn_loss(q, *args, kind="huber")
    assert float(mse.detach()) == pytest.approx(9.0)
    assert float(huber.detach()) == pytest.approx(2.5)  # |x| - 0.5 beyond delta 1
    huber.backward()
    assert q.grad.tolist() == [[0.0, 1.0]]
    assert float(stats["q_mean"]) == 3.0


# --------------------------------------------------------------------------- n-step windows across executes
def _chunked(full: dict[str, torch.Tensor], T: int):
    L = full["_observation/reward"].shape[1]
    for s in range(0, L, T):
        yield TemporalDictTensor({k: v[:, s : s + T] for k, v in full.items()})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_step_window_across_executes_equals_one_long_window(n):
    g = torch.Generator().manual_seed(n)
    B, L, D = 3, 20, 2
    rewards, done, terminated, _, _ = random_episodes(B, L, n, p_done=0.25)
    full = {
        "observation/frame": torch.randn(B, L, D, generator=g),
        "action/action": torch.randint(0, 2, (B, L), generator=g),
        "_observation/reward": rewards,
        "_observation/done": done,
        "_observation/terminated": terminated,
        "_observation/frame": torch.randn(B, L, D, generator=g),
    }
    window = NStepWindow(0.9, n)
    parts = [window(chunk) for chunk in _chunked(full, 5)]
    # Transitions come out row-major per chunk: regroup them by row to compare with the one-window result.
    got = {k: torch.cat([p[k].unflatten(0, (B, -1)) for p in parts], 1).flatten(0, 1) for k in parts[0]}
    ref = window_transitions(full, 0.9, n)
    assert got["ret"].shape[0] == B * (L - n + 1)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k])


def test_window_transitions_take_the_terminal_observation_of_the_last_step():
    frames = torch.arange(6.0).view(1, 3, 2)
    window = {
        "observation/frame": frames,
        "action/action": torch.tensor([[0, 1, 0]]),
        "_observation/reward": torch.ones(1, 3),
        "_observation/done": torch.tensor([[False, True, False]]),
        "_observation/terminated": torch.tensor([[False, False, False]]),
        "_observation/frame": frames + 100,
    }
    tr = window_transitions(window, 0.5, 2)
    # Transition 0 is cut at t=1 by a truncation: it bootstraps (0.25) from _observation/frame at t=1.
    assert tr["next_obs"].tolist() == [[102.0, 103.0], [102.0, 103.0]]
    assert tr["discount"].tolist() == [0.25, 0.5]
    assert tr["ret"].tolist() == [1.5, 1.0]


# --------------------------------------------------------------------------- dueling head
def test_dueling_q_by_hand():
    q = dueling_q(torch.tensor([[1.0], [-2.0]]), torch.tensor([[0.0, 2.0, 4.0], [1.0, 1.0, 1.0]]))
    assert q.tolist() == [[-1.0, 1.0, 3.0], [-2.0, -2.0, -2.0]]


@pytest.mark.parametrize("hidden_sizes", [(8,), (16, 8)])
def test_dueling_network_shapes_and_mean_advantage_identity(hidden_sizes):
    torch.manual_seed(0)
    net = QNetwork(5, 3, hidden_sizes, dueling=True)
    with torch.no_grad():  # a random head, so that V and A are not near 0
        for p in [*net.value.parameters(), *net.advantage.parameters()]:
            p.normal_()
    x = torch.randn(7, 5)
    q = net(x)
    assert q.shape == (7, 3)
    h = net.trunk(x)
    value, advantage = net.value(h), net.advantage(h)
    assert value.shape == (7, 1) and advantage.shape == (7, 3)
    # mean_a Q(s, a) = V(s), and Q keeps the advantages' differences between actions.
    torch.testing.assert_close(q.mean(-1), value.squeeze(-1))
    torch.testing.assert_close(q - q[:, :1], advantage - advantage[:, :1])
    assert value.abs().min() > 0 and (advantage.mean(-1)).abs().max() > 1e-3  # the identity is not trivially true


def test_plain_q_network_keeps_its_parameter_names():
    # Checkpoints written before the dueling option load unchanged.
    assert set(QNetwork(4, 2, (8,)).state_dict()) == {"q.0.weight", "q.0.bias", "q.2.weight", "q.2.bias"}


def test_epsilon_schedule():
    assert epsilon_at(0, 1.0, 0.05, 1000) == 1.0
    assert epsilon_at(500, 1.0, 0.05, 1000) == pytest.approx(0.525)
    assert epsilon_at(10**6, 1.0, 0.05, 1000) == 0.05


# --------------------------------------------------------------------------- episode statistics
@pytest.mark.parametrize("seed", range(4))
def test_episode_statistics_match_a_plain_loop(seed):
    rewards, done, _, _, _ = random_episodes(4, 7, seed, p_done=0.3)
    carry_r = torch.randn(4)
    carry_l = torch.randint(0, 5, (4,))
    s, ln, c, new_r, new_l = episode_statistics(rewards, done, carry_r, carry_l)
    finished, lengths, cr, cl = [], [], [], []
    for b in range(4):
        ret, length = float(carry_r[b]), int(carry_l[b])
        for t in range(7):
            ret += float(rewards[b, t])
            length += 1
            if done[b, t]:
                finished.append(ret)
                lengths.append(length)
                ret, length = 0.0, 0
        cr.append(ret)
        cl.append(length)
    assert int(c) == len(finished)
    assert float(s) == pytest.approx(sum(finished), abs=1e-4)
    assert int(ln) == sum(lengths)
    assert_close(new_r, cr, atol=1e-4)
    assert new_l.tolist() == cl


# --------------------------------------------------------------------------- policy-gradient losses
def _policy_batch():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)  # p(1) = 0.75, then 0.5
    values = torch.tensor([[0.5, 1.0]], requires_grad=True)
    actions = torch.tensor([[1, 0]])
    return logits, values, actions


def _log_probs(logits, actions):
    dist = Categorical(logits)
    return dist.log_prob(actions), dist.entropy()


def test_a2c_loss_by_hand():
    logits, values, actions = _policy_batch()
    adv = torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = a2c_loss(*_log_probs(logits, actions), values, adv, mask, value_coef=0.5, entropy_coef=0.1,
                           normalize_advantages=False)
    logp = [math.log(0.75), math.log(0.5)]
    policy = -(logp[0] * 2.0 + logp[1] * -1.0) / 2
    # Targets are advantages + values: the value error is exactly the advantage.
    value = 0.5 * (2.0**2 + 1.0**2) / 2
    h = [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2.0)]
    entropy = sum(h) / 2
    assert float(stats["loss/policy"]) == pytest.approx(policy, rel=1e-5)
    assert float(stats["loss/value"]) == pytest.approx(value, rel=1e-5)
    assert float(stats["loss/entropy"]) == pytest.approx(entropy, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(policy + 0.5 * value - 0.1 * entropy, rel=1e-5)
    loss.backward()
    # A positive advantage raises the logit of the action taken.
    assert logits.grad[0, 0, 1] < 0


def test_a2c_loss_ignores_padding_steps():
    logits, values, actions = _policy_batch()
    adv = torch.tensor([[2.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    a, _ = a2c_loss(*_log_probs(logits, actions), values, adv, mask, value_coef=0.5, entropy_coef=0.1,
                    normalize_advantages=True)
    logits2 = logits.detach().clone()
    logits2[0, 1] = torch.tensor([50.0, -50.0])
    b, _ = a2c_loss(*_log_probs(logits2, actions), values, torch.tensor([[2.0, 1e6]]), mask, value_coef=0.5,
                    entropy_coef=0.1, normalize_advantages=True)
    assert float(a.detach()) == pytest.approx(float(b.detach()))


def test_reinforce_loss_by_hand():
    logits, values, actions = _policy_batch()
    returns = torch.tensor([[3.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, stats = reinforce_loss(*_log_probs(logits, actions), values, returns, mask, baseline_coef=1.0,
                                 entropy_coef=0.0, normalize_advantages=False)
    adv = [3.0 - 0.5, 1.0 - 1.0]
    policy = -(math.log(0.75) * adv[0] + math.log(0.5) * adv[1]) / 2
    baseline = 0.5 * (2.5**2 + 0.0) / 2
    assert float(stats["loss/policy"]) == pytest.approx(policy, rel=1e-5)
    assert float(stats["loss/baseline"]) == pytest.approx(baseline, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(policy + baseline, rel=1e-5)
    loss.backward()
    # The baseline is pulled towards the return; the policy gradient does not flow into it.
    assert values.grad[0, 0] < 0 and values.grad[0, 1] == 0


def test_policy_agent_samples_from_its_seed_and_is_greedy_where_asked():
    obs = DictTensor({"frame": torch.randn(256, 4, generator=torch.Generator().manual_seed(0))})
    spec = EnvSpec((4,), "float32", 2, 500)
    a, b = create_policy_agent(spec, (8,)), create_policy_agent(spec, (8,))
    b.update(a.model.state_dict())
    a.seed(7), b.seed(7)
    explore = DictTensor({"stochastic": torch.ones(256, dtype=torch.bool)})
    first = a(None, obs, explore)[0]["action"]
    assert torch.equal(first, b(None, obs, explore)[0]["action"])
    assert not torch.equal(first, a(None, obs, explore)[0]["action"])  # the generator moves on
    greedy = DictTensor({"stochastic": torch.zeros(256, dtype=torch.bool)})
    assert torch.equal(a(None, obs, greedy)[0]["action"], a.model.policy(obs["frame"]).logits.argmax(-1))


# --------------------------------------------------------------------------- losses read their batch by name
def _ppo_update(model):
    from rlstruct.algos import ppo
    from rlstruct.algos._train.update import UpdateStep, clip_groups

    loss_fn = functools.partial(ppo.ppo_minibatch_loss, model, ppo.PPOConfig())
    return UpdateStep(loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), clip_groups(model), max_grad_norm=0.5,
                      device="cpu")


def _ppo_batch(M=6):
    g = torch.Generator().manual_seed(0)
    return {"frame": torch.randn(M, 4, generator=g), "action": torch.randint(0, 2, (M,), generator=g),
            "old_log_prob": torch.full((M,), -0.7), "advantage": torch.randn(M, generator=g),
            "old_value": torch.zeros(M), "returns": torch.randn(M, generator=g), "mask": torch.ones(M)}


def test_each_loss_declares_the_keys_of_the_batch_it_reads():
    from rlstruct.algos import a2c, ppo, reinforce
    from rlstruct.algos._train.update import loss_keys

    assert loss_keys(ppo.ppo_minibatch_loss) == ("frame", "action", "old_log_prob", "advantage", "old_value",
                                                 "returns", "mask")
    assert loss_keys(a2c.a2c_batch_loss) == ("frame", "next_frame", "action", "reward", "terminated", "done", "mask")
    assert loss_keys(functools.partial(reinforce.reinforce_batch_loss, None, None)) == ("frame", "action", "returns",
                                                                                       "mask")


def test_a_loss_given_a_batch_without_a_key_it_reads_is_a_batch_key_error_naming_the_key():
    from rlstruct.algos.networks import ActorCritic
    from rlstruct.errors import BatchKeyError

    update = _ppo_update(ActorCritic(4, 2, (8,)))
    assert set(update(_ppo_batch())) >= {"loss/policy", "grad_norm/actor"}
    batch = _ppo_batch()
    del batch["advantage"]
    with pytest.raises(BatchKeyError, match=r"the loss ppo_minibatch_loss reads batch\['advantage'\], which the "
                                            r"batch does not hold \(it holds \['action', .*\]\); give the batch every "
                                            r"key the loss declares with @reads") as e:
        update(batch)
    assert e.value.key == "advantage" and isinstance(e.value, KeyError)


def test_a_loss_that_declares_no_keys_is_refused_when_its_update_is_built():
    from rlstruct.algos._train.update import UpdateStep

    with pytest.raises(TypeError, match=r"loss_fn must declare the keys of the batch it reads, .*; decorate it with "
                                        r"@reads\('key', ...\)"):
        UpdateStep(lambda batch: (batch["x"].sum(), {}), torch.optim.SGD([torch.zeros(1, requires_grad=True)]), [],
                   max_grad_norm=0.0, device="cpu")


def test_minibatch_epochs_passes_over_shuffled_rows_and_stops_when_told():
    from rlstruct.algos._train.update import UpdateStep, minibatch_epochs, reads, shuffled_minibatches

    seen = []

    @reads("row")
    def loss_fn(batch):
        seen.append(batch["row"].tolist())
        return (w * batch["row"]).sum(), {"first": batch["row"][0].float()}

    w = torch.zeros(1, requires_grad=True)
    update = UpdateStep(loss_fn, torch.optim.SGD([w], lr=0.1), [], max_grad_norm=0.0, device="cpu")
    rows = torch.arange(8.0)
    stats, epochs = minibatch_epochs(update, {"row": rows}, n_epochs=3, n_minibatches=2,
                                     shuffle=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    expected = [rows[mb].tolist() for _ in range(3) for mb in shuffled_minibatches(8, 2, g)]
    assert epochs == 3 and seen == expected
    assert stats["first"] == pytest.approx(sum(r[0] for r in expected) / len(expected))
    seen.clear()
    _, epochs = minibatch_epochs(update, {"row": rows}, n_epochs=3, n_minibatches=2,
                                 shuffle=torch.Generator().manual_seed(1), stop=lambda stats: True)
    assert epochs == 1 and len(seen) == 2
