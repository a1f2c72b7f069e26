"""A population of seeds: member k of the stacked module computes solo seed k's outputs, losses, gradients and Adam
steps, keeps to itself (clipping, masking, a nan), round-trips its state_dict, and its envs are solo seed k's.

What is bitwise and what is float32 rounding: a batched layer (``baddbmm``, a grouped convolution) and vmap's batching
of ``linear``/``conv2d`` sum a member's products in another order than the solo layer's kernel, so outputs, losses
and gradients agree to float32 rounding (and Adam steps, which divide by the gradients' running scale, to a few
units of rounding per step). What is elementwise (Adam's update, the clipping coefficient's product, the masking
by index) is bitwise: given member k's gradient, the stacked step writes the solo step's bits.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils import clip_grad_norm_

from rlstruct import DictTensor, RL_Batcher
from rlstruct.algos import EnvSpec, create_env
from rlstruct.algos._train.seeds import AGENT_SEEDS, ENV_SEEDS, role_seed
from rlstruct.algos.harness import seeded_model
from rlstruct.algos.networks import build_actor_critic, make_adam, recurrent_actor_critic
from rlstruct.algos.population import (
    MemberEnvs,
    Population,
    PopulationAdam,
    create_member_envs,
    member_env_seeds,
)
from rlstruct.algos.ppo import PPOConfig, ppo_minibatch_loss
from rlstruct.algos.qnetworks import TwinQNetwork, q_network
from rlstruct.errors import BatchSizeError, ConfigError, SeedError
from tests.fakes import ConstantAgent

N = 3
CARTPOLE = EnvSpec((4,), "float32", 2, 500)
PENDULUM = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
MINATAR = EnvSpec((10, 10, 4), "bool", 3, 1000)
IMPLEMENTATIONS = ("batched", "vmap")
ROUNDING = {"rtol": 1e-5, "atol": 1e-6}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float, msg: str = "") -> None:
    # torch.testing.assert_close imports torch.distributed.tensor (and sympy) at its first call: seconds per session
    assert actual.shape == expected.shape, (msg, actual.shape, expected.shape)
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), (msg, (actual - expected).abs().max())


def q_members(spec: EnvSpec = CARTPOLE, **kw) -> list[torch.nn.Module]:
    return [seeded_model(s, functools.partial(q_network, **kw), spec, (16, 16)) for s in range(N)]


def frames(spec: EnvSpec, rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if spec.obs_dtype == "bool":
        return torch.rand(N, rows, *spec.obs_shape, generator=g) < 0.3
    return torch.randn(N, rows, *spec.obs_shape, generator=g)


def mse(q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (q - y).pow(2).mean()


def member_losses(pop: Population, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``float [N]``: each member's loss, its forward by the population's implementation, the loss under vmap."""
    return torch.vmap(mse)(pop(x), y)


def solo_step(model, optimizer, x, y, max_norm=None):
    loss = mse(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    if max_norm is not None:
        clip_grad_norm_(list(model.parameters()), max_norm)
    optimizer.step()
    return loss.detach()


def population_step(pop, optimizer, x, y, max_norm=None, active=None):
    losses = member_losses(pop, x, y)
    optimizer.zero_grad()
    losses.sum().backward()
    if max_norm is not None:
        pop.clip_grad_norms(max_norm)
    optimizer.step(active)
    return losses.detach()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("network", ["mlp", "dueling", "layer_norm", "minatar"])
def test_member_k_computes_solo_k_outputs_loss_and_gradient(implementation, network):
    spec = MINATAR if network == "minatar" else CARTPOLE
    kw = {"dueling": True} if network == "dueling" else {"layer_norm": True} if network == "layer_norm" else {}
    members = q_members(spec, **kw)
    pop = Population(members, implementation=implementation)
    x, y = frames(spec, 12), torch.randn(N, 12, spec.n_actions)
    losses = member_losses(pop, x, y)
    losses.sum().backward()
    for k, m in enumerate(members):
        assert_close(pop(x)[k], m(x[k]), **ROUNDING)
        loss = mse(m(x[k]), y[k])
        loss.backward()
        assert_close(losses[k], loss.detach(), **ROUNDING)
        for (name, p), stacked in zip(m.named_parameters(), pop.parameters()):
            assert_close(stacked.grad[k], p.grad, **ROUNDING, msg=name)


@pytest.mark.parametrize("spec", [CARTPOLE, PENDULUM], ids=["categorical", "gaussian"])
def test_actor_critics_agree_between_implementations_and_with_solo(spec):
    members = [seeded_model(s, functools.partial(build_actor_critic, normalize_observations=True), spec, (16,))
               for s in range(N)]
    with torch.no_grad():
        for s, m in enumerate(members):  # statistics of its own per member, stacked as buffers
            m.normalizer.update(torch.randn(64, spec.obs_dim) * (s + 1))
    x = frames(spec, 9)
    outs = [Population(members, implementation=i).call("policy_value", x) for i in IMPLEMENTATIONS]
    for dist, value in outs:
        for k, m in enumerate(members):
            solo_dist, solo_value = m.policy_value(x[k])
            assert_close(value[k], solo_value, **ROUNDING)
            assert_close(dist.entropy()[k], solo_dist.entropy(), **ROUNDING)
    assert_close(outs[0][0].entropy(), outs[1][0].entropy(), **ROUNDING)


def test_a_whole_loss_under_map_is_the_solo_loss_and_gradient():
    """``map`` runs PPO's own minibatch loss per member: reductions (the mean over the batch, the advantages'
    normalisation) stay within the member."""
    config = PPOConfig()
    members = [seeded_model(s, build_actor_critic, CARTPOLE, (16,)) for s in range(N)]
    pop = Population(members, implementation="vmap")
    g = torch.Generator().manual_seed(1)
    batch = {"frame": torch.randn(N, 20, 4, generator=g), "action": torch.randint(2, (N, 20), generator=g),
             "old_log_prob": torch.full((N, 20), -0.7), "advantage": torch.randn(N, 20, generator=g) * 3,
             "old_value": torch.randn(N, 20, generator=g), "returns": torch.randn(N, 20, generator=g),
             "mask": torch.ones(N, 20)}
    losses = pop.map(lambda m, b: ppo_minibatch_loss(m, config, b)[0], batch)
    losses.sum().backward()
    for k, m in enumerate(members):
        loss, _ = ppo_minibatch_loss(m, config, {key: v[k] for key, v in batch.items()})
        loss.backward()
        assert_close(losses[k], loss.detach(), **ROUNDING)
        for p, stacked in zip(m.parameters(), pop.parameters()):
            assert_close(stacked.grad[k], p.grad, **ROUNDING)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ten_clipped_adam_steps_of_member_k_are_solo_k_steps(implementation):
    members = q_members()
    pop = Population(members, implementation=implementation)
    optimizer = PopulationAdam(pop, 1e-2)
    solo_optimizers = [make_adam(m, 1e-2, "cpu") for m in members]
    for step in range(10):
        x, y = frames(CARTPOLE, 16, seed=step), torch.randn(N, 16, 2)
        population_step(pop, optimizer, x, y, max_norm=0.5)
        for k, (m, opt) in enumerate(zip(members, solo_optimizers)):
            solo_step(m, opt, x[k], y[k], max_norm=0.5)
    for k, (m, opt) in enumerate(zip(members, solo_optimizers)):
        for key, value in pop.member_state_dict(k).items():
            assert_close(value, m.state_dict()[key], rtol=1e-4, atol=1e-5)
        state = optimizer.member_state_dict(k)
        assert state["param_groups"][0]["lr"] == opt.state_dict()["param_groups"][0]["lr"]
        for i, s in opt.state_dict()["state"].items():
            assert torch.equal(state["state"][i]["step"], s["step"])
            assert_close(state["state"][i]["exp_avg"], s["exp_avg"], rtol=1e-4, atol=1e-6)


def test_given_member_k_gradient_the_stacked_adam_step_is_bitwise_the_solo_step():
    members = q_members()
    pop = Population(members)
    optimizer = PopulationAdam(pop, 1e-2)
    solo_optimizers = [make_adam(m, 1e-2, "cpu") for m in members]
    for step in range(10):
        x, y = frames(CARTPOLE, 16, seed=step), torch.randn(N, 16, 2)
        for k, (m, opt) in enumerate(zip(members, solo_optimizers)):
            solo_step(m, opt, x[k], y[k])
        for stacked, params in zip(pop.parameters(), zip(*(m.parameters() for m in members))):
            stacked.grad = torch.stack([p.grad for p in params])  # the solo gradients, before their step
        optimizer.step()
    for k, m in enumerate(members):
        for key, value in pop.member_state_dict(k).items():
            assert torch.equal(value, m.state_dict()[key]), key


@settings(max_examples=25, deadline=None)
@given(scales=st.lists(st.floats(1e-3, 1e3), min_size=N, max_size=N), max_norm=st.floats(0.1, 10.0))
def test_per_member_clipping_is_each_solo_networks_clip_grad_norm(scales, max_norm):
    members = q_members()
    pop = Population(members)
    g = torch.Generator().manual_seed(0)
    for stacked, params in zip(pop.parameters(), zip(*(m.parameters() for m in members))):
        stacked.grad = torch.stack([torch.randn(p.shape, generator=g) * s for p, s in zip(params, scales)])
        for k, p in enumerate(params):
            p.grad = stacked.grad[k].clone()
    norms = pop.clip_grad_norms(max_norm)
    for k, m in enumerate(members):
        solo_norm = clip_grad_norm_(list(m.parameters()), max_norm)
        assert_close(norms[k], solo_norm, rtol=1e-6, atol=0.0)
        for p, stacked in zip(m.parameters(), pop.parameters()):
            assert_close(stacked.grad[k], p.grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_an_inactive_member_keeps_its_weights_and_adam_state_bitwise(implementation):
    pop = Population(q_members(), implementation=implementation)
    optimizer = PopulationAdam(pop, 1e-2)
    x, y = frames(CARTPOLE, 8), torch.randn(N, 8, 2)
    initial = pop.member_state_dict(2)
    population_step(pop, optimizer, x, y, active=[True, True, False])  # inactive from its first step: no moments
    assert all(torch.equal(v, initial[k]) for k, v in pop.member_state_dict(2).items())
    assert all(not s["exp_avg"][2].any() and not s["exp_avg_sq"][2].any() for s in optimizer.optimizer.state.values())
    weights, adam, others = pop.member_state_dict(1), optimizer.member_state_dict(1), pop.member_state_dict(0)
    for _ in range(3):
        population_step(pop, optimizer, x, y, active=[True, False, False])
    assert all(torch.equal(v, weights[k]) for k, v in pop.member_state_dict(1).items())
    after = optimizer.member_state_dict(1)["state"]
    assert all(torch.equal(after[i][name], s[name]) for i, s in adam["state"].items() for name in s)
    assert optimizer.member_steps == [4, 1, 0]
    assert not torch.equal(pop.member_state_dict(0)["q.0.weight"], others["q.0.weight"])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_nan_in_one_member_never_reaches_another(implementation):
    clean, poisoned = (Population(q_members(), implementation=implementation) for _ in range(2))
    optimizers = [PopulationAdam(p, 1e-2) for p in (clean, poisoned)]
    x, y = frames(CARTPOLE, 8), torch.randn(N, 8, 2)
    bad = x.clone()
    bad[1, 3, 2] = float("nan")
    losses = population_step(clean, optimizers[0], x, y, max_norm=0.5)
    nan_losses = population_step(poisoned, optimizers[1], bad, y, max_norm=0.5)
    assert torch.isnan(nan_losses).tolist() == [False, True, False]
    for k in (0, 2):  # bitwise: a member's arithmetic never reads another's slice
        assert torch.equal(nan_losses[k], losses[k])
        assert all(torch.equal(v, clean.member_state_dict(k)[key]) for key, v in poisoned.member_state_dict(k).items())
    assert torch.isnan(poisoned.member_state_dict(1)["q.0.weight"]).any()
    # masked as diverged from now on: its nan stays its own, and the others go on
    weights = poisoned.member_state_dict(0)
    population_step(poisoned, optimizers[1], x, y, max_norm=0.5, active=~torch.isnan(nan_losses))
    assert torch.isfinite(poisoned.member_state_dict(2)["q.0.weight"]).all()
    assert not torch.equal(poisoned.member_state_dict(0)["q.0.weight"], weights["q.0.weight"])


def test_state_dicts_round_trip_through_solo_modules_and_optimizers():
    members = q_members(MINATAR)
    pop = Population(members)
    assert all(torch.equal(v, members[2].state_dict()[k]) for k, v in pop.member_state_dict(2).items())
    optimizer = PopulationAdam(pop, 1e-3)
    population_step(pop, optimizer, frames(MINATAR, 4), torch.randn(N, 4, 3))
    solo = q_members(MINATAR)[0]
    solo.load_state_dict(pop.member_state_dict(1))  # a member's checkpoint is a solo module's
    solo_adam = make_adam(solo, 1e-3, "cpu")
    solo_adam.load_state_dict(optimizer.member_state_dict(1))
    fresh = Population(q_members(MINATAR))
    fresh_adam = PopulationAdam(fresh, 1e-3)
    fresh.load_member_state_dict(0, solo.state_dict())
    fresh_adam.load_member_state_dict(0, solo_adam.state_dict())
    assert all(torch.equal(v, solo.state_dict()[k]) for k, v in fresh.member_state_dict(0).items())
    state = fresh_adam.member_state_dict(0)["state"]
    assert all(torch.equal(state[i][name], s[name]) for i, s in solo_adam.state_dict()["state"].items() for name in s)
    assert fresh_adam.member_steps == [1, 0, 0]
    with pytest.raises(ConfigError, match=r"active members must have taken one number of steps.*\[0, 1\]"):
        fresh_adam.step()


def test_a_population_refuses_what_it_cannot_hold():
    with pytest.raises(ConfigError, match=r"members must share one architecture.*members\[1\]"):
        Population([q_network(CARTPOLE, (8,)), q_network(CARTPOLE, (16,))])
    with pytest.raises(ConfigError, match=r"implementation must be one of \['batched', 'vmap'\], got 'jit'"):
        Population(q_members(), implementation="jit")
    with pytest.raises(ConfigError, match=r"members must hold at least one module"):
        Population([])
    for model in (TwinQNetwork(3, 1, (8,)), recurrent_actor_critic(CARTPOLE, (8,))):
        with pytest.raises(ConfigError, match=r"implementation='batched'.*pass implementation='vmap'"):
            Population([model, model], implementation="batched")
    twins = Population([TwinQNetwork(3, 1, (8,)) for _ in range(N)])  # no batched layers for it: vmap by default
    assert twins.implementation == "vmap" and Population(q_members()).implementation == "batched"
    assert twins(torch.zeros(N, 5, 3), torch.zeros(N, 5, 1)).shape == (N, 2, 5)
    pop = Population(q_members())
    with pytest.raises(ConfigError, match=r"state must hold the keys of member 0's state_dict, got \['extra'\]"):
        pop.load_member_state_dict(0, {**pop.member_state_dict(0), "extra": torch.zeros(1)})
    with pytest.raises(BatchSizeError, match=r"active must hold one flag per member \(3\), got 2"):
        PopulationAdam(pop, 1e-3).step([True, False])


def batcher_seeds(seeds: list[int]) -> list[tuple[int, int]]:
    """Each run seed's solo training batcher's ``(env seed, agent seed)``, as a training session opens it."""
    return [(role_seed(s, ENV_SEEDS), role_seed(s, AGENT_SEEDS)) for s in seeds]


def test_member_env_seeds_are_the_solo_batchers_and_refuse_bad_seeds():
    env, agent = member_env_seeds(batcher_seeds([3, 0]), 2)
    assert env == [(30000, 0), (30000, 1), (0, 0), (0, 1)] and agent[:2] == [(35000, 0), (35000, 1)]
    with pytest.raises(ConfigError, match=r"batcher_seeds must hold one or more members on distinct env seeds, got "
                                          r"\[\(1, 2\), \(1, 3\)\]"):
        member_env_seeds([(1, 2), (1, 3)], 2)
    with pytest.raises(ConfigError, match=r"batcher_seeds must hold one or more members .*got \[\]"):
        member_env_seeds([], 2)
    with pytest.raises(SeedError, match=r"batcher_seeds\[1\]\[0\] must be an int in \[0, 2\*\*31\), got -1"):
        member_env_seeds([(0, 1), (-1, 2)], 2)
    with pytest.raises(ConfigError, match=r"n_envs must be an int >= 1"):
        member_env_seeds([(0, 1)], 0)


def _frames(n_processes: int, seed, n_envs: int, create=create_env, env_args=None) -> torch.Tensor:
    env_args = {"name": "CartPole-v1", "autoreset": True} if env_args is None else env_args
    # One constant action: the observations are the envs' alone (their initial states and their auto-resets).
    with RL_Batcher(12, ConstantAgent, {}, create, {**env_args, "n_envs": n_envs // max(n_processes, 1)},
                    n_processes, seed) as b:
        b.reset()
        out = []
        for _ in range(2):
            b.execute()
            out.append(b.get()[0].trajectories["observation/frame"])
    return torch.cat(out, 1)


def _population_frames(seeds, n_envs: int, n_processes: int) -> torch.Tensor:
    rows, _ = member_env_seeds(batcher_seeds(seeds), n_envs)
    create = functools.partial(create_member_envs, rows=rows, create_env=create_env,
                               env_args={"name": "CartPole-v1", "autoreset": True})
    return _frames(n_processes, 0, len(seeds) * n_envs, create, env_args={})


@pytest.mark.timeout(120)
def test_slice_k_of_one_batcher_steps_solo_seed_k_envs_in_process():
    seeds, n_envs = [4, 0, 9], 2
    population = _population_frames(seeds, n_envs, 0)
    for k, seed in enumerate(seeds):
        solo = _frames(0, role_seed(seed, ENV_SEEDS), n_envs)  # solo seed k's training batcher's envs
        assert torch.equal(population[k * n_envs:(k + 1) * n_envs], solo)
    assert not torch.equal(population[:n_envs], population[n_envs:2 * n_envs])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_slice_k_of_one_batcher_steps_solo_seed_k_envs_over_two_workers():
    """Two workers of three members: worker 0 holds member 0 and half of member 1 (a merged torch env)."""
    seeds, n_envs = [4, 0, 9], 2
    alone = _population_frames(seeds, n_envs, 0)
    assert torch.equal(_population_frames(seeds, n_envs, 2), alone)
    assert torch.equal(_population_frames(seeds[:2], n_envs, 2), alone[:2 * n_envs])


def test_rows_of_several_members_of_an_env_without_a_settable_state_are_the_members_envs_side_by_side():
    """gymnasium's CartPole has no graph state: a worker of two members' rows steps their envs side by side, each
    row as the solo env of its member steps it."""
    rows, _ = member_env_seeds(batcher_seeds([0, 1]), 2)
    gym_args = {"name": "CartPole-v1", "autoreset": True, "backend": "gymnasium"}
    env = create_member_envs(n_envs=4, seed=0, rows=rows, create_env=create_env, env_args=gym_args)
    solos = [create_env(**gym_args, n_envs=2, seed=seed, env_index=0) for seed, _ in (rows[0], rows[2])]
    try:
        assert isinstance(env, MemberEnvs) and env.n_envs() == 4
        obs, ids = env.reset()
        assert torch.equal(ids, torch.arange(4))
        expected = torch.cat([solo.reset()[0]["frame"] for solo in solos])
        assert torch.equal(obs["frame"], expected)
        for _ in range(30):  # through auto-resets
            action = torch.tensor([0, 1, 1, 0])
            (nxt, _), (running, _) = env.step(DictTensor({"action": action}))
            parts = [solo.step(DictTensor({"action": action[2 * k:2 * k + 2]})) for k, solo in enumerate(solos)]
            assert torch.equal(running["frame"], torch.cat([p[1][0]["frame"] for p in parts]))
            assert torch.equal(nxt["done"], torch.cat([p[0][0]["done"] for p in parts]))
    finally:
        env.close()
        for solo in solos:
            solo.close()
    with pytest.raises(ConfigError, match="auto-reset"):
        create_member_envs(n_envs=4, seed=0, rows=rows, create_env=create_env, env_args={**gym_args,
                                                                                         "autoreset": False})
