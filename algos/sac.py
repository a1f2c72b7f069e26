"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications"): a squashed Gaussian actor,
twin Q critics with Polyak-averaged targets, and an automatically tuned entropy temperature; continuous actions only.

The first ``learning_starts`` env steps of a fresh run act uniformly at random; targets bootstrap through time limits
from the stored terminal observation and not through terminations. The file reads top to bottom: the config, the
actor and its agent (the twin critics are :mod:`~rlstruct.algos.qnetworks`'), the losses, the learner
(:class:`SACLearner`) and ``ALGORITHM``; docs/algorithms/sac.md tells the rest. Run it with
``rlstruct train sac --env Pendulum-v1`` or ``python -m rlstruct.algos.sac``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos.distributions import squashed_gaussian_log_prob
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
from rlstruct.algos.network_factories import SAC_CONTRACT, check_network, network_model
from rlstruct.algos.networks import Adam
from rlstruct.algos.policies import NetworkAgent, row_invariant
from rlstruct.algos.qnetworks import EnsembleLinear, TwinQNetwork
from rlstruct.algos.twin_critic import TwinCriticLearner
from rlstruct.structures import DictTensor

__all__ = ["SACConfig", "SquashedGaussianActor", "EnsembleLinear", "TwinQNetwork", "SACAgent", "create_sac_agent",
           "soft_q_targets", "sac_critic_loss", "sac_actor_loss", "sac_temperature_loss", "SACLearner", "ALGORITHM",
           "train"]


LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclasses.dataclass
class SACConfig(OffPolicyConfig):
    """SAC's settings (each one's help is beside it; the family's are :class:`OffPolicyConfig`'s)."""

    env: str = setting("Pendulum-v1", "gymnasium id of the environment (SAC: Pendulum-v1, continuous actions)")
    max_env_steps: int | None = default(20_000)
    rollout_steps: int = default(8)
    buffer_size: int = default(1_000_000)
    batch_size: int = default(256)
    learning_starts: int = setting(1_000, "env steps of uniformly random actions before the first gradient step")
    gradient_steps_per_env_step: float = setting(1.0, "gradient steps per new env step (fractions accumulate)",
                                                 least=0)
    tau: float = setting(0.005, "Polyak rate of the target critics, every gradient step", within="(0, 1]")
    critic_lr: float = setting(1e-3, "Adam learning rate of the critics (lr: the actor's and the temperature's)")
    init_temperature: float = setting(1.0, "the entropy temperature alpha at the start")
    target_entropy: float | None = setting(None, "the entropy the temperature tunes towards (None: -action_dim)")


#: what ``rlstruct sweep sac`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 3e-3, "log": True},
                "critic_lr": {"low": 1e-4, "high": 3e-3, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "tau": {"low": 0.001, "high": 0.02, "log": True}, "batch_size": {"choices": [64, 128, 256, 512]}}


def check_config(config: SACConfig) -> None:
    """Raises ``ValueError`` for a setting of SAC's own out of range."""
    if not config.init_temperature > 0:
        raise ValueError(f"init_temperature must be > 0, got {config.init_temperature!r}")
    if not config.critic_lr > 0:
        raise ValueError(f"critic_lr must be > 0, got {config.critic_lr!r}")


def check_env(config: SACConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` unless the env has continuous actions and flat observations."""
    spec.require("SAC", config.env, discrete=False, pixels=False)
    if config.network is not None:
        check_network(config.network, spec, SAC_CONTRACT, algo="SAC")


def _relu_mlp(in_size: int, hidden_sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip([in_size, *hidden_sizes[:-1]], hidden_sizes):
        layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class SquashedGaussianActor(nn.Module):
    """A Gaussian policy over ``u`` squashed by ``tanh`` and rescaled to the action bounds ``[low, high]``.

    A ReLU trunk feeds a mean head and a log-std head (clamped to ``[-20, 2]``); the action is
    ``tanh(u) * scale + bias`` with ``scale = (high - low) / 2`` and ``bias = (high + low) / 2``.

    Args:
        obs_dim: observation size.
        action_dim: action size.
        hidden_sizes: hidden widths of the trunk.
        low: lower action bounds, ``action_dim`` of them.
        high: upper action bounds.

    >>> actor = SquashedGaussianActor(3, 1, (8,), (-2.0,), (2.0,))
    >>> a, logp = actor.sample(torch.zeros(5, 3), torch.randn(5, 1))
    >>> a.shape, logp.shape, bool(a.abs().max() <= 2)
    (torch.Size([5, 1]), torch.Size([5]), True)
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int], low: Sequence[float],
                 high: Sequence[float]):
        super().__init__()
        self.trunk = _relu_mlp(obs_dim, hidden_sizes)
        self.mean = nn.Linear(hidden_sizes[-1], action_dim)
        self.log_std = nn.Linear(hidden_sizes[-1], action_dim)
        low_t, high_t = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("bias", (high_t + low_t) / 2)

    def forward(self, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)``, each ``[N, action_dim]``: the Gaussian over ``u`` of observations ``[N, obs_dim]`` (of
        any dtype: MuJoCo's are float64)."""
        h = self.trunk(frame.float())
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def squash(self, pre_tanh: torch.Tensor) -> torch.Tensor:
        """The action ``tanh(u) * scale + bias``, ``[N, action_dim]``."""
        return torch.tanh(pre_tanh) * self.scale + self.bias

    def sample(self, frame: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample ``u = mean + std * noise`` squashed into an action, and its log-probability.

        Args:
            frame: ``float [N, obs_dim]``.
            noise: ``float [N, action_dim]``, standard normal.

        Returns:
            ``(action float [N, action_dim], log_prob float [N])``, differentiable in the actor's weights.
        """
        mean, log_std = self(frame)
        pre_tanh = mean + log_std.exp() * noise
        return self.squash(pre_tanh), squashed_gaussian_log_prob(pre_tanh, mean, log_std, self.scale)

    def deterministic(self, frame: torch.Tensor) -> torch.Tensor:
        """The mean action ``tanh(mean) * scale + bias``, ``[N, action_dim]``."""
        return self.squash(self(frame)[0])


class SACAgent(NetworkAgent):
    """The batchers' agent: samples from a :class:`SquashedGaussianActor` with its :attr:`~NetworkAgent.noise`.

    Per env, ``agent_info["stochastic"]`` (bool) false takes the mean action (the evaluation), and
    ``agent_info["random"]`` (bool) true takes an action uniform in the bounds (the first
    ``learning_starts`` steps). Without the keys the agent samples from the policy.

    Args:
        model: the actor, on ``device``.
        device: where observations come from and actions go.
    """

    model: SquashedGaussianActor

    def _flag(self, agent_info: DictTensor, key: str) -> torch.Tensor | None:
        return self._on_device(agent_info[key], key).unsqueeze(-1) if key in agent_info else None

    def __call__(self, state, observation, agent_info, history=None):
        """``action float [N, action_dim]`` within the action bounds."""
        mean, log_std = row_invariant(self.model, observation["frame"].shape[0], observation["frame"])
        noise = self.noise.normal(mean.shape)
        action = self.model.squash(mean + log_std.exp() * noise)
        stochastic = self._flag(agent_info, "stochastic")
        if stochastic is not None:
            action = torch.where(stochastic, action, self.model.squash(mean))
        random = self._flag(agent_info, "random")
        if random is not None:
            u = self.noise.uniform(mean.shape, stream=1) * 2 - 1
            action = torch.where(random, u * self.model.scale + self.model.bias, action)
        self.noise.advance()
        return DictTensor({"action": action}), state

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """``(action,)``: the mean action (see :meth:`~rlstruct.algos.policies.NetworkAgent.deterministic`)."""
        return (self.model.deterministic(frame),)


def create_sac_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    network: str | None = None,
) -> RL_Agent:
    """Builds a batcher's :class:`SACAgent` for ``spec``'s env on ``device`` (module level, so it pickles); ``network``
    (``"MODULE:CALLABLE"``) builds the actor with that factory (of ``(actor, critic)``) instead."""
    if network is not None:
        model = network_model(network, spec)[0].to(device)
    else:
        model = SquashedGaussianActor(spec.obs_dim, spec.action_dim, hidden_sizes, spec.action_low,
                                      spec.action_high).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = SACAgent(model, device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def soft_q_targets(
    returns: torch.Tensor, discounts: torch.Tensor, next_q_target: torch.Tensor, next_log_prob: torch.Tensor,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """The soft Bellman targets ``y = r + discount * (min_k Q_target_k(s', a') - alpha * log pi(a'|s'))``.

    Args:
        returns: ``float [N]`` rewards.
        discounts: ``float [N]``, ``gamma``, or 0 where the episode terminated.
        next_q_target: ``float [K, N]``, the target critics at ``(s', a')`` with ``a' ~ pi(.|s')``.
        next_log_prob: ``float [N]``, ``log pi(a'|s')``.
        alpha: the entropy temperature.

    Returns:
        ``float [N]``.

    >>> soft_q_targets(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([[4.0], [2.0]]),
    ...                torch.tensor([-1.0]), 2.0)
    tensor([3.])
    """
    return returns + discounts * (next_q_target.min(0).values - alpha * next_log_prob)


def sac_critic_loss(q: torch.Tensor, targets: torch.Tensor, *, weights: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critics' regression on the soft targets: ``sum_k mean((Q_k(s, a) - y)^2) / 2``; with ``weights``
    (prioritized replay's importance-sampling weights) the means are weighted.

    Args:
        q: ``float [K, N]``, every critic's ``Q(s, a)`` with gradient.
        targets: ``float [N]``, from :func:`soft_q_targets` (no gradient).
        weights: ``float [N]`` or ``None`` (plain means).

    Returns:
        ``(loss, stats)``; with ``weights``, ``stats["td_error"]`` is the critics' mean ``|Q_k(s, a) - y|``,
        ``float [N]`` (the new priorities), to be taken out before the statistics are recorded.

    >>> loss, _ = sac_critic_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([2.0]))
    >>> float(loss)
    1.0
    """
    if weights is None:
        loss = 0.5 * ((q - targets.detach()) ** 2).mean(-1).sum()
        return loss, {"loss/critic": loss.detach(), "q_mean": q.detach().mean()}
    delta = q - targets.detach()
    loss = 0.5 * (weights * delta**2).mean(-1).sum()
    return loss, {"loss/critic": loss.detach(), "q_mean": q.detach().mean(), "td_error": delta.detach().abs().mean(0)}


def sac_actor_loss(
    q_pi: torch.Tensor, log_prob: torch.Tensor, alpha: torch.Tensor | float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss ``mean(alpha * log pi(a|s) - min_k Q_k(s, a))``, ``a ~ pi(.|s)`` reparameterised.

    Args:
        q_pi: ``float [K, N]``, the critics at the sampled actions (gradient through the actions only).
        log_prob: ``float [N]``, ``log pi(a|s)`` with gradient.
        alpha: the entropy temperature (no gradient).

    Returns:
        ``(loss, stats)``; ``stats["entropy"]`` is the estimate ``-mean(log pi)``.

    >>> loss, _ = sac_actor_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([-2.0]), 0.5)
    >>> float(loss)
    -2.0
    """
    loss = (alpha * log_prob - q_pi.min(0).values).mean()
    return loss, {"loss/actor": loss.detach(), "entropy": -log_prob.detach().mean()}


def sac_temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The temperature loss ``-mean(log_alpha * (log pi(a|s) + target_entropy))`` (SAC paper, eq. 18, in log alpha).

    Its gradient raises alpha while the policy's entropy ``-log pi`` is below ``target_entropy`` and lowers it
    while above.

    Args:
        log_alpha: 0-d, with gradient.
        log_prob: ``float [N]`` (no gradient flows into the policy).
        target_entropy: the entropy aimed at, usually ``-action_dim``.

    Returns:
        ``(loss, stats)``.

    >>> loss, _ = sac_temperature_loss(torch.tensor(0.5), torch.tensor([1.0, 3.0]), -1.0)
    >>> float(loss)
    -0.5
    """
    loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
    return loss, {"loss/temperature": loss.detach(), "alpha": log_alpha.detach().exp()}


class SACLearner(TwinCriticLearner):
    """SAC's learner for the off-policy loop (:class:`~rlstruct.algos.harness.OffPolicyLearner`): the twin-critic
    learner (:class:`~rlstruct.algos.twin_critic.TwinCriticLearner`: the actor, the twin critics and their
    Polyak-averaged targets, their Adams) with a :class:`SquashedGaussianActor`, the critics on the soft targets, and
    the entropy temperature and its Adam; one gradient step updates the critics, the actor, the temperature, then the
    targets.

    The actor acts uniformly at random for a fresh run's first ``learning_starts`` env steps; a resumed run restores
    every network, the temperature and the optimizers (its :attr:`state` declares the temperature and its Adam
    beside the twin-critic learner's), and lets the restored actor act while its buffer refills.
    The gradient steps are ``gradient_steps_per_env_step`` per new env step, fractions carried over.

    Args:
        config: the run's settings.
        spec: the env's description.
        resume: the checkpoint the run continues (``None``: a fresh run).
        device: the learner's device.
        seed: seeds the generator of the gradient steps' noise (this session's learner seed).
        n_rows: the training batcher's envs.
    """

    config: SACConfig
    policy: SquashedGaussianActor

    def __init__(self, config: SACConfig, spec: EnvSpec, resume: Resume | None, *, device: torch.device, seed: int,
                 n_rows: int):
        super().__init__(config, spec, resume, device=device, seed=seed, actor=SquashedGaussianActor,
                         critic_loss=sac_critic_loss, critic_lr=config.critic_lr, infos={r: DictTensor({
                             "stochastic": torch.ones(n_rows, dtype=torch.bool),
                             "random": torch.full((n_rows,), r, dtype=torch.bool)}) for r in (True, False)})
        self.target_entropy = -float(spec.action_dim) if config.target_entropy is None else config.target_entropy
        self.log_alpha = torch.tensor(math.log(config.init_temperature), device=device, requires_grad=True)
        self.alpha_opt = Adam([self.log_alpha], lr=config.lr, eps=config.adam_eps)
        self.state.add(log_alpha=self.log_alpha, alpha_optimizer=self.alpha_opt)

    @staticmethod
    def exploration(config: SACConfig) -> dict[str, bool | float]:
        """The training ``agent_info``'s example: samples of the policy, uniform actions while a fresh run starts."""
        return {"stochastic": True, "random": True}

    def tensors(self) -> list[torch.Tensor]:
        """The actor's, the critics' and the target critics' parameters and buffers, and the log temperature."""
        return [*super().tensors(), self.log_alpha]

    def critic_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """:func:`soft_q_targets` at actions the actor samples at ``next_obs``."""
        next_obs = batch["next_obs"]
        eps = torch.randn(self.config.batch_size, self.action_dim, generator=self.noise, device=self.device)
        next_action, next_log_prob = self.policy.sample(next_obs, eps)
        return soft_q_targets(batch["ret"], batch["discount"], self.target_critic(next_obs, next_action),
                              next_log_prob, self.log_alpha.detach().exp())

    def update_actor(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of the actor on :func:`sac_actor_loss`, then of the temperature on :func:`sac_temperature_loss`."""
        alpha = self.log_alpha.detach().exp()
        eps = torch.randn(self.config.batch_size, self.action_dim, generator=self.noise, device=self.device)
        action, log_prob = self.policy.sample(obs, eps)
        actor_loss, actor_stats = sac_actor_loss(self.critics_at(obs, action), log_prob, alpha)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()

        alpha_loss, alpha_stats = sac_temperature_loss(self.log_alpha, log_prob, self.target_entropy)
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        return {**actor_stats, **alpha_stats}


def evaluation_agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The agent factory that evaluates a saved SAC run."""
    return create_sac_agent


def evaluation_info(config: Mapping[str, Any], sample: bool) -> dict[str, bool | float]:
    """The evaluation ``agent_info`` of a SAC run: the squashed mean, or draws from the policy when ``sample`` (never
    the uniform warm-up draws)."""
    return {"stochastic": sample, "random": False}


ALGORITHM = OffPolicyAlgorithm(name="sac", title="SAC", config_cls=SACConfig, description=__doc__.splitlines()[0],
                               check_config=check_config, check_env=check_env, make_learner=SACLearner,
                               agent=evaluation_agent, evaluation_info=evaluation_info,
                               search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("sac"))
