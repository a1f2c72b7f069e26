"""The networks of the algorithms: the MLP, the actor-critics (two MLPs, a shared encoder, an LSTM core) and
the builders that pick one for an env, the Polyak update of target networks, and the learners' Adam.

An actor-critic's ``policy(frame)`` is a :class:`~rlstruct.algos.distributions.Categorical` over discrete actions
or a :class:`~rlstruct.algos.distributions.DiagGaussian` over continuous ones; ``value(frame)`` is ``float32 [N]``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlstruct.algos._normalization import ObservationNormalizer
from rlstruct.algos._optim import Adam
from rlstruct.algos.distributions import ActionDistribution, Categorical, DiagGaussian
from rlstruct.algos.encoders import init_orthogonal, make_encoder
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import ConfigError, SpaceError

if TYPE_CHECKING:  # EnvSpec is needed for annotations only
    from rlstruct.algos import EnvSpec

__all__ = [
    "mlp",
    "Adam",
    "ActorCritic",
    "EncoderActorCritic",
    "RecurrentActorCritic",
    "build_actor_critic",
    "check_network_options",
    "make_adam",
    "recurrent_actor_critic",
]


_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(in_size: int, hidden_sizes: Sequence[int], out_size: int, *, out_gain: float = 1.0,
        layer_norm: bool = False, activation: str = "tanh", ortho_init: bool = True) -> nn.Sequential:
    """An MLP with orthogonal initialisation (gain sqrt(2) inside, ``out_gain`` on the last layer), or torch's
    default initialisation of ``nn.Linear`` without ``ortho_init`` (``out_gain`` unused then).

    Each hidden layer is ``Linear``, then ``LayerNorm`` with ``layer_norm`` (Ba et al. 2016; PQN's stabiliser), then
    ``activation`` (``"tanh"`` or ``"relu"``).

    Raises:
        ValueError: ``activation`` is neither ``"tanh"`` nor ``"relu"``.

    >>> mlp(4, (8,), 2)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    >>> [type(m).__name__ for m in mlp(4, (8,), 2, layer_norm=True, activation="relu")]
    ['Linear', 'LayerNorm', 'ReLU', 'Linear']
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(_ACTIVATIONS)}, got {activation!r}")

    def init(layer: nn.Linear, gain: float) -> nn.Module:
        return init_orthogonal(layer, gain) if ortho_init else layer

    layers: list[nn.Module] = []
    sizes = [in_size, *hidden_sizes]
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [init(nn.Linear(a, b), math.sqrt(2)), *([nn.LayerNorm(b)] if layer_norm else []),
                   _ACTIVATIONS[activation]()]
    layers.append(init(nn.Linear(sizes[-1], out_size), out_gain))
    return nn.Sequential(*layers)


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` in ``dtype``, or a context that does nothing for ``dtype=None``.

    >>> with autocast_context(torch.device("cpu"), torch.bfloat16):
    ...     torch.ones(2, 3) @ torch.ones(3, 1)
    tensor([[3.],
            [3.]], dtype=torch.bfloat16)
    """
    if dtype is None:
        return contextlib.nullcontext()
    # No cache of cast weights: a CUDA-graph replay would read the cast made at capture time.
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation; a categorical or diagonal Gaussian policy.

    With ``n_actions`` the actor's outputs are the logits of a :class:`~rlstruct.algos.distributions.Categorical`;
    with ``n_actions=None`` they are the mean of a :class:`~rlstruct.algos.distributions.DiagGaussian` over
    ``action_dim`` values, whose log standard deviation is a learned parameter ``log_std [action_dim]`` that does
    not depend on the state. Build it for an env with :func:`build_actor_critic`.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions, or ``None`` for continuous actions.
        hidden_sizes: hidden widths of both MLPs.
        action_dim: size of a continuous action (ignored for discrete actions).
        log_std_init: initial log standard deviation of the Gaussian.
        normalize_observations: both MLPs see the observations through an
            ``ObservationNormalizer`` (``self.normalizer``; ``None`` without),
            whose statistics the learner updates.
        activation: the MLPs' hidden activation, ``"tanh"`` or ``"relu"``.
        ortho_init: orthogonal initial weights (gain sqrt(2) inside, 0.01 on the actor's outputs, 1 on the
            critic's) and zero biases; ``False``: torch's default initialisation of ``nn.Linear``.

    >>> m = ActorCritic(4, 2, (8,))
    >>> m.policy(torch.zeros(3, 4)).logits.shape, m.value(torch.zeros(3, 4)).shape
    (torch.Size([3, 2]), torch.Size([3]))
    >>> ActorCritic(3, None, (8,), action_dim=1).policy(torch.zeros(5, 3)).sample(torch.Generator()).shape
    torch.Size([5, 1])
    """

    def __init__(self, obs_dim: int, n_actions: int | None, hidden_sizes: Sequence[int], *, action_dim: int = 1,
                 log_std_init: float = 0.0, normalize_observations: bool = False, activation: str = "tanh",
                 ortho_init: bool = True):
        super().__init__()
        self.normalizer = ObservationNormalizer((obs_dim,)) if normalize_observations else None
        self.continuous = n_actions is None
        #: the policy's outputs per row: the logits of the ``n_actions``, or the Gaussian's ``action_dim`` means
        self.policy_dim = action_dim if self.continuous else n_actions
        options = {"activation": activation, "ortho_init": ortho_init}
        self.actor = mlp(obs_dim, hidden_sizes, action_dim if self.continuous else n_actions, out_gain=0.01,
                         **options)
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_gain=1.0, **options)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def policy(self, frame: torch.Tensor) -> ActionDistribution:
        """The action distribution of observations ``[N, obs_dim]`` of any dtype (batch shape ``[N]``)."""
        out = self.actor(self._input(frame))
        return DiagGaussian(out, self.log_std) if self.continuous else Categorical(out)

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``float32 [N]`` (also under ``torch.autocast``)."""
        return self.critic(self._input(frame)).squeeze(-1).float()

    def policy_value(self, frame: torch.Tensor) -> tuple[ActionDistribution, torch.Tensor]:
        """``(policy(frame), value(frame))``: the two networks share nothing, so this is the two calls."""
        return self.policy(frame), self.value(frame)

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
    #: the agents return ``V(s)`` with each action (``action/value``): one more head on the shared features
    value_at_acting = True

    def __init__(self, obs_shape: Sequence[int], n_actions: int, hidden_sizes: Sequence[int], *,
                 obs_dtype: str = "uint8", obs_high: float | None = None):
        super().__init__()
        self.encoder = make_encoder(obs_shape, hidden_sizes, obs_dtype, obs_high)
        #: the policy's outputs per row: the logits of the ``n_actions``
        self.policy_dim = n_actions
        self.policy_head = init_orthogonal(nn.Linear(self.encoder.out_dim, n_actions), 0.01)
        self.value_head = init_orthogonal(nn.Linear(self.encoder.out_dim, 1), 1.0)

    def policy(self, frame: torch.Tensor) -> Categorical:
        """The action distribution of frames ``[N, ...]`` (logits ``[N, n_actions]``)."""
        return Categorical(self.policy_head(self.encoder(frame)))

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``float32 [N]`` (also under ``torch.autocast``)."""
        return self.value_head(self.encoder(frame)).squeeze(-1).float()

    def policy_value(self, frame: torch.Tensor) -> tuple[Categorical, torch.Tensor]:
        """``(policy(frame), value(frame))`` from one pass of the shared encoder: a loss that needs both (PPO's)
        pays for the CNN's forward and backward once, not twice.

        >>> m = EncoderActorCritic((10, 10, 4), 3, (64,), obs_dtype="bool")
        >>> frames = torch.rand(5, 10, 10, 4) < 0.5
        >>> dist, value = m.policy_value(frames)
        >>> torch.equal(dist.logits, m.policy(frames).logits), torch.equal(value, m.value(frames))
        (True, True)
        """
        features = self.encoder(frame)
        return Categorical(self.policy_head(features)), self.value_head(features).squeeze(-1).float()


class RecurrentActorCritic(nn.Module):
    """Encoder -> LSTM core -> policy (logits) and value heads; the core's memory ``(h, c)`` is the state of its
    agent, :class:`~rlstruct.algos.policies.RecurrentPolicyAgent`.

    Args:
        obs_shape: one frame's shape (flat or an image).
        n_actions: number of discrete actions.
        hidden_sizes: the MLP encoder's widths; the last is also the core's size.
        obs_dtype: the env's frame dtype (``"uint8"`` pixels are divided by ``obs_high`` in the forward).
        obs_high: the largest value of ``uint8`` frames (``EnvSpec.obs_high``; default 255).
        normalize_observations: the encoder sees the frames through an
            ``ObservationNormalizer`` (``self.normalizer``; ``None`` without;
            flat frames only).

    >>> m = RecurrentActorCritic((2,), 2, (16,))
    >>> h, c = m.initial_state(3, "cpu")
    >>> h, c = m.core_step(torch.zeros(3, 2), h, c, torch.ones(3, dtype=torch.bool))
    >>> [t.shape for t in m.heads(h)]
    [torch.Size([3, 2]), torch.Size([3])]
    """

    def __init__(self, obs_shape: Sequence[int], n_actions: int, hidden_sizes: Sequence[int], *,
                 obs_dtype: str = "float32", obs_high: float | None = None, normalize_observations: bool = False):
        super().__init__()
        self.normalizer = ObservationNormalizer(tuple(obs_shape)) if normalize_observations else None
        self.encoder = make_encoder(obs_shape, hidden_sizes, obs_dtype, obs_high)
        self.core_size = int(hidden_sizes[-1])
        self.core = nn.LSTMCell(self.encoder.out_dim, self.core_size)
        for name, p in self.core.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(p)
            else:
                nn.init.zeros_(p)
        self.policy_head = nn.Linear(self.core_size, n_actions)
        self.value_head = nn.Linear(self.core_size, 1)
        init_orthogonal(self.policy_head, 0.01)
        init_orthogonal(self.value_head, 1.0)

    def initial_state(self, B: int, device: DeviceLike) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory ``(h, c)`` of ``B`` fresh episodes: zeros ``float32 [B, core_size]`` each."""
        z = torch.zeros(B, self.core_size, device=device)
        return z, z.clone()

    def core_step(
        self, frame: torch.Tensor, h: torch.Tensor, c: torch.Tensor, initial: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the core: the memory zeroed on rows where ``initial`` (bool ``[N]``), then updated by
        ``frame [N, ...]``; returns the new ``(h, c)``, ``[N, core_size]`` each."""
        fresh = initial.unsqueeze(-1)
        h, c = h.masked_fill(fresh, 0.0), c.masked_fill(fresh, 0.0)
        if self.normalizer is not None:
            frame = self.normalizer(frame)
        return self.core(self.encoder(frame), (h, c))

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [N, n_actions], value float32 [N])`` of the core's output ``h [N, core_size]``."""
        return self.policy_head(h), self.value_head(h).squeeze(-1).float()


def build_actor_critic(spec: EnvSpec, hidden_sizes: Sequence[int], *, normalize_observations: bool = False,
                       activation: str = "tanh", log_std_init: float = 0.0,
                       ortho_init: bool = True) -> ActorCritic | EncoderActorCritic:
    """The actor-critic for an env: an :class:`ActorCritic` (two MLPs) whose policy head follows ``spec``
    (discrete or continuous actions) for flat observations, an :class:`EncoderActorCritic` (a shared CNN, two
    heads) for images.

    The one place where the algorithms build their policy network from an env's description.

    Args:
        spec: the env's description.
        hidden_sizes: the MLPs' widths.
        normalize_observations: an :class:`ActorCritic` whose inputs are normalised (flat observations only).
        activation: the MLPs' hidden activation, ``"tanh"`` or ``"relu"`` (flat observations only).
        log_std_init: the Gaussian policy's initial log standard deviation (continuous actions only).
        ortho_init: orthogonal initial weights of the MLPs, else torch's default (flat observations only).

    Raises:
        SpaceError: the observation is an image and the actions are continuous, or ``normalize_observations``
            with image observations.
        ConfigError: a network option that the env's network does not have (:func:`check_network_options`).

    >>> from rlstruct.algos import EnvSpec
    >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
    >>> build_actor_critic(spec, (8,)).log_std.shape
    torch.Size([1])
    >>> build_actor_critic(spec, (8,), activation="relu", log_std_init=-2.0).log_std
    Parameter containing:
    tensor([-2.], requires_grad=True)
    >>> type(build_actor_critic(EnvSpec((4, 84, 84), "uint8", 4, 1000), (8,))).__name__
    'EncoderActorCritic'
    """
    check_network_options(spec, activation=activation, log_std_init=log_std_init, ortho_init=ortho_init)
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
    options = {"normalize_observations": normalize_observations, "activation": activation, "ortho_init": ortho_init}
    if spec.discrete:
        return ActorCritic(spec.obs_dim, spec.n_actions, hidden_sizes, **options)
    return ActorCritic(spec.obs_dim, None, hidden_sizes, action_dim=spec.action_dim, log_std_init=log_std_init,
                       **options)


def check_network_options(spec: EnvSpec, *, activation: str = "tanh", log_std_init: float = 0.0,
                          ortho_init: bool = True, recurrent: bool = False) -> None:
    """Refuses an actor-critic option that the env's network does not have: ``activation`` and ``ortho_init`` set
    the MLPs of the feed-forward :class:`ActorCritic` (the CNN of image observations and the LSTM network have their
    own), ``log_std_init`` the Gaussian policy of continuous actions. Their defaults pass everywhere.

    Raises:
        ConfigError: a non-default option for a network without it; the message names the option.

    >>> from rlstruct.algos import EnvSpec
    >>> check_network_options(EnvSpec((4,), "float32", 2, 500), log_std_init=-2.0)
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: log_std_init=-2.0 sets the initial log standard deviation of a Gaussian policy, got \
an env with 2 discrete actions (a categorical policy, which has none); drop --log-std-init
    """
    if recurrent or spec.pixels:
        network = ("the LSTM network (recurrent=True), whose encoder and core have their own" if recurrent else
                   f"image observations of shape {spec.obs_shape}, whose CNN encoder has its own")
        for name, value, default, flag in (("activation", activation, "tanh", "--activation"),
                                           ("ortho_init", ortho_init, True, "--no-ortho-init")):
            if value != default:
                raise ConfigError(f"{name}={value!r} sets the feed-forward actor-critic's MLPs, got {network} "
                                  f"{'activation' if name == 'activation' else 'initialisation'}; drop {flag}")
    if log_std_init != 0.0 and spec.discrete:
        raise ConfigError(f"log_std_init={log_std_init!r} sets the initial log standard deviation of a Gaussian "
                          f"policy, got an env with {spec.n_actions} discrete actions (a categorical policy, which "
                          "has none); drop --log-std-init")


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


def recurrent_actor_critic(spec: EnvSpec, hidden_sizes: Sequence[int], *,
                           normalize_observations: bool = False) -> RecurrentActorCritic:
    """The :class:`RecurrentActorCritic` for ``spec``'s env (its encoder chosen by the observation's shape).

    Raises:
        SpaceError: ``normalize_observations`` with image observations.
    """
    check_normalizable(spec, normalize_observations)
    return RecurrentActorCritic(spec.obs_shape, spec.n_actions, hidden_sizes, obs_dtype=spec.obs_dtype,
                                obs_high=spec.obs_high, normalize_observations=normalize_observations)


def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source``, every parameter in place (one fused call).

    >>> a, b = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    >>> _ = a.weight.data.fill_(0.0), b.weight.data.fill_(1.0)
    >>> polyak_update(a, b, 0.25); float(a.weight)
    0.25
    """
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def make_adam(model: nn.Module, lr: float, device: DeviceLike, eps: float = 1e-8) -> Adam:
    """:class:`~rlstruct.algos.networks.Adam` over the model's parameters, with epsilon ``eps``; the fused kernel
    where torch has one (CPU, CUDA)."""
    fused = as_device(device).type in ("cpu", "cuda")
    return Adam(model.parameters(), lr=lr, eps=eps, fused=fused or None)
