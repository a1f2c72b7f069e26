"""The policy's distributions and agent: against torch.distributions, bounds, seeds and the raw sample."""

from __future__ import annotations

import functools

import pytest
import torch

from rlstruct.algos import EnvSpec, create_env, describe_env
from rlstruct.algos._noise import GeneratorNoise
from rlstruct.algos.distributions import Categorical, DiagGaussian
from rlstruct.algos.losses import masked_policy_value_loss
from rlstruct.algos.networks import ActorCritic, EncoderActorCritic, build_actor_critic
from rlstruct.algos.policies import (
    PolicyAgent,
    actor_critic_outputs,
    create_policy_agent,
    critic_values,
    next_of_collection,
    policy_actions,
)
from rlstruct.batchers import RL_Batcher
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor

PENDULUM = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
BOX2 = EnvSpec((5,), "float32", None, 100, action_shape=(2,), action_low=(-1.0, 0.0), action_high=(1.0, 0.5))


@pytest.mark.parametrize("seed", range(3))
def test_diag_gaussian_matches_torch_normal(seed):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(7, 3, generator=g)
    log_std = torch.randn(3, generator=g) * 0.5
    actions = torch.randn(7, 3, generator=g) * 2
    ours = DiagGaussian(mean, log_std)
    ref = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(ours.entropy(), ref.entropy().sum(-1))
    assert torch.equal(ours.mode(), mean)


def test_diag_gaussian_samples_have_its_mean_and_std_and_follow_the_generator():
    d = DiagGaussian(torch.full((20_000, 2), 3.0), torch.log(torch.tensor([0.5, 2.0])))
    x = d.sample(torch.Generator().manual_seed(0))
    torch.testing.assert_close(x.mean(0), torch.tensor([3.0, 3.0]), atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(0), torch.tensor([0.5, 2.0]), atol=0.03, rtol=0)
    assert torch.equal(x, d.sample(torch.Generator().manual_seed(0)))
    assert not torch.equal(x, d.sample(torch.Generator().manual_seed(1)))


def test_categorical_matches_torch_categorical():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    actions = torch.arange(6) % 4
    ours, ref = Categorical(logits), torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    probs = torch.tensor([[0.2, 0.8]]).expand(20_000, 2)
    draws = Categorical(probs.log()).sample(torch.Generator().manual_seed(0))
    assert abs(draws.float().mean().item() - 0.8) < 0.02


def test_build_actor_critic_follows_the_spec():
    discrete = build_actor_critic(EnvSpec((4,), "float32", 2, 500), (8,))
    assert not discrete.continuous and isinstance(discrete.policy(torch.zeros(3, 4)), Categorical)
    assert "log_std" not in discrete.state_dict()
    cont = build_actor_critic(BOX2, (8,))
    dist = cont.policy(torch.zeros(3, 5))
    assert isinstance(dist, DiagGaussian) and dist.mean.shape == (3, 2) and dist.log_prob(dist.mean).shape == (3,)
    assert {n for n, _ in cont.named_parameters()} - {n for n, _ in cont.actor.named_parameters(prefix="actor")} \
        - {n for n, _ in cont.critic.named_parameters(prefix="critic")} == {"log_std"}
    assert any(p is cont.log_std for p in cont.policy_parameters())
    # Images: the CNN actor-critic for discrete actions; continuous actions from pixels are refused.
    assert isinstance(build_actor_critic(EnvSpec((4, 84, 84), "uint8", 6, 1000), (8,)), EncoderActorCritic)
    pixels_box = EnvSpec((4, 84, 84), "uint8", None, 1000, action_shape=(2,), action_low=(-1.0, -1.0),
                         action_high=(1.0, 1.0))
    with pytest.raises(SpaceError, match=r"takes discrete actions with image observations, got spec.obs_shape="
                                         r"\(4, 84, 84\) with continuous actions"):
        build_actor_critic(pixels_box, (8,))


def _obs(n, dim, seed=0):
    return DictTensor({"frame": torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))})


def test_gaussian_agent_clips_the_action_for_the_env_and_keeps_the_raw_sample():
    agent = create_policy_agent(BOX2, (8,))
    agent.model.log_std.fill_(1.0)  # std e: most samples leave the narrow bounds
    agent.seed(3)
    out, _ = agent(None, _obs(512, 5), DictTensor({}))
    action, raw = out["action"], out["raw"]
    low, high = torch.tensor(BOX2.action_low), torch.tensor(BOX2.action_high)
    assert action.dtype == torch.float32 and action.shape == (512, 2)
    assert ((action >= low) & (action <= high)).all()
    assert ((raw < low) | (raw > high)).float().mean() > 0.5
    torch.testing.assert_close(action, torch.minimum(torch.maximum(raw, low), high))
    # The log-probability is the raw sample's, not the clipped action's.
    dist = agent.model.policy(_obs(512, 5)["frame"])
    torch.testing.assert_close(out["log_prob"], dist.log_prob(raw))
    assert not torch.allclose(out["log_prob"], dist.log_prob(action))


def test_gaussian_agent_is_seeded_and_takes_the_mean_where_not_stochastic():
    a, b = create_policy_agent(PENDULUM, (8,)), create_policy_agent(PENDULUM, (8,))
    b.update(a.model.state_dict())
    a.seed(7), b.seed(7)
    obs = _obs(64, 3)
    explore = DictTensor({"stochastic": torch.ones(64, dtype=torch.bool)})
    first = a(None, obs, explore)[0]["raw"]
    assert torch.equal(first, b(None, obs, explore)[0]["raw"])
    assert not torch.equal(first, a(None, obs, explore)[0]["raw"])
    half = DictTensor({"stochastic": torch.arange(64) % 2 == 0})
    raw = a(None, obs, half)[0]["raw"]
    mean = a.model.policy(obs["frame"]).mean
    assert torch.equal(raw[1::2], mean[1::2]) and not torch.equal(raw[0::2], mean[0::2])


def test_pendulum_trajectories_hold_the_clipped_action_and_the_raw_sample_the_loss_uses():
    with RL_Batcher(5, create_policy_agent, {"spec": PENDULUM, "hidden_sizes": (8,)}, create_env,
                    {"name": "Pendulum-v1", "n_envs": 4, "autoreset": True}, 0, [0], agent_seeds=[1]) as batcher:
        model = ActorCritic(3, None, (8,), action_dim=1, log_std_init=1.0)
        batcher.update(model.state_dict())
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    tt = traj.trajectories
    action, raw = tt["action/action"], tt["action/raw"]
    assert action.shape == raw.shape == (4, 5, 1)
    assert action.abs().max() <= 2.0 and raw.abs().max() > 2.0
    assert torch.equal(policy_actions(tt), raw)
    # The env stepped with the clipped action: the torch Pendulum records it as last_action.
    torch.testing.assert_close(tt["_observation/last_action"], action)
    out = PolicyAgent(model, "cpu").replay_batch(traj)
    torch.testing.assert_close(out["log_prob"], tt["action/log_prob"])
    loss, _ = masked_policy_value_loss(out["log_prob"], out["entropy"], out["value"], torch.zeros(4, 5),
                                       torch.ones(4, 5), tt.mask(), value_coef=0.5, entropy_coef=0.0,
                                       normalize_advantages=False)
    loss.backward()
    assert model.log_std.grad is not None and model.log_std.grad.abs().sum() > 0


def test_loss_of_an_all_zero_mask_is_zero_not_nan():
    z = torch.zeros(2, 3, requires_grad=True)
    loss, stats = masked_policy_value_loss(z, z, z, torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3),
                                           value_coef=0.5, entropy_coef=0.01, normalize_advantages=True)
    assert loss.item() == 0.0 and all(torch.isfinite(v) for v in stats.values())


def test_every_flat_network_takes_float64_observations():
    """gymnasium's MuJoCo tasks observe float64: every network of flat observations computes in its own float32."""
    from rlstruct.algos.dqn import QNetwork
    from rlstruct.algos.sac import SquashedGaussianActor, TwinQNetwork

    obs = torch.randn(5, 3, dtype=torch.float64)
    for model in (ActorCritic(3, 2, (8,)), ActorCritic(3, None, (8,), action_dim=1)):
        ref = model.policy(obs.float())
        assert torch.equal(model.policy(obs).log_prob(ref.mode()), ref.log_prob(ref.mode()))
        assert torch.equal(model.value(obs), model.value(obs.float()))
    for dueling in (False, True):
        q = QNetwork(3, 2, (8, 8), dueling=dueling)
        assert torch.equal(q(obs), q(obs.float()))
    actor = SquashedGaussianActor(3, 1, (8,), (-2.0,), (2.0,))
    assert torch.equal(actor.deterministic(obs), actor.deterministic(obs.float()))
    critic = TwinQNetwork(3, 1, (8,))
    action = torch.zeros(5, 1, dtype=torch.float64)
    assert critic(obs, action).dtype == torch.float32
    assert torch.equal(critic(obs, action), critic(obs.float(), action.float()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["a2c", "ppo", "sac"])
def test_algorithms_train_on_a_gymnasium_mujoco_task(algo, tmp_path):
    """InvertedPendulum-v5 through gymnasium: float64 observations from the batcher to the loss."""
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    import importlib

    module = importlib.import_module(f"rlstruct.algos.{algo}")
    config_cls = {"a2c": "A2CConfig", "ppo": "PPOConfig", "sac": "SACConfig"}[algo]
    config = getattr(module, config_cls)(env="InvertedPendulum-v5", backend="gymnasium", n_envs=2, max_env_steps=300,
                       n_evaluation_envs=2, evaluation_max_steps=20, hidden_sizes=(16,), logdir=str(tmp_path),
                       progress=False, tensorboard=False, time_limit=100.0)
    result = module.train(config)
    assert result.env_steps >= 300 and result.eval_return > 0


@pytest.mark.parametrize("model, shape, dtype", [
    (ActorCritic(4, 2, (8,)), (4,), torch.float32),
    (EncoderActorCritic((10, 10, 4), 3, (16,), obs_dtype="bool"), (10, 10, 4), torch.bool),
])
def test_critic_values_are_the_values_of_the_full_outputs(model, shape, dtype):
    """PPO's advantages take the critic's values alone: the same numbers as the full forward's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    frame, next_frame = (torch.rand(3, 5, *shape, generator=g) > 0.5 for _ in range(2))
    frame, next_frame = frame.to(dtype), next_frame.to(dtype)
    full = actor_critic_outputs(model, frame, next_frame, torch.zeros(3, 5, dtype=torch.int64))
    value, next_value = critic_values(model, frame.flatten(0, 1), next_frame.flatten(0, 1))
    assert torch.equal(value.unflatten(0, (3, 5)), full["value"])
    assert torch.equal(next_value.unflatten(0, (3, 5)), full["next_value"])


def _ppo_case(spec):
    torch.manual_seed(0)
    model = build_actor_critic(spec, (32,))
    return create_policy_agent, {}, model, "action/value", model.value


def _pqn_case(spec):
    from rlstruct.algos.qnetworks import create_q_agent, q_network

    torch.manual_seed(0)
    model = q_network(spec, (32,), layer_norm=True)
    return (functools.partial(create_q_agent, layer_norm=True, record_max_q=True), {"epsilon": torch.full((6,), 1.0)},
            model, "action/max_q", lambda f: model(f).float().amax(-1))


@pytest.mark.parametrize("case", [_ppo_case, _pqn_case], ids=["ppo-value", "pqn-max-q"])
def test_the_next_values_taken_from_the_collection_are_the_networks_at_every_step(case):
    """PPO's and PQN's agents record what the learner needs of each frame as they act (V(s); max_a Q(s, a)), and the
    learner takes the next frame's from the next step, running the network on the episodes' final frames alone. Across
    terminations, truncations (a 7-step time limit) and acquisitions, the next values, and PPO's GAE advantages, are
    those of the network over every next frame."""
    from rlstruct.algos.returns import gae_advantages

    spec = describe_env("MinAtar/Breakout-v1", "torch", 7)
    with torch.random.fork_rng():  # seeded weights and seeded batchers: the same collection in any process
        factory, agent_info, model, key, evaluate = case(spec)
    with RL_Batcher(16, factory, {"spec": spec, "hidden_sizes": (32,)}, create_env,
                    {"name": "MinAtar/Breakout-v1", "n_envs": 6, "autoreset": True, "max_episode_steps": 7}, 0, [0],
                    agent_seeds=[1], agent_info=DictTensor({k: v[:1] for k, v in agent_info.items()})) as batcher:
        batcher.update(model.state_dict())
        batcher.reset(agent_info=DictTensor(agent_info))
        tts = []
        for _ in range(2):  # the second acquisition starts mid-episode
            batcher.execute()
            tts.append(batcher.get()[0].trajectories)
    done, terminated = (torch.cat([tt[k] for tt in tts]) for k in ("_observation/done", "_observation/terminated"))
    assert (done & ~terminated).any() and terminated.any() and (~done).any()
    for tt in tts:
        done, terminated = tt["_observation/done"], tt["_observation/terminated"]
        with torch.no_grad():
            recorded, next_values = tt[key], next_of_collection(tt[key], tt, evaluate)
            expected, expected_next = (evaluate(tt[f].flatten(0, 1)).unflatten(0, (6, 16))
                                       for f in ("observation/frame", "_observation/frame"))
        torch.testing.assert_close(recorded, expected)
        torch.testing.assert_close(next_values, expected_next)
        rewards = tt["_observation/reward"]
        torch.testing.assert_close(gae_advantages(rewards, recorded, next_values, terminated, done, 0.99, 0.95),
                                   gae_advantages(rewards, expected, expected_next, terminated, done, 0.99, 0.95))


def test_distributions_and_values_compute_in_float32_under_autocast():
    """A bfloat16 forward (--autocast) still gives float32 log-probabilities, entropies and values."""
    model = ActorCritic(4, 2, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dist, value = model.policy(torch.randn(6, 4)), model.value(torch.randn(6, 4))
        assert model.actor(torch.randn(6, 4)).dtype == torch.bfloat16
    assert dist.logits.dtype == dist.log_probs.dtype == value.dtype == torch.float32
    assert dist.log_prob(torch.zeros(6, dtype=torch.int64)).dtype == dist.entropy().dtype == torch.float32
    gauss = ActorCritic(3, None, (8,), action_dim=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d = gauss.policy(torch.randn(6, 3))
    assert d.mean.dtype == d.log_prob(torch.zeros(6, 2)).dtype == torch.float32


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("recurrent", [False, True])
def test_batcher_agents_under_autocast_sample_from_a_bfloat16_forward(recurrent):
    """--autocast's training agent (compiled too, feed-forward) in a worker process (the dtype pickles): its forward
    in bfloat16, what it returns in float32 (the recurrent memory too: the buffer's layout is float32), the
    log-probabilities those of the float32 forward within bfloat16 rounding."""
    from rlstruct.algos.policies import create_recurrent_agent

    env = "CartPoleNoVel-v1" if recurrent else "CartPole-v1"
    spec = describe_env(env, "torch", None)
    agent_args = {"spec": spec, "hidden_sizes": (16,), "autocast": torch.bfloat16}
    if not recurrent:
        agent_args["compile"] = True  # --compile-policy: compiled in the worker, at its first step
    create = create_recurrent_agent if recurrent else create_policy_agent
    agent = create(**agent_args)
    env_args = {"name": env, "n_envs": 4, "autoreset": True}
    with RL_Batcher(8, create, agent_args, create_env, env_args, 1, [0], agent_seeds=[1]) as b:
        b.update({k: v.clone() for k, v in agent.model.state_dict().items()})
        b.reset()
        b.execute()
        traj, _ = b.get()
    tt = traj.trajectories
    assert tt["action/log_prob"].dtype == torch.float32
    if recurrent:
        assert traj.info["agent_state/h"].dtype == torch.float32
        return
    seen = []
    agent.model.actor[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    agent(None, DictTensor({"frame": tt["observation/frame"][:, 0]}), DictTensor({}))
    assert seen == [torch.bfloat16]
    full = agent.model.policy(tt["observation/frame"].flatten(0, 1)).log_prob(tt["action/action"].flatten(0, 1))
    torch.testing.assert_close(tt["action/log_prob"].flatten(0, 1), full, rtol=2e-2, atol=2e-2)


@pytest.mark.compiles
@pytest.mark.timeout(300)
@pytest.mark.parametrize("continuous", [False, True])
def test_compiled_policy_step_is_one_graph_with_the_eager_steps_actions(continuous):
    """compile_policy: the step after the noise is one graph (no generator inside to split it), and it takes the
    eager step's actions; the log-probabilities within float rounding."""
    import torch._dynamo

    spec = PENDULUM if continuous else describe_env("CartPole-v1", "torch", None)
    eager = create_policy_agent(spec, (16, 16))
    compiled = create_policy_agent(spec, (16, 16), compile=True)
    compiled.model.load_state_dict(eager.model.state_dict())
    g = torch.Generator().manual_seed(0)
    frame = torch.randn(64, spec.obs_shape[0], generator=g)
    stochastic = torch.arange(64) % 3 != 0  # greedy rows too
    draws = GeneratorNoise(g)
    shape = (64, eager.model.policy_dim)
    noise = draws.normal(shape) if continuous else draws.uniform(shape)  # what __call__ hands the step
    assert torch._dynamo.explain(eager.step)(frame, noise, stochastic).graph_break_count == 0
    a, b = eager.step(frame, noise, stochastic), compiled._step(frame, noise, stochastic)
    assert a.keys() == b.keys()
    torch.testing.assert_close(b["action"], a["action"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b["log_prob"], a["log_prob"], rtol=1e-5, atol=1e-5)
    # Through __call__: the same generator state gives the same draws.
    eager.seed(3)
    compiled.seed(3)
    obs, info = DictTensor({"frame": frame}), DictTensor({"stochastic": stochastic})
    torch.testing.assert_close(compiled(None, obs, info)[0]["action"], eager(None, obs, info)[0]["action"],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", [EncoderActorCritic((10, 10, 4), 3, (64,), obs_dtype="bool"),
                                   ActorCritic(4, 2, (8,)), ActorCritic(3, None, (8,), action_dim=2)],
                         ids=["cnn", "mlp", "gaussian"])
def test_the_ppo_loss_through_one_encoder_pass_is_the_loss_and_gradients_of_two(model):
    """PPO's minibatch loss takes the policy and the value from one pass of a shared encoder (policy_value): the
    loss and every gradient are those of the two calls through it, within float32 rounding (the two heads' gradients
    are summed at the features instead of at the encoder's weights)."""
    from rlstruct.algos import ppo

    torch.manual_seed(0)
    n = 64
    if isinstance(model, EncoderActorCritic):
        frame, action = torch.rand(n, 10, 10, 4) < 0.3, torch.randint(0, 3, (n,))
    else:
        frame = torch.randn(n, model.actor[0].in_features)
        action = torch.randint(0, 2, (n,)) if not model.continuous else torch.randn(n, 2)
    with torch.no_grad():
        old_log_prob = model.policy(frame).log_prob(action) + 0.1 * torch.randn(n)
    batch = {"frame": frame, "action": action, "old_log_prob": old_log_prob, "advantage": torch.randn(n),
             "old_value": torch.randn(n), "returns": torch.randn(n), "mask": torch.ones(n)}
    config = ppo.PPOConfig(entropy_coef=0.01, value_clip=0.2)

    def loss_and_grads(loss_fn):
        model.zero_grad()
        loss, _ = loss_fn(model, config, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    one, one_grads = loss_and_grads(ppo.ppo_minibatch_loss)

    def two_calls(model, config, b):
        dist = model.policy(b["frame"])
        return ppo.ppo_loss(dist.log_prob(b["action"]), b["old_log_prob"], b["advantage"], model.value(b["frame"]),
                            b["old_value"], b["returns"], dist.entropy(), b["mask"], **ppo._loss_settings(config))

    two, two_grads = loss_and_grads(two_calls)
    torch.testing.assert_close(one, two, rtol=0, atol=0)
    for a, b in zip(one_grads, two_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
