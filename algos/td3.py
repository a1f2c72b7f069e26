"""TD3, Twin Delayed DDPG (Fujimoto et al. 2018): a deterministic actor, twin critics, delayed and smoothed targets.

"Addressing Function Approximation Error in Actor-Critic Methods": a deterministic actor squashed by ``tanh`` into the
action bounds explores with Gaussian noise; twin Q critics regress on the smaller of their two targets (clipped
double Q) at the target actor's action plus clipped noise (target policy smoothing); the actor and the
Polyak-averaged targets are updated once every ``policy_delay`` critic updates. Continuous actions only.

The first ``learning_starts`` env steps of a fresh run act uniformly at random; targets bootstrap through time limits
from the stored terminal observation and not through terminations. The file reads top to bottom: the config, the
actor and its agent (the twin critics are :mod:`~rlstruct.algos.qnetworks`'), the losses, the learner
(:class:`TD3Learner`) and ``ALGORITHM``; docs/algorithms/td3.md tells the rest. Run it with
``rlstruct train td3 --env Pendulum-v1`` or ``python -m rlstruct.algos.td3``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos.harness import (
    EnvSpec,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    Resume,
    default,
    main,
    setting,
    trainer,
)
from rlstruct.algos.network_factories import TD3_CONTRACT, check_network, network_model
from rlstruct.algos.networks import mlp
from rlstruct.algos.policies import NetworkAgent, row_invariant
from rlstruct.algos.twin_critic import TwinCriticLearner
from rlstruct.structures import DictTensor

__all__ = ["TD3Config", "DeterministicActor", "TD3Agent", "create_td3_agent", "smoothed_target_actions", "td3_targets",
           "td3_critic_loss", "td3_actor_loss", "TD3Learner", "ALGORITHM", "train"]


@dataclasses.dataclass
class TD3Config(OffPolicyConfig):
    """TD3's settings (each one's help is beside it; the family's are :class:`OffPolicyConfig`'s). The noises are in
    units of the action range's half-width, ``(high - low) / 2``, as the paper's on actions in ``[-1, 1]``."""

    env: str = setting("Pendulum-v1", "gymnasium id of the environment (TD3: Pendulum-v1, continuous actions)")
    max_env_steps: int | None = default(20_000)
    rollout_steps: int = default(8)
    buffer_size: int = default(1_000_000)
    batch_size: int = default(256)
    lr: float = default(3e-4)
    learning_starts: int = setting(1_000, "env steps of uniformly random actions before the first gradient step")
    gradient_steps_per_env_step: float = setting(1.0, "critic updates per new env step (fractions accumulate)",
                                                 least=0)
    tau: float = setting(0.005, "Polyak rate of the target actor and critics, at each delayed update",
                         within="(0, 1]")
    policy_delay: int = setting(2, "critic updates per update of the actor and the targets", least=1)
    exploration_noise: float = setting(0.1, "std of the Gaussian noise on the actor's actions in training", least=0)
    target_noise: float = setting(0.2, "std of the target policy smoothing noise", least=0)
    target_noise_clip: float = setting(0.5, "the smoothing noise is clipped to +/- this", least=0)


#: what ``rlstruct sweep td3`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 3e-3, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "tau": {"low": 0.001, "high": 0.02, "log": True}, "batch_size": {"choices": [64, 128, 256, 512]},
                "policy_delay": {"choices": [1, 2, 3, 4]}, "target_noise": {"low": 0.05, "high": 0.5}}


def check_env(config: TD3Config, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` unless the env has continuous actions and flat observations."""
    spec.require("TD3", config.env, discrete=False, pixels=False)
    if config.network is not None:
        check_network(config.network, spec, TD3_CONTRACT, algo="TD3")


class DeterministicActor(nn.Module):
    """The deterministic policy ``mu(s) = tanh(f(s)) * scale + bias``: a ReLU MLP ``f`` (torch's default
    initialisation) squashed by ``tanh`` and rescaled to the action bounds, ``scale = (high - low) / 2`` and
    ``bias = (high + low) / 2``.

    Args:
        obs_dim: observation size.
        action_dim: action size.
        hidden_sizes: hidden widths.
        low: lower action bounds, ``action_dim`` of them.
        high: upper action bounds.

    >>> actor = DeterministicActor(3, 1, (8,), (-2.0,), (2.0,))
    >>> action = actor(torch.zeros(5, 3))
    >>> action.shape, bool(action.abs().max() <= 2)
    (torch.Size([5, 1]), True)
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int], low: Sequence[float],
                 high: Sequence[float]):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, action_dim, activation="relu", ortho_init=False)
        low_t, high_t = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("bias", (high_t + low_t) / 2)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Actions ``[N, action_dim]`` within the bounds, of observations ``[N, obs_dim]`` of any dtype (MuJoCo's are
        float64)."""
        return torch.tanh(self.net(frame.float())) * self.scale + self.bias

    def clip(self, action: torch.Tensor) -> torch.Tensor:
        """``action`` ``[N, action_dim]`` clipped to the bounds ``[bias - scale, bias + scale]``."""
        return action.clamp(self.bias - self.scale, self.bias + self.scale)


class TD3Agent(NetworkAgent):
    """The batchers' agent of a :class:`DeterministicActor`: ``mu(s)`` plus Gaussian noise of std
    ``agent_info["noise"] * scale`` (float, one per env; none without the key), clipped to the bounds, or uniform
    actions where ``agent_info["random"]`` (a fresh run's first ``learning_starts`` env steps).

    Args:
        model: the actor, on ``device``.
        device: where observations come from and actions go.

    >>> agent = TD3Agent(DeterministicActor(3, 1, (8,), (-2.0,), (2.0,)), "cpu")
    >>> info = DictTensor({"noise": torch.tensor([0.1, 0.0]), "random": torch.tensor([False, True])})
    >>> out, _ = agent(None, DictTensor({"frame": torch.zeros(2, 3)}), info)
    >>> out["action"].shape, bool(out["action"].abs().max() <= 2)
    (torch.Size([2, 1]), True)
    """

    model: DeterministicActor

    def __call__(self, state, observation, agent_info, history=None):
        """``action float [N, action_dim]`` within the action bounds."""
        action = row_invariant(self.model, observation["frame"].shape[0], observation["frame"])
        if "noise" in agent_info:
            std = self._on_device(agent_info["noise"], "noise").unsqueeze(-1) * self.model.scale
            action = self.model.clip(action + std * self.noise.normal(action.shape))
        if "random" in agent_info:
            u = self.noise.uniform(action.shape, stream=1) * 2 - 1
            random = self._on_device(agent_info["random"], "random").unsqueeze(-1)
            action = torch.where(random, u * self.model.scale + self.model.bias, action)
        self.noise.advance()
        return DictTensor({"action": action}), state

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """``(action,)``: ``mu(s)`` (see :meth:`~rlstruct.algos.policies.NetworkAgent.deterministic`)."""
        return (self.model(frame),)


def create_td3_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    network: str | None = None,
) -> RL_Agent:
    """Builds a batcher's :class:`TD3Agent` for ``spec``'s env on ``device`` (module level, so it pickles); ``network``
    (``"MODULE:CALLABLE"``) builds the actor with that factory (of ``(actor, critic)``) instead."""
    if network is not None:
        model = network_model(network, spec)[0].to(device)
    else:
        model = DeterministicActor(spec.obs_dim, spec.action_dim, hidden_sizes, spec.action_low,
                                   spec.action_high).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = TD3Agent(model, device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def smoothed_target_actions(
    target_action: torch.Tensor, noise: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, *,
    target_noise: float, noise_clip: float,
) -> torch.Tensor:
    """Target policy smoothing, the paper's regularisation of the targets: ``a' = clip(mu'(s') + clip(target_noise *
    eps, -c, c) * scale, low, high)``, ``eps`` standard normal, ``c = noise_clip``, the bounds ``bias -/+ scale``.

    Args:
        target_action: ``float [N, D]``, the target actor's ``mu'(s')``.
        noise: ``float [N, D]``, standard normal.
        scale: ``float [D]``, half the action range.
        bias: ``float [D]``, the action range's middle.
        target_noise: the noise's std, in units of ``scale``.
        noise_clip: its bound, in units of ``scale``.

    Returns:
        ``float [N, D]``.

    >>> smoothed_target_actions(torch.tensor([[0.0], [1.5]]), torch.tensor([[1.0], [10.0]]), torch.tensor([2.0]),
    ...                         torch.tensor([0.0]), target_noise=0.2, noise_clip=0.5)
    tensor([[0.4000],
            [2.0000]])
    """
    smoothing = (target_noise * noise).clamp(-noise_clip, noise_clip) * scale
    return (target_action + smoothing).clamp(bias - scale, bias + scale)


def td3_targets(returns: torch.Tensor, discounts: torch.Tensor, next_q_target: torch.Tensor) -> torch.Tensor:
    """The clipped double-Q targets ``y = r + discount * min_k Q_target_k(s', a')``, ``a'`` the smoothed target action
    (:func:`smoothed_target_actions`).

    Args:
        returns: ``float [N]`` rewards.
        discounts: ``float [N]``, ``gamma``, or 0 where the episode terminated.
        next_q_target: ``float [K, N]``, the target critics at ``(s', a')``.

    Returns:
        ``float [N]``.

    >>> td3_targets(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.0]), torch.tensor([[4.0, 4.0], [2.0, 2.0]]))
    tensor([2., 1.])
    """
    return returns + discounts * next_q_target.min(0).values


def td3_critic_loss(q: torch.Tensor, targets: torch.Tensor, *, weights: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critics' regression on the targets: ``sum_k mean((Q_k(s, a) - y)^2)``, one mean squared error per critic;
    with ``weights`` (prioritized replay's importance-sampling weights) the means are weighted.

    Args:
        q: ``float [K, N]``, every critic's ``Q(s, a)`` with gradient.
        targets: ``float [N]``, from :func:`td3_targets` (no gradient).
        weights: ``float [N]`` or ``None`` (plain means).

    Returns:
        ``(loss, stats)``; with ``weights``, ``stats["td_error"]`` is the critics' mean ``|Q_k(s, a) - y|``,
        ``float [N]`` (the new priorities), to be taken out before the statistics are recorded.

    >>> loss, _ = td3_critic_loss(torch.tensor([[1.0], [4.0]]), torch.tensor([2.0]))
    >>> float(loss)
    5.0
    """
    delta = q - targets.detach()
    squared = delta**2 if weights is None else weights * delta**2
    loss = squared.mean(-1).sum()
    stats = {"loss/critic": loss.detach(), "q_mean": q.detach().mean()}
    if weights is not None:
        stats["td_error"] = delta.detach().abs().mean(0)
    return loss, stats


def td3_actor_loss(q_pi: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The deterministic policy gradient's loss ``-mean(Q_1(s, mu(s)))``: the first critic's, as in the paper.

    Args:
        q_pi: ``float [K, N]``, the critics at the actor's actions (gradient through the actions only).

    Returns:
        ``(loss, stats)``.

    >>> loss, _ = td3_actor_loss(torch.tensor([[1.0, 3.0], [-5.0, -5.0]]))
    >>> float(loss)
    -2.0
    """
    loss = -q_pi[0].mean()
    return loss, {"loss/actor": loss.detach()}


class TD3Learner(TwinCriticLearner):
    """TD3's learner for the off-policy loop (:class:`~rlstruct.algos.harness.OffPolicyLearner`): the twin-critic
    learner (:class:`~rlstruct.algos.twin_critic.TwinCriticLearner`: the actor, the twin critics, the Polyak-averaged
    targets of both, their two Adams) with a :class:`DeterministicActor`, the critics on the smoothed clipped double-Q
    targets, and every ``policy_delay`` critic updates, starting with the first, the actor, then the targets.

    The actor acts uniformly at random for a fresh run's first ``learning_starts`` env steps; a resumed run restores
    the networks, their targets, the optimizers and the count of critic updates (the delay's phase), and lets the
    restored actor act while its buffer refills. The critic updates are ``gradient_steps_per_env_step`` per new env
    step, fractions carried over.

    Args:
        config: the run's settings.
        spec: the env's description.
        resume: the checkpoint the run continues (``None``: a fresh run).
        device: the learner's device.
        seed: seeds the generator of the target policy smoothing noise (this session's learner seed).
        n_rows: the training batcher's envs.
    """

    config: TD3Config
    policy: DeterministicActor
    target_policy: DeterministicActor

    def __init__(self, config: TD3Config, spec: EnvSpec, resume: Resume | None, *, device: torch.device, seed: int,
                 n_rows: int):
        super().__init__(config, spec, resume, device=device, seed=seed, actor=DeterministicActor,
                         critic_loss=td3_critic_loss, critic_lr=config.lr, policy_delay=config.policy_delay,
                         target_actor=True, infos={r: DictTensor({
                             "noise": torch.full((n_rows,), config.exploration_noise),
                             "random": torch.full((n_rows,), r, dtype=torch.bool)}) for r in (True, False)})

    @staticmethod
    def exploration(config: TD3Config) -> dict[str, bool | float]:
        """The training ``agent_info``'s example: the actor's actions with noise, uniform ones while a fresh run
        starts."""
        return {"noise": config.exploration_noise, "random": True}

    def critic_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """:func:`td3_targets` at the target actor's smoothed actions (:func:`smoothed_target_actions`) at
        ``next_obs``."""
        config, target_policy, next_obs = self.config, self.target_policy, batch["next_obs"]
        eps = torch.randn(config.batch_size, self.action_dim, generator=self.noise, device=self.device)
        next_action = smoothed_target_actions(target_policy(next_obs), eps, target_policy.scale, target_policy.bias,
                                              target_noise=config.target_noise, noise_clip=config.target_noise_clip)
        return td3_targets(batch["ret"], batch["discount"], self.target_critic(next_obs, next_action))

    def update_actor(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of the actor on :func:`td3_actor_loss`."""
        actor_loss, actor_stats = td3_actor_loss(self.critics_at(obs, self.policy(obs)))
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        return actor_stats


def evaluation_agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The agent factory that evaluates a saved TD3 run."""
    return create_td3_agent


def evaluation_info(config: Mapping[str, Any], sample: bool) -> dict[str, bool | float]:
    """The evaluation ``agent_info`` of a TD3 run: ``mu(s)``, or with the training noise when ``sample`` (never the
    uniform warm-up draws).

    >>> evaluation_info({"exploration_noise": 0.1}, True), evaluation_info({"exploration_noise": 0.1}, False)
    ({'noise': 0.1, 'random': False}, {'noise': 0.0, 'random': False})
    """
    return {"noise": float(config["exploration_noise"]) if sample else 0.0, "random": False}


ALGORITHM = OffPolicyAlgorithm(name="td3", title="TD3", config_cls=TD3Config, description=__doc__.splitlines()[0],
                               check_env=check_env, make_learner=TD3Learner, agent=evaluation_agent,
                               evaluation_info=evaluation_info, search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("td3"))
