"""Recurrent policies: an LSTM actor-critic, its batcher agent, and the replay of an acquisition window.

The network (:class:`RecurrentActorCritic`) is an encoder (:func:`~rlstruct.algos.encoders.make_encoder`: the MLP
or the CNN), an ``nn.LSTMCell`` core, and policy and value heads on the core's output. Its memory ``(h, c)``
is the agent state of :class:`RecurrentPolicyAgent`: the batcher keeps it between ``execute`` calls and stores
the state at the start of every acquisition under ``info["agent_state/h"]`` and ``info["agent_state/c"]``
(rlstructures' recurrent A2C carried its RNN state the same way). The agent zeroes the rows where an episode
starts (``observation["initial_state"]``), so that the memory never leaks across episodes of an auto-reset env.

The learner replays the window (:func:`replay_window`) with :func:`~rlstruct.agents.replay_agent`: from the
stored state at the window's first step, through time, with the same resets, batched over the envs (the only
Python loop is over the T steps). The log-probabilities it recomputes are the batcher's, bit for bit, for the same
weights and batch; the values of the next observations (``_observation/frame``, the terminal one at an episode's end)
come from one more batched core step from each step's memory. Gradients flow through the whole window
(truncated back-propagation through time over ``T`` steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice, replay_agent, replay_agent_stateless
from rlstruct.algos.encoders import make_encoder
from rlstruct.algos.networks import Categorical, NetworkAgent, autocast_context, check_normalizable
from rlstruct.algos.normalization import ObservationNormalizer
from rlstruct.devices import DeviceLike
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

if TYPE_CHECKING:
    from rlstruct.algos._train.env_spec import EnvSpec

__all__ = [
    "RecurrentActorCritic",
    "RecurrentPolicyAgent",
    "recurrent_actor_critic",
    "create_recurrent_agent",
    "replay_window",
    "replay_learner",
]


class RecurrentActorCritic(nn.Module):
    """Encoder -> LSTM core -> policy and value heads.

    Args:
        obs_shape: one frame's shape (flat or an image).
        n_actions: number of discrete actions.
        hidden_sizes: the MLP encoder's widths; the last is also the core's size.
        obs_dtype: the env's frame dtype (``"uint8"`` pixels are divided by ``obs_high`` in the forward).
        obs_high: the largest value of ``uint8`` frames (``EnvSpec.obs_high``; default 255).
        normalize_observations: the encoder sees the frames through an
            :class:`~rlstruct.algos.normalization.ObservationNormalizer` (``self.normalizer``; ``None`` without;
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
        nn.init.orthogonal_(self.policy_head.weight, 0.01)
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        nn.init.zeros_(self.policy_head.bias)
        nn.init.zeros_(self.value_head.bias)

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


class RecurrentPolicyAgent(NetworkAgent):
    """The batchers' agent of a :class:`RecurrentActorCritic`: its state is the core's memory.

    ``__call__`` resets the memory where ``observation["initial_state"]``, steps the core, and samples an
    action (the most likely one where ``agent_info["stochastic"]`` is false); it returns ``action int64 [B]``
    and ``log_prob float [B]`` (stored under ``action/*``, as :class:`~rlstruct.algos.networks.PolicyAgent`'s),
    and the state ``{"h", "c"}`` ``[B, core_size]``.
    :meth:`call_replay` recomputes step ``t`` of stored trajectories with gradients, for
    :func:`~rlstruct.agents.replay_agent`.

    Args:
        model: the network, on ``device``.
        device: where observations come from and actions go.

    >>> from rlstruct import RL_Batcher
    >>> from rlstruct.envs import CartPoleNoVel
    >>> agent_args = {"model": RecurrentActorCritic((2,), 2, (8,)), "device": "cpu"}
    >>> with RL_Batcher(4, RecurrentPolicyAgent, agent_args, CartPoleNoVel, {"n_envs": 3, "autoreset": True},
    ...                 0, [0]) as b:
    ...     b.reset(); b.execute(); traj, _ = b.get()
    >>> traj.info["agent_state/h"].shape, traj.trajectories["action/log_prob"].shape
    (torch.Size([3, 8]), torch.Size([3, 4]))
    """

    model: RecurrentActorCritic

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:
        """Zero memory ``{"h", "c"}``, ``float32 [B, core_size]`` each, on the agent's device."""
        h, c = self.model.initial_state(B, self.device)
        return DictTensor({"h": h, "c": c})

    def __call__(self, state, observation, agent_info, history=None):
        """One step: ``({"action", "log_prob"}, {"h", "c"})`` for ``B`` running envs."""
        with autocast_context(self.device, self.autocast):
            h, c = self.model.core_step(observation["frame"], state["h"], state["c"], observation["initial_state"])
            logits = self.model.heads(h)[0]
        h, c = h.float(), c.float()  # the memory the buffer holds stays float32 under autocast
        dist = Categorical(logits)
        action = dist.sample(self.generator)
        if "stochastic" in agent_info:
            action = torch.where(self._on_device(agent_info["stochastic"]), action, dist.mode())
        return DictTensor({"action": action, "log_prob": dist.log_prob(action)}), DictTensor({"h": h, "c": c})

    def call_replay(self, trajectories: Trajectories, t: int, state: DictTensor | None):
        """Step ``t`` with gradients: ``log_prob [B]`` of the stored action, ``entropy [B]``, ``value [B]`` and the
        memory after the step ``h, c [B, core_size]``; the state at ``t == 0`` is the one stored at the window's
        start."""
        if state is None:
            state = trajectories.info.truncate_key("agent_state/")
        tt = trajectories.trajectories
        h, c = self.model.core_step(tt["observation/frame"][:, t], state["h"], state["c"],
                                    tt["observation/initial_state"][:, t])
        logits, value = self.model.heads(h)
        dist = Categorical(logits)
        out = {"log_prob": dist.log_prob(tt["action/action"][:, t]), "entropy": dist.entropy(), "value": value,
               "h": h, "c": c}
        return DictTensor(out), DictTensor({"h": h, "c": c})


def replay_window(
    agent: RL_Agent, model: RecurrentActorCritic, trajectories: Trajectories, *, bootstrap: bool = True
) -> TemporalDictTensor:
    """Replays an acquisition window through the recurrent agent, with gradients: what the losses need.

    Steps ``agent.call_replay`` through the ``T`` steps with :func:`~rlstruct.agents.replay_agent` (from
    ``info["agent_state/*"]``, resetting where ``observation/initial_state``), then computes the values of the
    next observations in one batched core step over the ``B * T`` rows, from each step's memory.

    Args:
        agent: a :class:`RecurrentPolicyAgent` over ``model`` (or it wrapped in ``RL_Agent_CheckDevice``).
        model: its network (for the batched bootstrap step).
        trajectories: ``B`` windows of ``T`` steps from a batcher, on the model's device.
        bootstrap: also compute ``next_value`` (PPO's minibatches, whose targets are fixed, do without).

    Returns:
        ``TemporalDictTensor [B, T]`` of ``log_prob`` (of the stored actions), ``entropy``, ``value`` and
        ``next_value`` (``V(_observation/frame)`` after the step's memory: the terminal observation's value at an
        episode's end; only with ``bootstrap``): the keys of :meth:`~rlstruct.algos.networks.PolicyAgent.replay_batch`,
        for the same losses.

    >>> from rlstruct import RL_Batcher
    >>> from rlstruct.envs import CartPoleNoVel
    >>> model = RecurrentActorCritic((2,), 2, (8,))
    >>> with RL_Batcher(5, RecurrentPolicyAgent, {"model": model, "device": "cpu"}, CartPoleNoVel,
    ...                 {"n_envs": 3, "autoreset": True}, 0, [0]) as b:
    ...     b.reset(); b.execute(); traj, _ = b.get()
    >>> out = replay_window(RecurrentPolicyAgent(model, "cpu"), model, traj)
    >>> torch.equal(out["log_prob"], traj.trajectories["action/log_prob"]), out["next_value"].shape
    (True, torch.Size([3, 5]))
    """
    out = replay_agent(agent, trajectories, "call_replay")
    keys = ("log_prob", "entropy", "value")
    if not bootstrap:
        return TemporalDictTensor({k: out[k] for k in keys}, out.lengths)
    tt = trajectories.trajectories
    B, T = out["value"].shape
    nxt = tt["_observation/frame"].flatten(0, 1)
    # The next observation continues the same episode: no reset before it (it is the terminal one at an end).
    keep = torch.zeros(B * T, dtype=torch.bool, device=nxt.device)
    h, _ = model.core_step(nxt, out["h"].flatten(0, 1), out["c"].flatten(0, 1), keep)
    next_value = model.heads(h)[1].unflatten(0, (B, T))
    return TemporalDictTensor({**{k: out[k] for k in keys}, "next_value": next_value}, out.lengths)


def recurrent_actor_critic(spec: EnvSpec, hidden_sizes: Sequence[int], *,
                           normalize_observations: bool = False) -> RecurrentActorCritic:
    """The :class:`RecurrentActorCritic` for ``spec``'s env (its encoder chosen by the observation's shape).

    Raises:
        SpaceError: ``normalize_observations`` with image observations.
    """
    check_normalizable(spec, normalize_observations)
    return RecurrentActorCritic(spec.obs_shape, spec.n_actions, hidden_sizes, obs_dtype=spec.obs_dtype,
                                obs_high=spec.obs_high, normalize_observations=normalize_observations)


def create_recurrent_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    autocast: torch.dtype | None = None, normalize_observations: bool = False,
) -> RL_Agent:
    """Builds a batcher's :class:`RecurrentPolicyAgent` for ``spec``'s env on ``device`` (module level, so it
    pickles). Its weights are random until the first ``batcher.update``; its forward runs under ``autocast``
    (see :class:`~rlstruct.algos.networks.NetworkAgent`); with ``check_device`` it is wrapped in
    :class:`~rlstruct.agents.RL_Agent_CheckDevice`."""
    model = recurrent_actor_critic(spec, hidden_sizes, normalize_observations=normalize_observations).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = RecurrentPolicyAgent(model, device, autocast=autocast)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def replay_learner(agent: RL_Agent, model: nn.Module, trajectories: Trajectories, *, recurrent: bool,
                   checked: bool):
    """The learner's outputs over ``trajectories`` (``log_prob``, ``entropy``, ``value``, ``next_value``, each
    ``[B, T]``), as A2C and PPO compute them: a recurrent model's window replayed from its stored first state
    (:func:`replay_window`); step by step through ``replay_agent`` when ``agent`` is an
    :class:`~rlstruct.agents.RL_Agent_CheckDevice` (``checked``), which checks every step's devices; else the
    agent's one-forward ``replay_batch``.
    """
    if recurrent:
        return replay_window(agent, model, trajectories)
    if checked:
        return replay_agent(agent, trajectories)
    return replay_agent_stateless(agent, trajectories, "replay_batch")
