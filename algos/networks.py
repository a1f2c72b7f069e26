"""Networks and the policy agent the algorithms share: the MLP, the actor-critic, its action distributions,
its agent and its loss.

:func:`build_actor_critic` builds the network of REINFORCE, A2C, PPO and the profiler for an env's
:class:`~rlstruct.algos._train.env_spec.EnvSpec`: an :class:`ActorCritic` whose policy is a :class:`Categorical` over
discrete actions or a :class:`DiagGaussian` over continuous ones. Both distributions answer the same four
questions (``log_prob``, ``entropy``, ``sample(generator)``, ``mode``), so every loss is written once for
both kinds of action. :class:`PolicyAgent` runs the network in the batchers (sampling with its own
generator) and replays it for the learner; :func:`masked_policy_value_loss` is the loss of its two heads.
:class:`NetworkAgent` is the base of every agent of ``rlstruct.algos`` (DQN's ``QAgent`` too).

What a :class:`PolicyAgent` writes into the trajectories (``action/*``):

* ``action/action``: what the env receives: ``int64 [B, T]`` (discrete) or ``float32 [B, T, D]`` clipped
  to the env's bounds ``[action_low, action_high]`` (continuous);
* ``action/raw`` (continuous only): the unclipped Gaussian sample, ``float32 [B, T, D]``. The losses take
  the log-probability of this one: the policy sampled it, the clipping belongs to the env;
* ``action/log_prob``: ``log pi(raw | s)`` under the weights that acted, ``float32 [B, T]`` (PPO's
  behaviour log-probability).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos._train.optim import Adam
from rlstruct.algos.encoders import make_encoder
from rlstruct.algos.normalization import ObservationNormalizer
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

if TYPE_CHECKING:  # run imports networks: the spec's module is needed for annotations only
    from rlstruct.algos._train.env_spec import EnvSpec

__all__ = [
    "actor_critic_outputs",
    "autocast_context",
    "critic_values",
    "mlp",
    "Categorical",
    "DiagGaussian",
    "ActionDistribution",
    "ActorCritic",
    "EncoderActorCritic",
    "build_actor_critic",
    "check_normalizable",
    "NetworkAgent",
    "PolicyAgent",
    "create_policy_agent",
    "policy_actions",
    "masked_policy_value_loss",
    "normalize_masked",
    "make_adam",
]


_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(in_size: int, hidden_sizes: Sequence[int], out_size: int, *, out_gain: float = 1.0,
        layer_norm: bool = False, activation: str = "tanh") -> nn.Sequential:
    """An MLP with orthogonal initialisation (gain sqrt(2) inside, ``out_gain`` on the last layer).

    Each hidden layer is ``Linear``, then ``LayerNorm`` with ``layer_norm`` (Ba et al. 2016; PQN's stabiliser), then
    ``activation`` (``"tanh"`` or ``"relu"``).

    >>> mlp(4, (8,), 2)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    >>> [type(m).__name__ for m in mlp(4, (8,), 2, layer_norm=True, activation="relu")]
    ['Linear', 'LayerNorm', 'ReLU', 'Linear']
    """
    layers: list[nn.Module] = []
    sizes = [in_size, *hidden_sizes]
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), *([nn.LayerNorm(b)] if layer_norm else []),
                   _ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(sizes[-1], out_size), out_gain))
    return nn.Sequential(*layers)


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` in ``dtype``, or a context that does nothing for ``dtype=None``.

    Without autocast's cache of cast weights: a CUDA-graph capture cannot use a cast made before it (the replays
    would read a cast of the weights of that time).

    >>> with autocast_context(torch.device("cpu"), torch.bfloat16):
    ...     torch.ones(2, 3) @ torch.ones(3, 1)
    tensor([[3.],
            [3.]], dtype=torch.bfloat16)
    """
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Categorical:
    """A categorical distribution over the last axis of ``logits``.

    Args:
        logits: ``float [..., A]`` unnormalised log-probabilities (of a network's forward under ``torch.autocast``
            too: the distribution computes in float32).

    >>> d = Categorical(torch.tensor([[0.0, math.log(3.0)]]))
    >>> d.log_prob(torch.tensor([1])).exp(), d.mode()
    (tensor([0.7500]), tensor([1]))
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.float()
        self.log_probs = torch.log_softmax(self.logits, -1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log p(a)`` of ``actions int64 [...]``: ``float [...]``."""
        return self.log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """``float [...]``."""
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """One draw per row from ``generator``: ``int64 [...]``."""
        return self.sample_from(Categorical.noise(self.logits.shape, generator, self.logits.device))

    @staticmethod
    def noise(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """The randomness of :meth:`sample` for logits of ``shape``: uniform ``float32`` in ``[0, 1)``."""
        return torch.rand(tuple(shape), generator=generator, device=device, dtype=torch.float32)

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """The draw that ``noise`` (from :meth:`noise`) makes: ``int64 [...]``; what :meth:`sample` returns for
        the same generator state."""
        # Gumbel-max: one uniform draw per logit, no per-row branch, works on every device with a generator.
        return (self.logits - torch.log(-torch.log(noise.clamp_min(1e-20)))).argmax(-1)

    def mode(self) -> torch.Tensor:
        """The most likely action: ``int64 [...]``."""
        return self.logits.argmax(-1)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class DiagGaussian:
    """A Gaussian with a diagonal covariance over the last axis (``D`` independent action dimensions).

    Args:
        mean: ``float [..., D]`` (of a network's forward under ``torch.autocast`` too: the distribution computes in
            float32).
        log_std: ``float [D]`` (state-independent) or ``[..., D]``.

    >>> d = DiagGaussian(torch.zeros(2, 1), torch.zeros(1))
    >>> d.log_prob(torch.zeros(2, 1)), d.entropy()
    (tensor([-0.9189, -0.9189]), tensor([1.4189, 1.4189]))
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean.float()
        self.log_std = log_std.expand_as(self.mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log p(a)`` of ``actions float [..., D]``, summed over ``D``: ``float [...]``."""
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        """``float [...]``."""
        return (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """One draw per row from ``generator``: ``float [..., D]`` (unbounded: clip it for the env)."""
        return self.sample_from(DiagGaussian.noise(self.mean.shape, generator, self.mean.device))

    @staticmethod
    def noise(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """The randomness of :meth:`sample` for means of ``shape``: standard normal ``float32``."""
        return torch.randn(tuple(shape), generator=generator, device=device, dtype=torch.float32)

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """The draw that ``noise`` (from :meth:`noise`) makes: ``float [..., D]``; what :meth:`sample` returns for
        the same generator state."""
        return self.mean + self.log_std.exp() * noise

    def mode(self) -> torch.Tensor:
        """The mean: ``float [..., D]``."""
        return self.mean


#: what :meth:`ActorCritic.policy` returns
ActionDistribution = Categorical | DiagGaussian


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation; a categorical or diagonal Gaussian policy.

    With ``n_actions`` the actor's outputs are the logits of a :class:`Categorical`; with ``n_actions=None``
    they are the mean of a :class:`DiagGaussian` over ``action_dim`` values, whose log standard deviation is a
    learned parameter ``log_std [action_dim]`` that does not depend on the state. Build it for an env with
    :func:`build_actor_critic`.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions, or ``None`` for continuous actions.
        hidden_sizes: hidden widths of both MLPs.
        action_dim: size of a continuous action (ignored for discrete actions).
        log_std_init: initial log standard deviation of the Gaussian.
        normalize_observations: both MLPs see the observations through an
            :class:`~rlstruct.algos.normalization.ObservationNormalizer` (``self.normalizer``; ``None`` without),
            whose statistics the learner updates.

    >>> m = ActorCritic(4, 2, (8,))
    >>> m.policy(torch.zeros(3, 4)).logits.shape, m.value(torch.zeros(3, 4)).shape
    (torch.Size([3, 2]), torch.Size([3]))
    >>> ActorCritic(3, None, (8,), action_dim=1).policy(torch.zeros(5, 3)).sample(torch.Generator()).shape
    torch.Size([5, 1])
    """

    def __init__(self, obs_dim: int, n_actions: int | None, hidden_sizes: Sequence[int], *, action_dim: int = 1,
                 log_std_init: float = 0.0, normalize_observations: bool = False):
        super().__init__()
        self.normalizer = ObservationNormalizer((obs_dim,)) if normalize_observations else None
        self.continuous = n_actions is None
        #: the policy's outputs per row: the logits of the ``n_actions``, or the Gaussian's ``action_dim`` means
        self.policy_dim = action_dim if self.continuous else n_actions
        self.actor = mlp(obs_dim, hidden_sizes, action_dim if self.continuous else n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_gain=1.0)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def policy(self, frame: torch.Tensor) -> ActionDistribution:
        """The action distribution of observations ``[N, obs_dim]`` of any dtype (batch shape ``[N]``)."""
        out = self.actor(self._input(frame))
        return DiagGaussian(out, self.log_std) if self.continuous else Categorical(out)

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``float32 [N]`` (also under ``torch.autocast``)."""
        return self.critic(self._input(frame)).squeeze(-1).float()

    def _input(self, frame: torch.Tensor) -> torch.Tensor:
        # float32 for the MLPs (MuJoCo's observations are float64), normalised where the model normalises.
        return frame.float() if self.normalizer is None else self.normalizer(frame)

    def policy_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters of the policy: the actor MLP, and ``log_std`` for a Gaussian."""
        yield from self.actor.parameters()
        if self.continuous:
            yield self.log_std


class EncoderActorCritic(nn.Module):
    """Policy and value heads on one shared encoder (:func:`~rlstruct.algos.encoders.make_encoder`: the CNN for
    images): the actor-critic of A2C and PPO for image observations (discrete actions).

    Frames reach it as the env gives them (``uint8``, ``bool``); the encoder makes floats inside the forward.

    Args:
        obs_shape: one frame's shape.
        n_actions: number of discrete actions.
        hidden_sizes: the MLP encoder's widths (flat frames).
        obs_dtype: the env's frame dtype (``"uint8"`` pixels are divided by ``obs_high`` in the forward).
        obs_high: the largest value of ``uint8`` frames (``EnvSpec.obs_high``; default 255).

    >>> m = EncoderActorCritic((10, 10, 4), 3, (64,), obs_dtype="bool")
    >>> frames = torch.zeros(5, 10, 10, 4, dtype=torch.bool)
    >>> m.policy(frames).logits.shape, m.value(frames).shape
    (torch.Size([5, 3]), torch.Size([5]))
    """

    continuous = False

    def __init__(self, obs_shape: Sequence[int], n_actions: int, hidden_sizes: Sequence[int], *,
                 obs_dtype: str = "uint8", obs_high: float | None = None):
        super().__init__()
        self.encoder = make_encoder(obs_shape, hidden_sizes, obs_dtype, obs_high)
        #: the policy's outputs per row: the logits of the ``n_actions``
        self.policy_dim = n_actions
        self.policy_head = _init(nn.Linear(self.encoder.out_dim, n_actions), 0.01)
        self.value_head = _init(nn.Linear(self.encoder.out_dim, 1), 1.0)

    def policy(self, frame: torch.Tensor) -> Categorical:
        """The action distribution of frames ``[N, ...]`` (logits ``[N, n_actions]``)."""
        return Categorical(self.policy_head(self.encoder(frame)))

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``float32 [N]`` (also under ``torch.autocast``)."""
        return self.value_head(self.encoder(frame)).squeeze(-1).float()


def build_actor_critic(spec: EnvSpec, hidden_sizes: Sequence[int], *,
                       normalize_observations: bool = False) -> ActorCritic | EncoderActorCritic:
    """The actor-critic for an env: an :class:`ActorCritic` (two MLPs) whose policy head follows ``spec``
    (discrete or continuous actions) for flat observations, an :class:`EncoderActorCritic` (a shared CNN, two
    heads) for images.

    The one place where the algorithms build their policy network from an env's description.

    Args:
        spec: the env's description.
        hidden_sizes: the MLPs' widths.
        normalize_observations: an :class:`ActorCritic` whose inputs are normalised (flat observations only).

    Raises:
        SpaceError: the observation is an image and the actions are continuous, or ``normalize_observations``
            with image observations.

    >>> from rlstruct.algos._train.env_spec import EnvSpec
    >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
    >>> build_actor_critic(spec, (8,)).log_std.shape
    torch.Size([1])
    >>> type(build_actor_critic(EnvSpec((4, 84, 84), "uint8", 4, 1000), (8,))).__name__
    'EncoderActorCritic'
    """
    if spec.pixels:
        check_normalizable(spec, normalize_observations)
        if not spec.discrete:
            raise SpaceError(
                f"build_actor_critic takes discrete actions with image observations, got spec.obs_shape="
                f"{spec.obs_shape} with continuous actions of shape {spec.action_shape}; "
                "flatten the observation or pick an env with discrete actions"
            )
        return EncoderActorCritic(spec.obs_shape, spec.n_actions, hidden_sizes, obs_dtype=spec.obs_dtype,
                                  obs_high=spec.obs_high)
    if spec.discrete:
        return ActorCritic(spec.obs_dim, spec.n_actions, hidden_sizes, normalize_observations=normalize_observations)
    return ActorCritic(spec.obs_dim, None, hidden_sizes, action_dim=spec.action_dim,
                       normalize_observations=normalize_observations)


def check_normalizable(spec: EnvSpec, normalize_observations: bool) -> None:
    """Refuses ``normalize_observations`` for image observations (the CNN scales pixels itself).

    Raises:
        SpaceError: ``normalize_observations`` with image observations.
    """
    if normalize_observations and spec.pixels:
        raise SpaceError(
            f"normalize_observations takes flat observations, got image frames of shape {spec.obs_shape}; the CNN "
            "encoder scales pixels itself: drop normalize_observations"
        )


class NetworkAgent(RL_Agent):
    """The part every batcher agent of ``algos`` shares: one network on ``device`` and its own generator.

    The generator is seeded by the batcher's ``agent_seeds``; :meth:`update` loads the learner's weights;
    :meth:`_on_device` copies a per-env ``agent_info`` tensor to the device once per acquisition.

    Args:
        model: the network, on ``device``.
        device: where observations come from and actions go.
        autocast: the dtype the agents (:class:`PolicyAgent`, the recurrent one, the Q agent) run their forward in,
            under ``torch.autocast`` (``None``: the weights' own; see :func:`autocast_context`); the distributions
            and what they return stay float32.
    """

    def __init__(self, model: nn.Module, device: DeviceLike, *, autocast: torch.dtype | None = None):
        self.model = model
        self.device = as_device(device)
        self.autocast = autocast
        self.generator = torch.Generator(device=self.device)
        self._infos: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def seed(self, seed: int) -> None:
        """Seeds the sampling generator (the batcher passes its ``agent_seeds``)."""
        self.generator.manual_seed(seed)

    def update(self, state_dict: Any) -> None:
        """Loads the learner's weights."""
        self.model.load_state_dict(state_dict)

    def _on_device(self, info: torch.Tensor, key: str = "stochastic") -> torch.Tensor:
        # The batcher hands the same CPU tensor at every step of an acquisition: copy it to the device once. A
        # CUDA-graph capture records the copy instead (from the batcher's pinned static, so non_blocking), so that
        # every replay reads that static's current values.
        cached = self._infos.get(key)
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing or cached is None or cached[0] is not info:
            cached = self._infos[key] = (info, info.to(self.device, non_blocking=True))
        return cached[1]


def policy_actions(trajectories: TemporalDictTensor) -> torch.Tensor:
    """The actions the policy sampled, whose log-probability the losses take: ``action/raw`` where the
    trajectories have it (continuous actions, before clipping), else ``action/action``."""
    return trajectories["action/raw"] if "action/raw" in trajectories else trajectories["action/action"]


class PolicyAgent(NetworkAgent):
    """A stateless policy for the batchers (categorical or Gaussian), and the learner's replay of its network.

    ``__call__`` samples an action where ``agent_info["stochastic"]`` is true (every row when the key is
    missing) and takes the distribution's mode elsewhere (the most likely action, or the Gaussian's mean).
    A continuous action is clipped to ``[action_low, action_high]`` for the env (``action``), and the sample
    itself is kept as ``raw``; both come with ``log_prob``, the log-probability of the sample (see the
    module's docstring). :meth:`replay_batch` recomputes, for a whole batch of trajectories at once (one
    forward over ``B*T`` rows), ``log_prob`` of the sampled actions, ``entropy``, ``V(observation/frame)``
    and ``V(_observation/frame)``; :meth:`call_replay` computes the same for one step, for
    :func:`rlstruct.agents.replay_agent`.

    A step draws its noise from the agent's generator first (:meth:`Categorical.noise`), then computes the rest
    from it (:meth:`step`: the forward, the draw, the mode where not stochastic, the log-probability, the
    clipping): with ``compile``, that function is compiled by ``torch.compile`` (its elementwise work fused;
    a generator inside would split it), the same actions up to floating-point rounding.

    Args:
        model: the :class:`ActorCritic`, on ``device``.
        device: where observations come from and actions go.
        action_low: lower bounds of a continuous action, ``D`` values (``None``: no clipping).
        action_high: upper bounds of a continuous action, ``D`` values (``None``: no clipping).
        autocast: see :class:`NetworkAgent`.
        compile: compile :meth:`step` (``torch.compile``, default mode; the first call compiles, and a new number
            of rows compiles again until torch marks it dynamic).
    """

    model: ActorCritic

    def __init__(self, model: ActorCritic, device: DeviceLike, *, action_low: Sequence[float] | None = None,
                 action_high: Sequence[float] | None = None, autocast: torch.dtype | None = None,
                 compile: bool = False):
        super().__init__(model, device, autocast=autocast)
        self._low = None if action_low is None else torch.tensor(action_low, dtype=torch.float32, device=self.device)
        self._high = None if action_high is None else torch.tensor(action_high, dtype=torch.float32,
                                                                   device=self.device)
        self._noise = DiagGaussian.noise if model.continuous else Categorical.noise
        self._step = torch.compile(self.step) if compile else self.step

    def _stochastic(self, agent_info: DictTensor) -> torch.Tensor | None:
        if "stochastic" not in agent_info:
            return None
        return self._on_device(agent_info["stochastic"])

    def __call__(self, state, observation, agent_info, history=None):
        """``action`` (``int64 [N]``, or ``float32 [N, D]`` within the bounds), ``raw`` (continuous only) and
        ``log_prob float32 [N]``."""
        frame = observation["frame"]
        noise = self._noise((frame.shape[0], self.model.policy_dim), self.generator, self.device)
        return DictTensor(self._step(frame, noise, self._stochastic(agent_info))), state

    def step(self, frame: torch.Tensor, noise: torch.Tensor,
             stochastic: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """What :meth:`__call__` returns for frames ``[N, *obs]``, from its noise ``float32 [N, A or D]`` and
        ``stochastic`` (``bool [N]``, or ``None``: every row samples); a function of its tensors only."""
        with autocast_context(self.device, self.autocast):
            dist = self.model.policy(frame)
        action = dist.sample_from(noise)
        if stochastic is not None:
            where = stochastic.unsqueeze(-1) if self.model.continuous else stochastic
            action = torch.where(where, action, dist.mode())
        out = {"action": action, "log_prob": dist.log_prob(action)}
        if self.model.continuous:
            out["raw"] = action
            if self._low is not None:
                out["action"] = torch.maximum(torch.minimum(action, self._high), self._low)
        return out

    def call_replay(self, trajectories: Trajectories, t: int, state: DictTensor | None):
        """``log_prob [B]``, ``entropy [B]``, ``value [B]`` and ``next_value [B]`` of step ``t``."""
        tt = trajectories.trajectories
        out = _step_outputs(self.model, tt["observation/frame"][:, t], tt["_observation/frame"][:, t],
                           policy_actions(tt)[:, t])
        return DictTensor(out), DictTensor({})

    def replay_batch(self, trajectories: Trajectories) -> TemporalDictTensor:
        """``log_prob [B, T]``, ``entropy [B, T]``, ``value [B, T]`` and ``next_value [B, T]`` in one forward pass."""
        tt = trajectories.trajectories
        out = actor_critic_outputs(self.model, tt["observation/frame"], tt["_observation/frame"], policy_actions(tt))
        return TemporalDictTensor(out, tt.lengths)


def actor_critic_outputs(model: nn.Module, frame: torch.Tensor, next_frame: torch.Tensor,
                         action: torch.Tensor) -> dict[str, torch.Tensor]:
    """``log_prob``, ``entropy``, ``value`` and ``next_value``, each ``[B, T]``, of an actor-critic over a batch.

    What :meth:`PolicyAgent.replay_batch` computes, from tensors (what a compiled loss takes): one forward of the
    critic over ``frame`` and ``next_frame`` together, one of the policy.

    Args:
        model: an actor-critic (``policy(frame)`` and ``value(frame)``).
        frame: ``[B, T, *obs]``, ``observation/frame``.
        next_frame: ``[B, T, *obs]``, ``_observation/frame``.
        action: ``[B, T]`` (discrete) or ``[B, T, D]`` (the sampled, unclipped action).
    """
    B, T = frame.shape[:2]
    out = _step_outputs(model, frame.flatten(0, 1), next_frame.flatten(0, 1), action.flatten(0, 1))
    return {k: v.unflatten(0, (B, T)) for k, v in out.items()}


def critic_values(model: nn.Module, frame: torch.Tensor, next_frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``V(frame)`` and ``V(next_frame)`` of an actor-critic over rows ``[N, *obs]``: one forward of the critic over
    both together, and none of the policy (PPO's advantages need no more: its old log-probabilities come with the
    batch).

    Returns:
        ``(value, next_value)``, each ``float32 [N]``.

    >>> v, nv = critic_values(ActorCritic(4, 2, (8,)), torch.zeros(3, 4), torch.ones(3, 4))
    >>> v.shape, nv.shape
    (torch.Size([3]), torch.Size([3]))
    """
    values = model.value(torch.cat([frame, next_frame]))
    n = frame.shape[0]
    return values[:n], values[n:]


def _step_outputs(model: nn.Module, frame: torch.Tensor, next_frame: torch.Tensor,
                  actions: torch.Tensor) -> dict[str, torch.Tensor]:
    # One forward of the critic over frame and next_frame together, one of the policy; rows [N].
    value, next_value = critic_values(model, frame, next_frame)
    dist = model.policy(frame)
    return {"log_prob": dist.log_prob(actions), "entropy": dist.entropy(), "value": value, "next_value": next_value}


def create_policy_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    autocast: torch.dtype | None = None, compile: bool = False, normalize_observations: bool = False,
) -> RL_Agent:
    """Builds a batcher's :class:`PolicyAgent` for ``spec``'s env on ``device`` (module level, so it pickles).

    Its weights (and, with ``normalize_observations``, its observation statistics) are the initial ones until the
    first ``batcher.update``; continuous actions are clipped to the spec's bounds; its forward runs under
    ``autocast`` (see :class:`NetworkAgent`), its step compiled with ``compile``. With ``check_device`` it is
    wrapped in :class:`~rlstruct.agents.RL_Agent_CheckDevice`.
    """
    model = build_actor_critic(spec, hidden_sizes, normalize_observations=normalize_observations).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = PolicyAgent(model, device, action_low=spec.action_low, action_high=spec.action_high,
                                  autocast=autocast, compile=compile)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def masked_policy_value_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    value_targets: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of a policy with a learned value, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * A) + value_coef * mean((V(s) - target)^2) / 2 - entropy_coef * mean(H)``:
    the core of :func:`~rlstruct.algos.a2c.a2c_loss` (GAE targets) and
    :func:`~rlstruct.algos.reinforce.reinforce_loss` (Monte-Carlo returns, ``V`` the baseline), which
    compute their own ``value_targets`` and ``advantages``. It takes log-probabilities and entropies, so it
    serves every :data:`ActionDistribution` (``dist.log_prob(policy_actions(tt))``, ``dist.entropy()``).

    Args:
        log_probs: ``float [B, T]``, ``log pi(a|s)`` of the sampled actions, with gradient.
        entropy: ``float [B, T]``, the policy's entropy at each step, with gradient.
        values: ``float [B, T]`` with gradient.
        value_targets: ``float [B, T]``, what ``values`` regresses on (no gradient).
        advantages: ``float [B, T]`` (no gradient).
        mask: ``float [B, T]``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages over the valid steps for the policy term.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``policy``, ``value`` and ``entropy`` terms.

    >>> d = Categorical(torch.zeros(1, 2, 2))
    >>> loss, stats = masked_policy_value_loss(d.log_prob(torch.zeros(1, 2, dtype=torch.long)), d.entropy(),
    ...                                        torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2),
    ...                                        value_coef=1.0, entropy_coef=0.0, normalize_advantages=False)
    >>> round(loss.item(), 4), round(stats["value"].item(), 4)
    (1.1931, 0.5)
    """
    n = mask.sum().clamp_min(1.0)
    adv = advantages
    if normalize_advantages:
        adv = normalize_masked(adv, mask)
    policy_loss = -(log_probs * adv * mask).sum() / n
    value_loss = 0.5 * (((values - value_targets) ** 2) * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    return loss, {"policy": policy_loss.detach(), "value": value_loss.detach(), "entropy": mean_entropy.detach()}


def normalize_masked(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the mean and (biased) std taken over the valid entries of ``mask``.

    >>> normalize_masked(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))[:2]
    tensor([-1.,  1.])
    """
    n = mask.sum().clamp_min(1.0)
    mean = (x * mask).sum() / n
    std = (((x - mean) ** 2 * mask).sum() / n).sqrt()
    return (x - mean) / (std + eps)


def make_adam(model: nn.Module, lr: float, device: DeviceLike) -> Adam:
    """Adam over the model's parameters; the fused kernel where torch has one (CPU, CUDA).

    :class:`~rlstruct.algos._train.optim.Adam`: ``torch.optim.Adam``'s update and state dict, without the import of
    ``torch._dynamo`` that every ``torch.optim`` optimizer makes (about 1 s on a small CPU).
    """
    fused = as_device(device).type in ("cpu", "cuda")
    return Adam(model.parameters(), lr=lr, fused=fused or None)
