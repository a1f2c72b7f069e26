"""The agents the batchers run for the algorithms, and the learner's replay of their networks.

:class:`NetworkAgent` is the base of every agent of ``rlstruct.algos`` (DQN's and SAC's too). :class:`PolicyAgent`
runs an actor-critic of :mod:`rlstruct.algos.networks`, :class:`RecurrentPolicyAgent` the LSTM one, whose memory is
the agent state the batcher carries (stored at each acquisition's start under ``info["agent_state/*"]``). What a
policy agent writes under ``action/*``:

* ``action/action``: what the env receives: ``int64 [B, T]``, or ``float32 [B, T, D]`` clipped to the env's bounds;
* ``action/raw`` (continuous only): the unclipped sample, whose log-probability the losses take;
* ``action/log_prob``: ``log pi(raw | s)`` under the weights that acted, ``float32 [B, T]``;
* ``action/value`` (a model whose ``value_at_acting`` is true: heads on one shared encoder): ``V(s)`` under the
  weights that acted, ``float32 [B, T]``, one more head on the features the policy's forward computed anyway. PPO's
  learner takes its values from it (:func:`next_of_collection`) instead of running the critic again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice, replay_agent, replay_agent_stateless
from rlstruct.algos._noise import CounterNoise, GeneratorNoise, NoiseSource
from rlstruct.algos.distributions import Categorical
from rlstruct.algos.network_factories import network_model
from rlstruct.algos.networks import (
    ActorCritic,
    RecurrentActorCritic,
    autocast_context,
    build_actor_critic,
    recurrent_actor_critic,
)
from rlstruct.devices import DeviceLike, as_device
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

if TYPE_CHECKING:
    from rlstruct.algos import EnvSpec

__all__ = [
    "row_invariant",
    "next_of_collection",
    "NetworkAgent",
    "PolicyAgent",
    "RecurrentPolicyAgent",
    "replay_window",
    "create_policy_agent",
    "create_recurrent_agent",
    "critic_values",
    "policy_actions",
]


#: the agents run their networks over a multiple of this many rows (zero rows appended)
ROW_TILE = 16


def row_invariant(fn: Callable[..., Any], n_rows: int, *tensors: torch.Tensor | None) -> Any:
    """``fn(*tensors)`` over ``n_rows`` rows, computed on the rows padded with zeros to a multiple of :data:`ROW_TILE`
    and cut back to ``n_rows``: outputs (a tensor, or a tuple or dict of them).

    A matrix product's rows are not the same bits whatever the number of rows: the CPU kernels compute the last
    rows of a tile in another order than full tiles. Padded, every row goes through full tiles, so that a row's
    output depends on the row alone, and an env's actions and log-probabilities are the same bits whether its
    process steps 2 envs or 64.

    >>> lin = nn.Linear(8, 8)
    >>> x = torch.randn(6, 8)
    >>> torch.equal(row_invariant(lin, 6, x)[4:], row_invariant(lin, 2, x[4:]))
    True
    """
    pad = -n_rows % ROW_TILE
    if pad:
        tensors = tuple(None if t is None else torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) for t in tensors)
    out = fn(*tensors)
    if not pad:
        return out
    if isinstance(out, dict):
        return {k: v[:n_rows] for k, v in out.items()}
    if isinstance(out, tuple):
        return tuple(v[:n_rows] for v in out)
    return out[:n_rows]


class NetworkAgent(RL_Agent):
    """The part every batcher agent of ``algos`` shares: one network on ``device`` and its source of randomness.

    The agent draws from :attr:`noise`: its own generator, seeded by :meth:`seed` (a batcher's per-worker
    ``agent_seeds``), or, once :meth:`seed_envs` is called (a batcher with one seed), counter-based draws keyed by
    ``(seed, global env index, step)``, the same whatever process steps the env. :meth:`update` loads the learner's
    weights; :meth:`_on_device` copies a per-env ``agent_info`` tensor to the device once per acquisition.

    Args:
        model: the network, on ``device``.
        device: where observations come from and actions go.
        autocast: the dtype the agents (:class:`PolicyAgent`, the recurrent one, the Q agent) run their forward
            in, under ``torch.autocast`` (``None``: the weights' own; see
            :func:`~rlstruct.algos.networks.autocast_context`); the distributions and what they return stay float32.
    """

    def __init__(self, model: nn.Module, device: DeviceLike, *, autocast: torch.dtype | None = None):
        self.model = model
        self.device = as_device(device)
        self.autocast = autocast
        self.generator = torch.Generator(device=self.device)
        self.noise: NoiseSource = GeneratorNoise(self.generator)
        self._infos: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def seed(self, seed: int) -> None:
        """Seeds the sampling generator (the batcher passes its ``agent_seeds``), and draws from it."""
        self.generator.manual_seed(seed)
        self.noise = GeneratorNoise(self.generator)

    def seed_envs(self, seed: int, env_index: int) -> None:
        """Draws for row ``j`` at the agent's ``t``-th call from ``(seed, env_index + j, t)``
        (:class:`~rlstruct.algos._noise.CounterNoise`)."""
        self.noise = CounterNoise(seed, env_index, self.device)

    def update(self, state_dict: Any) -> None:
        """Loads the learner's weights."""
        self.model.load_state_dict(state_dict)

    def noise_state(self) -> torch.Tensor:
        """Where :attr:`noise` stands: the counter-based draws' step, or the generator's state."""
        return self.noise.get_state()

    def set_noise_state(self, state: torch.Tensor) -> None:
        """Takes back a :meth:`noise_state`."""
        self.noise.set_state(state)

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The greedy action of frames ``[N, *obs]`` (what the greedy ``agent_info`` acts), and a recurrent agent's
        next memory from ``state``: a function of its tensors only, which :mod:`torch.export` and
        :func:`torch.jit.trace` record (``rlstruct export``)."""
        raise NotImplementedError(f"{type(self).__name__} has no deterministic policy to export")

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

    A step draws its noise from :attr:`~NetworkAgent.noise` first (uniform for a categorical, standard normal for
    a Gaussian), then computes the rest from it (:meth:`step`: the forward, the draw, the mode where not
    stochastic, the log-probability, the clipping): with ``compile``, that function is compiled by ``torch.compile``
    (its elementwise work fused; a generator inside would split it), the same actions up to floating-point rounding.

    Args:
        model: the :class:`~rlstruct.algos.networks.ActorCritic`, on ``device``.
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
        self._step = torch.compile(self.step) if compile else self.step

    def _stochastic(self, agent_info: DictTensor) -> torch.Tensor | None:
        if "stochastic" not in agent_info:
            return None
        return self._on_device(agent_info["stochastic"])

    def __call__(self, state, observation, agent_info, history=None):
        """``action`` (``int64 [N]``, or ``float32 [N, D]`` within the bounds), ``raw`` (continuous only) and
        ``log_prob float32 [N]``, and ``value float32 [N]`` where the model's ``value_at_acting`` is true."""
        frame = observation["frame"]
        shape = (frame.shape[0], self.model.policy_dim)
        noise = self.noise.normal(shape) if self.model.continuous else self.noise.uniform(shape)
        self.noise.advance()
        out = row_invariant(self._step, frame.shape[0], frame, noise, self._stochastic(agent_info))
        return DictTensor(out), state

    def step(self, frame: torch.Tensor, noise: torch.Tensor,
             stochastic: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """What :meth:`__call__` returns for frames ``[N, *obs]``, from its noise ``float32 [N, A or D]`` and
        ``stochastic`` (``bool [N]``, or ``None``: every row samples); a function of its tensors only."""
        value = None
        with autocast_context(self.device, self.autocast):
            if getattr(self.model, "value_at_acting", False):
                dist, value = self.model.policy_value(frame)
            else:
                dist = self.model.policy(frame)
        action = dist.sample_from(noise)
        if stochastic is not None:
            where = stochastic.unsqueeze(-1) if self.model.continuous else stochastic
            action = torch.where(where, action, dist.mode())
        out = {"action": action, "log_prob": dist.log_prob(action)}
        if value is not None:
            out["value"] = value
        if self.model.continuous:
            out["raw"] = action
            out["action"] = self._clip(action)
        return out

    def _clip(self, action: torch.Tensor) -> torch.Tensor:
        """A continuous action clipped to the bounds (as it is without them)."""
        return action if self._low is None else torch.maximum(torch.minimum(action, self._high), self._low)

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """``(action,)``: the distribution's mode, clipped to the bounds (see :meth:`NetworkAgent.deterministic`).

        >>> agent = PolicyAgent(ActorCritic(3, None, (8,), action_dim=1), "cpu", action_low=[-1.0], action_high=[1.0])
        >>> agent.deterministic(torch.zeros(5, 3))[0].shape
        torch.Size([5, 1])
        """
        action = self.model.policy(frame).mode()
        return (self._clip(action) if self.model.continuous else action,)

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
    """``log_prob``, ``entropy``, ``value`` and ``next_value``, each ``[B, T]``, of an actor-critic over frames,
    next frames and actions ``[B, T, ...]`` (:func:`policy_actions`): :meth:`PolicyAgent.replay_batch` on tensors."""
    B, T = frame.shape[:2]
    out = _step_outputs(model, frame.flatten(0, 1), next_frame.flatten(0, 1), action.flatten(0, 1))
    return {k: v.unflatten(0, (B, T)) for k, v in out.items()}


def critic_values(model: nn.Module, frame: torch.Tensor, next_frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V(frame), V(next_frame))``, each ``float32 [N]``, of an actor-critic over rows ``[N, *obs]``: one forward
    of the critic over both together, none of the policy.

    >>> v, nv = critic_values(ActorCritic(4, 2, (8,)), torch.zeros(3, 4), torch.ones(3, 4))
    >>> v.shape, nv.shape
    (torch.Size([3]), torch.Size([3]))
    """
    values = model.value(torch.cat([frame, next_frame]))
    n = frame.shape[0]
    return values[:n], values[n:]


def next_of_collection(recorded: torch.Tensor, tt: TemporalDictTensor,
                       evaluate: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A quantity of ``_observation/frame`` (``[B, T]``) from the same quantity of ``observation/frame`` that the agent
    recorded as it acted (``recorded [B, T]``: PPO's ``V(s)``, PQN's ``max_a Q(s, a)``): its next column wherever the
    frame reached at ``t`` is the frame acted on at ``t + 1`` (the step did not end the episode), and ``evaluate``
    (the network on frames ``[M, *obs]``, giving ``[M]``) on the others alone: a row's last valid step, and each
    episode's final frame, from which a truncated step bootstraps. The numbers of ``evaluate`` over every next
    frame, for a forward on a few frames instead of ``B T``.

    >>> from rlstruct.algos.networks import EncoderActorCritic
    >>> m = EncoderActorCritic((10, 10, 4), 3, (16,), obs_dtype="bool")
    >>> frames = torch.rand(2, 4, 10, 10, 4) < 0.5
    >>> done = torch.tensor([[False, True, False, False], [False] * 4])
    >>> next_frames = torch.cat([frames[:, 1:], torch.rand(2, 1, 10, 10, 4) < 0.5], 1)
    >>> next_frames[0, 1] = torch.rand(10, 10, 4) < 0.5  # the episode's final frame; frames[0, 2] is a reset's
    >>> with torch.no_grad():
    ...     v, nv = critic_values(m, frames.flatten(0, 1), next_frames.flatten(0, 1))
    ...     tt = TemporalDictTensor({"observation/frame": frames, "_observation/frame": next_frames,
    ...                              "_observation/done": done})
    ...     next_values = next_of_collection(v.view(2, 4), tt, m.value)
    >>> torch.allclose(next_values, nv.view(2, 4), atol=1e-6)
    True
    """
    valid = tt.mask() > 0
    fresh = tt["_observation/done"].clone()
    fresh[:, -1] = True
    fresh[:, :-1] |= ~valid[:, 1:]
    rows = fresh.nonzero(as_tuple=True)
    out = torch.empty_like(recorded)
    out[:, :-1] = recorded[:, 1:]
    out[rows] = evaluate(tt["_observation/frame"][rows]).to(recorded.dtype)
    return out


def trajectory_outputs(model: nn.Module, tt: TemporalDictTensor) -> dict[str, torch.Tensor]:
    """``log_prob``, ``entropy``, ``value`` and ``next_value``, each ``[B, T]``, of an actor-critic over trajectories
    ``tt`` (auto-reset, as a batcher gives them), the learner's own: one pass of the model over the frames acted on
    (``policy_value``: a shared encoder once, for both heads), and the critic, without gradient, on the next frames
    that are not the next step's frame alone (:func:`next_of_collection`: each row's last step, each episode's final
    frame); ``next_value`` is a target. The numbers of :func:`actor_critic_outputs` up to float rounding, for a third
    of its encoder's work where the heads share one (two passes over ``B T`` frames and one over ``B T`` next frames
    there, backward through all three).

    >>> m = ActorCritic(4, 2, (8,))
    >>> frames, ends = torch.randn(3, 5, 4), torch.zeros(3, 5, dtype=torch.bool)
    >>> ends[1, 2] = True  # an episode ends at step 2 of row 1: its next frame is the episode's last, not frames[1, 3]
    >>> next_frames = torch.cat([frames[:, 1:], torch.randn(3, 1, 4)], 1)
    >>> next_frames[1, 2] = torch.randn(4)
    >>> tt = TemporalDictTensor({"observation/frame": frames, "_observation/frame": next_frames,
    ...                          "_observation/done": ends, "action/action": torch.ones(3, 5, dtype=torch.long)})
    >>> new, old = trajectory_outputs(m, tt), actor_critic_outputs(m, frames, next_frames, tt["action/action"])
    >>> all(torch.allclose(new[k], old[k], atol=1e-6) for k in old)
    True
    """
    frame = tt["observation/frame"]
    B, T = frame.shape[:2]
    dist, value = model.policy_value(frame.flatten(0, 1))
    value = value.unflatten(0, (B, T))
    with torch.no_grad():
        next_value = next_of_collection(value.detach(), tt, model.value)
    action = policy_actions(tt).flatten(0, 1)
    return {"log_prob": dist.log_prob(action).unflatten(0, (B, T)), "entropy": dist.entropy().unflatten(0, (B, T)),
            "value": value, "next_value": next_value}


def _step_outputs(model: nn.Module, frame: torch.Tensor, next_frame: torch.Tensor,
                  actions: torch.Tensor) -> dict[str, torch.Tensor]:
    # One forward of the critic over frame and next_frame together, one of the policy; rows [N].
    value, next_value = critic_values(model, frame, next_frame)
    dist = model.policy(frame)
    return {"log_prob": dist.log_prob(actions), "entropy": dist.entropy(), "value": value, "next_value": next_value}


def create_policy_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    autocast: torch.dtype | None = None, compile: bool = False, normalize_observations: bool = False,
    activation: str = "tanh", log_std_init: float = 0.0, ortho_init: bool = True, network: str | None = None,
) -> RL_Agent:
    """Builds a batcher's :class:`PolicyAgent` for ``spec``'s env on ``device`` (module level, so it pickles).

    Its weights (and, with ``normalize_observations``, its observation statistics) are the initial ones until the
    first ``batcher.update``; continuous actions are clipped to the spec's bounds; its forward runs under
    ``autocast`` (see :class:`NetworkAgent`), its step compiled with ``compile``. With ``check_device`` it is
    wrapped in :class:`~rlstruct.agents.RL_Agent_CheckDevice`. The network's options (``activation``,
    ``log_std_init``, ``ortho_init``) are :func:`~rlstruct.algos.networks.build_actor_critic`'s; ``network``
    (``"MODULE:CALLABLE"``) builds the model with that factory instead
    (:func:`~rlstruct.algos.network_factories.network_model`).
    """
    if network is not None:
        model = network_model(network, spec).to(device)
    else:
        model = build_actor_critic(spec, hidden_sizes, normalize_observations=normalize_observations,
                                   activation=activation, log_std_init=log_std_init, ortho_init=ortho_init).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = PolicyAgent(model, device, action_low=spec.action_low, action_high=spec.action_high,
                                  autocast=autocast, compile=compile)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


class RecurrentPolicyAgent(NetworkAgent):
    """The batchers' agent of a :class:`~rlstruct.algos.networks.RecurrentActorCritic`: its state is the core's
    memory.

    ``__call__`` resets the memory where ``observation["initial_state"]``, steps the core, and samples an
    action (the most likely one where ``agent_info["stochastic"]`` is false); it returns ``action int64 [B]``
    and ``log_prob float [B]`` (stored under ``action/*``, as :class:`PolicyAgent`'s),
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
            h, c, logits = row_invariant(self._core, observation["frame"].shape[0], observation["frame"], state["h"],
                                         state["c"], observation["initial_state"])
        h, c = h.float(), c.float()  # the memory the buffer holds stays float32 under autocast
        dist = Categorical(logits)
        action = dist.sample_from(self.noise.uniform(dist.logits.shape))
        self.noise.advance()
        if "stochastic" in agent_info:
            action = torch.where(self._on_device(agent_info["stochastic"]), action, dist.mode())
        return DictTensor({"action": action, "log_prob": dist.log_prob(action)}), DictTensor({"h": h, "c": c})

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(action, h, c)``: the argmax action of one step from the memory ``state = (h, c)`` (zeros at an episode's
        start), and the memory after it (see :meth:`NetworkAgent.deterministic`)."""
        h, c = state
        h, c, logits = self._core(frame, h, c, torch.zeros(h.shape[:1], dtype=torch.bool, device=h.device))
        return logits.argmax(-1), h, c

    def _core(self, frame: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
              initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, c = self.model.core_step(frame, h, c, initial_state)
        return h, c, self.model.heads(h)[0]

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
    """Replays ``B`` windows of ``T`` steps through a :class:`RecurrentPolicyAgent` over ``model``, with gradients,
    from the memory stored at the window's start (:func:`~rlstruct.agents.replay_agent`), resetting it where an
    episode starts.

    Returns:
        ``TemporalDictTensor [B, T]``: the keys of :meth:`PolicyAgent.replay_batch`, ``next_value`` (one batched
        core step from each step's memory) only with ``bootstrap``. Its log-probs are the batcher's within float32
        rounding: bit for bit where the CPU's kernels round the batcher's row counts as they round the replay's.

    >>> from rlstruct import RL_Batcher
    >>> from rlstruct.envs import CartPoleNoVel
    >>> model = RecurrentActorCritic((2,), 2, (8,))
    >>> with RL_Batcher(5, RecurrentPolicyAgent, {"model": model, "device": "cpu"}, CartPoleNoVel,
    ...                 {"n_envs": 3, "autoreset": True}, 0, [0]) as b:
    ...     b.reset(); b.execute(); traj, _ = b.get()
    >>> out = replay_window(RecurrentPolicyAgent(model, "cpu"), model, traj)
    >>> torch.allclose(out["log_prob"], traj.trajectories["action/log_prob"], rtol=1e-5, atol=1e-6)
    True
    >>> out["next_value"].shape
    torch.Size([3, 5])
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


def create_recurrent_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False,
    autocast: torch.dtype | None = None, normalize_observations: bool = False,
) -> RL_Agent:
    """Builds a batcher's :class:`RecurrentPolicyAgent` for ``spec``'s env on ``device`` (module level, so it
    pickles). Its weights are random until the first ``batcher.update``; its forward runs under ``autocast``
    (see :class:`NetworkAgent`); with ``check_device`` it is wrapped in
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
