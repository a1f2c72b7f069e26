"""Networks and the policy agent the algorithms share: the MLP, the actor-critic, its agent and its loss.

:class:`ActorCritic` is the network of REINFORCE, A2C and the profiler; :class:`PolicyAgent` runs it in the
batchers (sampling with its own generator) and replays it for the learner; :func:`masked_policy_value_loss`
is the loss of its two heads. :class:`NetworkAgent` is the base of every agent of ``rlstruct.algos``
(DQN's ``QAgent`` too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos.encoders import EncoderActorCritic
from rlstruct.devices import DeviceLike, as_device
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

if TYPE_CHECKING:  # run imports networks: the spec's module is needed for annotations only
    from rlstruct.algos.run import EnvSpec

__all__ = [
    "mlp",
    "ActorCritic",
    "actor_critic_for",
    "NetworkAgent",
    "PolicyAgent",
    "create_policy_agent",
    "masked_policy_value_loss",
    "make_adam",
    "cpu_state_dict",
]


def mlp(in_size: int, hidden_sizes: Sequence[int], out_size: int, *, out_gain: float = 1.0) -> nn.Sequential:
    """A tanh MLP with orthogonal initialisation (gain sqrt(2) inside, ``out_gain`` on the last layer).

    >>> mlp(4, (8,), 2)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """
    layers: list[nn.Module] = []
    sizes = [in_size, *hidden_sizes]
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), nn.Tanh()]
    layers.append(_init(nn.Linear(sizes[-1], out_size), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions.
        hidden_sizes: hidden widths of both MLPs.

    >>> m = ActorCritic(4, 2, (8,))
    >>> m.policy(torch.zeros(3, 4)).shape, m.value(torch.zeros(3, 4)).shape
    (torch.Size([3, 2]), torch.Size([3]))
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int]):
        super().__init__()
        self.actor = mlp(obs_dim, hidden_sizes, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_gain=1.0)

    def policy(self, frame: torch.Tensor) -> torch.Tensor:
        """Action logits ``[N, n_actions]`` of observations ``[N, obs_dim]``."""
        return self.actor(frame)

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``[N]``."""
        return self.critic(frame).squeeze(-1)


def actor_critic_for(spec: EnvSpec, hidden_sizes: Sequence[int]) -> ActorCritic | EncoderActorCritic:
    """The actor-critic for ``spec``'s observations: :class:`ActorCritic` (two MLPs) for flat frames,
    :class:`~rlstruct.algos.encoders.EncoderActorCritic` (a shared CNN, two heads) for images."""
    if spec.pixels:
        return EncoderActorCritic(spec.obs_shape, spec.n_actions, hidden_sizes)
    return ActorCritic(spec.obs_dim, spec.n_actions, hidden_sizes)


def _sample_categorical(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Gumbel-max: one uniform draw per logit, no per-row branch, works on every device with a generator.
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    return (logits - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(-1)


class NetworkAgent(RL_Agent):
    """The part every batcher agent of ``algos`` shares: one network on ``device`` and its own generator.

    The generator is seeded by the batcher's ``agent_seeds``; :meth:`update` loads the learner's weights;
    :meth:`_on_device` copies a per-env ``agent_info`` tensor to the device once per acquisition.

    Args:
        model: the network, on ``device``.
        device: where observations come from and actions go.
    """

    def __init__(self, model: nn.Module, device: DeviceLike):
        self.model = model
        self.device = as_device(device)
        self.generator = torch.Generator(device=self.device)
        self._info: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    def seed(self, seed: int) -> None:
        """Seeds the sampling generator (the batcher passes its ``agent_seeds``)."""
        self.generator.manual_seed(seed)

    def update(self, state_dict: Any) -> None:
        """Loads the learner's weights."""
        self.model.load_state_dict(state_dict)

    def _on_device(self, info: torch.Tensor) -> torch.Tensor:
        # The batcher hands the same CPU tensor at every step of an acquisition: copy it to the device once.
        if self._info[0] is not info:
            self._info = (info, info.to(self.device))
        return self._info[1]


class PolicyAgent(NetworkAgent):
    """A stateless categorical policy for the batchers, and the learner's replay of its network.

    ``__call__`` samples an action where ``agent_info["stochastic"]`` is true (every row when the key is
    missing) and takes the most likely action elsewhere. :meth:`replay_batch` recomputes, for a whole
    batch of trajectories at once (one forward over ``B*T`` rows), the logits, ``V(observation/frame)``
    and ``V(_observation/frame)``; :meth:`call_replay` computes the same for one step, for
    :func:`rlstruct.agents.replay_agent`.

    Args:
        model: the :class:`ActorCritic`, on ``device``.
        device: where observations come from and actions go.
    """

    model: ActorCritic

    def _stochastic(self, agent_info: DictTensor) -> torch.Tensor | None:
        if "stochastic" not in agent_info:
            return None
        return self._on_device(agent_info["stochastic"])

    def __call__(self, state, observation, agent_info, history=None):
        """Samples (or, where ``stochastic`` is false, picks the most likely) ``action int64 [N]``."""
        logits = self.model.policy(observation["frame"])
        action = _sample_categorical(logits, self.generator)
        stochastic = self._stochastic(agent_info)
        if stochastic is not None:
            action = torch.where(stochastic, action, logits.argmax(-1))
        return DictTensor({"action": action}), state

    def _outputs(self, frame: torch.Tensor, next_frame: torch.Tensor) -> dict[str, torch.Tensor]:
        n = frame.shape[0]
        values = self.model.value(torch.cat([frame, next_frame]))
        return {"logits": self.model.policy(frame), "value": values[:n], "next_value": values[n:]}

    def call_replay(self, trajectories: Trajectories, t: int, state: DictTensor | None):
        """``logits [B, A]``, ``value [B]`` and ``next_value [B]`` of step ``t``."""
        tt = trajectories.trajectories
        out = self._outputs(tt["observation/frame"][:, t], tt["_observation/frame"][:, t])
        return DictTensor(out), DictTensor({})

    def replay_batch(self, trajectories: Trajectories) -> TemporalDictTensor:
        """``logits [B, T, A]``, ``value [B, T]`` and ``next_value [B, T]`` in one forward pass."""
        tt = trajectories.trajectories
        obs, nxt = tt["observation/frame"], tt["_observation/frame"]
        B, T = obs.shape[:2]
        out = self._outputs(obs.flatten(0, 1), nxt.flatten(0, 1))
        return TemporalDictTensor({k: v.unflatten(0, (B, T)) for k, v in out.items()}, tt.lengths)


def create_policy_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False
) -> RL_Agent:
    """Builds a batcher's :class:`PolicyAgent` for ``spec``'s env on ``device`` (module level, so it pickles).

    Its weights are random until the first ``batcher.update``. With ``check_device`` it is wrapped in
    :class:`~rlstruct.agents.RL_Agent_CheckDevice`.
    """
    model = actor_critic_for(spec, hidden_sizes).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = PolicyAgent(model, device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def masked_policy_value_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    values: torch.Tensor,
    value_targets: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of a categorical policy with a learned value, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * A) + value_coef * mean((V(s) - target)^2) / 2 - entropy_coef * mean(H)``:
    the core of :func:`~rlstruct.algos.a2c.a2c_loss` (GAE targets) and
    :func:`~rlstruct.algos.reinforce.reinforce_loss` (Monte-Carlo returns, ``V`` the baseline), which
    compute their own ``value_targets`` and ``advantages``.

    Args:
        logits: ``float [B, T, A]`` with gradient.
        actions: ``int64 [B, T]``.
        values: ``float [B, T]`` with gradient.
        value_targets: ``float [B, T]``, what ``values`` regresses on (no gradient).
        advantages: ``float [B, T]`` (no gradient).
        mask: ``float [B, T]``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages over the valid steps for the policy term.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``policy``, ``value`` and ``entropy`` terms.

    >>> loss, stats = masked_policy_value_loss(torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long),
    ...                                        torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2),
    ...                                        value_coef=1.0, entropy_coef=0.0, normalize_advantages=False)
    >>> round(loss.item(), 4), round(stats["value"].item(), 4)
    (1.1931, 0.5)
    """
    n = mask.sum().clamp_min(1.0)
    log_probs = torch.log_softmax(logits, -1)
    log_pi = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    adv = advantages
    if normalize_advantages:
        mean = (adv * mask).sum() / n
        std = (((adv - mean) ** 2 * mask).sum() / n).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    policy_loss = -(log_pi * adv * mask).sum() / n
    value_loss = 0.5 * (((values - value_targets) ** 2) * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    return loss, {"policy": policy_loss.detach(), "value": value_loss.detach(), "entropy": mean_entropy.detach()}


def make_adam(model: nn.Module, lr: float, device: DeviceLike) -> torch.optim.Adam:
    """Adam over the model's parameters; the fused kernel where torch has one (CPU, CUDA).

    Note that the first optimizer of a process imports ``torch._dynamo`` (about 2 s on a small CPU).
    """
    fused = as_device(device).type in ("cpu", "cuda")
    return torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)


def cpu_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's weights on the CPU (what :meth:`RL_Batcher.update` takes).

    Always a copy, also for a CPU model (where ``.cpu()`` would alias the live parameters): the
    evaluator keeps the weights it evaluated while training goes on.
    """
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
