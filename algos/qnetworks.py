"""The Q-networks: those DQN and PQN share (an MLP or a CNN, with a dueling head or LayerNorm, the epsilon-greedy agent
that runs them in the batchers, its linear epsilon schedule and its evaluation ``agent_info``), and the twin critics
``Q(s, a)`` of continuous actions that SAC and TD3 share, evaluated as one ensemble.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos.encoders import CNNEncoder
from rlstruct.algos.network_factories import network_model
from rlstruct.algos.networks import autocast_context, mlp
from rlstruct.algos.policies import NetworkAgent, row_invariant
from rlstruct.devices import DeviceLike
from rlstruct.structures import DictTensor

__all__ = ["dueling_q", "QNetwork", "PixelQNetwork", "q_network", "EnsembleLinear", "TwinQNetwork", "QAgent",
           "create_q_agent", "epsilon_at", "evaluation_info"]


def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """The dueling aggregation (Wang et al. 2016, eq. 9): ``Q = V + A - mean_a(A)``.

    Subtracting the mean advantage makes ``V`` and ``A`` identifiable: ``mean_a Q(s, a) = V(s)``.

    Args:
        value: ``float [N, 1]``, the state values.
        advantage: ``float [N, A]``, the advantages.

    Returns:
        ``float [N, A]``, the Q-values.

    >>> dueling_q(torch.tensor([[1.0]]), torch.tensor([[0.0, 2.0]]))
    tensor([[0., 2.]])
    """
    return value + advantage - advantage.mean(-1, keepdim=True)


class QNetwork(nn.Module):
    """An MLP from a flat observation to one Q-value per action, with an optional dueling head.

    Without ``dueling`` the last hidden layer feeds one linear layer of ``n_actions`` outputs; with it, the
    hidden layers but the last are a shared trunk feeding two streams, each with its own last hidden layer:
    a value stream (1 output) and an advantage stream (``n_actions`` outputs), aggregated by :func:`dueling_q`.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions.
        hidden_sizes: hidden layer widths.
        dueling: use the dueling head.
        layer_norm: a LayerNorm after each hidden layer, before its activation (PQN's network; without ``dueling``).
        activation: the hidden activation, ``"tanh"`` or ``"relu"`` (without ``dueling``).

    >>> QNetwork(4, 2, (8,))(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    >>> QNetwork(4, 2, (8,), dueling=True)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int], *, dueling: bool = False,
                 layer_norm: bool = False, activation: str = "tanh"):
        super().__init__()
        self.dueling = dueling
        if dueling:
            # As in Wang et al. (2016, figure 1), each stream has its own last hidden layer.
            *shared, last = hidden_sizes
            self.trunk = nn.Sequential(*mlp(obs_dim, shared[:-1], shared[-1]), nn.Tanh()) if shared else nn.Identity()
            width = shared[-1] if shared else obs_dim
            self.value = mlp(width, (last,), 1)
            self.advantage = mlp(width, (last,), n_actions)
        else:
            self.q = mlp(obs_dim, hidden_sizes, n_actions, layer_norm=layer_norm, activation=activation)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, n_actions]`` of observations ``[N, obs_dim]`` of any dtype."""
        frame = frame.float()
        if self.dueling:
            h = self.trunk(frame)
            return dueling_q(self.value(h), self.advantage(h))
        return self.q(frame)


class PixelQNetwork(nn.Module):
    """The Q-network of image observations: the CNN of :class:`~rlstruct.algos.encoders.CNNEncoder` (Nature-DQN
    for Atari frames, MinAtar's for small ones) and a linear head, or a dueling one.

    Frames arrive as the env gives them (``uint8`` from the batcher and from
    :meth:`~rlstruct.algos.replay.ReplayBuffer.sample`); the encoder scales ``uint8`` envs' pixels by 1/255
    whether they arrive as ``uint8`` or as floats.

    Args:
        obs_shape: one frame's shape (``[C, H, W]`` or ``[H, W, C]``).
        n_actions: number of discrete actions.
        obs_dtype: the env's frame dtype.
        obs_high: the largest value of ``uint8`` frames (``EnvSpec.obs_high``; default 255).
        dueling: use the dueling head.
        layer_norm: a LayerNorm before each ReLU of the CNN (PQN's network).

    >>> PixelQNetwork((4, 84, 84), 4, obs_dtype="uint8")(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 4])
    """

    def __init__(self, obs_shape: Sequence[int], n_actions: int, *, obs_dtype: str = "uint8",
                 obs_high: float | None = None, dueling: bool = False, layer_norm: bool = False):
        super().__init__()
        self.dueling = dueling
        self.encoder = CNNEncoder(obs_shape, obs_dtype=obs_dtype, obs_high=obs_high, layer_norm=layer_norm)
        width = self.encoder.out_dim
        if dueling:
            self.value = mlp(width, (), 1)
            self.advantage = mlp(width, (), n_actions)
        else:
            self.q = mlp(width, (), n_actions)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, n_actions]`` of frames ``[N, *obs_shape]``."""
        h = self.encoder(frame)
        if self.dueling:
            return dueling_q(self.value(h), self.advantage(h))
        return self.q(h)


def q_network(spec: EnvSpec, hidden_sizes: Sequence[int], *, dueling: bool = False, layer_norm: bool = False,
              activation: str = "tanh") -> QNetwork | PixelQNetwork:
    """The Q-network for ``spec``'s env: :class:`PixelQNetwork` (with ``layer_norm``) for images, :class:`QNetwork`
    (an MLP, with ``layer_norm`` and ``activation``) otherwise.

    >>> from rlstruct.algos import EnvSpec
    >>> type(q_network(EnvSpec((10, 10, 4), "bool", 3, 1000), (64,))).__name__
    'PixelQNetwork'
    """
    if spec.pixels:
        return PixelQNetwork(spec.obs_shape, spec.n_actions, obs_dtype=spec.obs_dtype, obs_high=spec.obs_high,
                             dueling=dueling, layer_norm=layer_norm)
    return QNetwork(spec.obs_dim, spec.n_actions, hidden_sizes, dueling=dueling, layer_norm=layer_norm,
                    activation=activation)


class EnsembleLinear(nn.Module):
    """``n`` independent affine maps applied together, one batched matmul: ``y[k] = x[k] @ weight[k].T + bias[k]``.

    Each member's weight and bias are laid out as :class:`torch.nn.Linear`'s, stacked on a first dim of ``n``.

    Args:
        members: the ``nn.Linear`` maps to stack (their current weights are copied).

    >>> layer = EnsembleLinear([nn.Linear(3, 4), nn.Linear(3, 4)])
    >>> layer(torch.zeros(2, 5, 3)).shape, layer.weight.shape
    (torch.Size([2, 5, 4]), torch.Size([2, 4, 3]))
    """

    def __init__(self, members: Sequence[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in members]))
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in members]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``float [n, N, out]`` of inputs ``[n, N, in]`` (one input per member; an expanded view shares one)."""
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))


class TwinQNetwork(nn.Module):
    """``n_critics`` independent ReLU MLPs ``Q(s, a)``, evaluated together as one ensemble: each layer of every
    critic in one batched matmul (:class:`EnsembleLinear`), so a forward costs a few large ops instead of a few per
    critic.

    The critics are initialised as ``n_critics`` separate ``nn.Linear`` MLPs built one after the other (the same
    draws from torch's generator), and :meth:`stack_state_dict` reads the state of that separate layout
    (``critics.{k}.{2 * layer}.weight``), which ``load_state_dict`` accepts too.

    Args:
        obs_dim: observation size.
        action_dim: action size.
        hidden_sizes: hidden widths.
        n_critics: number of critics (2 for SAC's and TD3's clipped double Q).

    >>> TwinQNetwork(3, 1, (8, 8))(torch.zeros(5, 3), torch.zeros(5, 1)).shape
    torch.Size([2, 5])
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int], n_critics: int = 2):
        super().__init__()
        self.n_critics = n_critics
        sizes = [obs_dim + action_dim, *hidden_sizes, 1]
        separate = [[nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])] for _ in range(n_critics)]
        self.layers = nn.ModuleList(EnsembleLinear(members) for members in zip(*separate))
        self.register_load_state_dict_pre_hook(_load_separate_layout)

    def forward(self, frame: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q-values ``[n_critics, N]`` of observations ``[N, obs_dim]`` and actions ``[N, action_dim]``."""
        x = torch.cat([frame.float(), action.float()], -1)
        x = x.unsqueeze(0).expand(self.n_critics, *x.shape)
        *hidden, last = self.layers  # a ModuleList slice would build a new ModuleList each forward
        for layer in hidden:
            x = layer(x).relu_()  # in place: baddbmm's backward does not read its output
        return last(x).squeeze(-1)

    @staticmethod
    def stack_state_dict(state: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
        """``state`` with the separate critics' keys (``{prefix}critics.{k}.{2 * j}.weight``, ``.bias``) stacked into
        the ensemble's (``{prefix}layers.{j}.weight``, ``.bias``); other keys as they are.

        >>> old = {"critics.0.0.weight": torch.zeros(4, 3), "critics.1.0.weight": torch.ones(4, 3)}
        >>> TwinQNetwork.stack_state_dict(old)["layers.0.weight"].shape
        torch.Size([2, 4, 3])
        """
        pattern = re.compile(re.escape(prefix) + r"critics\.(\d+)\.(\d+)\.(weight|bias)$")
        out: dict[str, torch.Tensor] = {}
        members: dict[str, dict[int, torch.Tensor]] = {}
        for key, value in state.items():
            match = pattern.match(key)
            if match is None:
                out[key] = value
            else:
                critic, index, name = match.groups()
                members.setdefault(f"{prefix}layers.{int(index) // 2}.{name}", {})[int(critic)] = value
        for key, by_critic in members.items():
            out[key] = torch.stack([by_critic[k] for k in sorted(by_critic)])
        return out


def _load_separate_layout(module: TwinQNetwork, state: dict[str, Any], prefix: str, *args: Any) -> None:
    # Checkpoints written before the ensemble hold one nn.Sequential per critic; load_state_dict hands this hook the
    # dict it will read, so stacking in place keeps them loading.
    if any(key.startswith(prefix + "critics.") for key in state):
        stacked = module.stack_state_dict(state, prefix)
        state.clear()
        state.update(stacked)


class QAgent(NetworkAgent):
    """Epsilon-greedy over a :class:`QNetwork`; ``agent_info["epsilon"]`` (float, one per env) sets the rate.

    Without the key the agent is greedy. Randomness comes from the agent's :attr:`~NetworkAgent.noise` (its
    generator seeded by the batcher's ``agent_seeds``, or counter-based draws with a batcher's one seed).

    Args:
        model: the Q network, on ``device``.
        device: where observations come from and actions go.
        autocast: see :class:`~rlstruct.algos.policies.NetworkAgent`.
        record_max_q: also return ``max_q``, ``max_a Q(s, a)`` (``float32 [N]``), whatever the action taken: PQN's
            learner takes its targets' next values from it (:func:`~rlstruct.algos.policies.next_of_collection`).
    """

    model: QNetwork

    def __init__(self, model: nn.Module, device: DeviceLike, *, autocast: torch.dtype | None = None,
                 record_max_q: bool = False):
        super().__init__(model, device, autocast=autocast)
        self.record_max_q = record_max_q

    def __call__(self, state, observation, agent_info, history=None):
        """``action int64 [N]``: uniform with probability ``epsilon``, else the argmax of the Q-values (and
        ``max_q float32 [N]`` with ``record_max_q``)."""
        with autocast_context(self.device, self.autocast):
            q = row_invariant(self.model, observation["frame"].shape[0], observation["frame"])
        action = q.argmax(-1)
        out = {"action": action}
        if self.record_max_q:
            out["max_q"] = q.float().amax(-1)
        if "epsilon" in agent_info:
            eps = self._on_device(agent_info["epsilon"], "epsilon")
            B, n_actions = q.shape
            explore = self.noise.uniform((B,)) < eps
            random_action = self.noise.integers(n_actions, (B,), stream=1)
            out["action"] = torch.where(explore, random_action, action)
            self.noise.advance()
        return DictTensor(out), state

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """``(action,)``: the argmax of the Q-values (see
        :meth:`~rlstruct.algos.policies.NetworkAgent.deterministic`)."""
        return (self.model(frame).argmax(-1),)


def create_q_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False, *,
    dueling: bool = False, layer_norm: bool = False, activation: str = "tanh", autocast: torch.dtype | None = None,
    record_max_q: bool = False, network: str | None = None,
) -> RL_Agent:
    """Builds a batcher's :class:`QAgent` for ``spec``'s env on ``device`` (module level, so it pickles;
    ``functools.partial(create_q_agent, dueling=True)`` too); the network's options are :func:`q_network`'s, its
    forward runs under ``autocast`` (see :class:`~rlstruct.algos.networks.NetworkAgent`), and ``record_max_q`` is
    :class:`QAgent`'s; ``network`` (``"MODULE:CALLABLE"``) builds the model with that factory instead."""
    model = (network_model(network, spec) if network is not None else
             q_network(spec, hidden_sizes, dueling=dueling, layer_norm=layer_norm, activation=activation)).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = QAgent(model, device, autocast=autocast, record_max_q=record_max_q)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def epsilon_at(env_steps: int, start: float, end: float, decay_steps: int) -> float:
    """Linear decay from ``start`` to ``end`` over ``decay_steps`` env steps, then constant.

    >>> epsilon_at(0, 1.0, 0.1, 100), epsilon_at(50, 1.0, 0.1, 100), epsilon_at(500, 1.0, 0.1, 100)
    (1.0, 0.55, 0.1)
    """
    if env_steps >= decay_steps:
        return end
    return start + env_steps / decay_steps * (end - start)


def evaluation_info(config: Mapping[str, Any], sample: bool) -> dict[str, bool | float]:
    """The evaluation ``agent_info`` of a Q-learning run (DQN, PQN): the argmax, or epsilon-greedy with ``epsilon_end``
    when ``sample``.

    >>> evaluation_info({"epsilon_end": 0.05}, True), evaluation_info({"epsilon_end": 0.05}, False)
    ({'epsilon': 0.05}, {'epsilon': 0.0})
    """
    return {"epsilon": float(config["epsilon_end"]) if sample else 0.0}
