"""The replay buffer of the off-policy algorithms (DQN, SAC), and the transitions an acquisition gives it.

:class:`ReplayBuffer` keeps ``(obs, action, ret, next_obs, discount)`` transitions in preallocated circular tensors
on the learner device; ``ret`` is the (n-step) reward and ``discount`` the factor of the bootstrap at ``next_obs``
(``gamma^m``, or 0 where the episode terminated), so one buffer serves every off-policy target. Observations live in
a ring of their own, each stored once (:meth:`ReplayBuffer.push_steps`), and stacked frames each frame once, in memory
or on disk (:mod:`rlstruct.algos._replay_storage`). :func:`one_step_steps` and
:class:`NStepWindow` cut an acquisition of auto-reset envs into one-step (SAC) and n-step (DQN) transitions.
"""

from __future__ import annotations

import collections
import logging
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from rlstruct.algos._replay_priority import SumTree, importance_weights
from rlstruct.algos._replay_storage import (
    Allocator,
    StackedFrames,
    WholeObservations,
    default_frame_rows,
    default_obs_rows,
    is_frame_stack,
    store_nbytes,
)
from rlstruct.algos._replay_transitions import NStepWindow, one_step_steps, steps_to_transitions, window_transitions
from rlstruct.devices import DeviceLike, as_device

if TYPE_CHECKING:
    from rlstruct.algos import EnvSpec

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "window_transitions", "one_step_steps", "NStepWindow"]

log = logging.getLogger(__name__)


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


class ReplayBuffer:
    """Uniform replay of ``(obs, action, ret, next_obs, discount)`` in preallocated circular tensors.

    :meth:`push` and :meth:`push_steps` write a whole batch with index tensors (no loop per transition);
    :meth:`sample` draws indices with the buffer's own generator, so a buffer's samples depend on its seed and what
    was pushed, nothing else. Everything stays on ``device``.

    Observations are stored in ``obs_dtype`` (``uint8`` frames take a quarter of the memory of float ones) and
    :meth:`sample` returns them in it (the network makes them float in its forward). They live in an observation ring
    of their own, which the transitions point into: :meth:`push` stores two observations per transition (its ``obs``
    and ``next_obs``), :meth:`push_steps` one per step and one per episode end. The ring holds ``obs_capacity``
    observations and grows (by at least an eighth, logged) when those of the transitions kept would not fit, so that
    a sample is always the transitions as pushed. Stacked frames (``uint8 [S, H, W]``, Atari's) are stored one frame
    per step (:class:`~rlstruct.algos._replay_storage.StackedFrames`); with ``storage="disk"`` the large tensors are
    memory-mapped files in ``folder``, removed by :meth:`close`.

    With ``pairs``, every transition keeps its own two observations, as :meth:`push` stores them, also when pushed by
    :meth:`push_steps`: twice the observations' memory, and no read on the host, where :meth:`push_steps` otherwise
    reads how many observations a window adds, which on an accelerator waits for the acquisition that wrote them.
    The samples are the same either way.

    Args:
        capacity: transitions kept (the oldest are overwritten).
        obs_shape: shape of one observation (an int for a flat one).
        device: where the tensors live (the learner device).
        obs_dtype: dtype of the stored observations.
        action_shape: shape of one action (``()`` for a discrete action).
        action_dtype: ``torch.int64`` for discrete actions, ``torch.float32`` for continuous ones.
        seed: seeds the sampling generator.
        obs_capacity: observations the ring holds at first; ``None``: ``capacity + capacity // 32 + 64``, room for
            one per transition (as :meth:`push_steps` stores them), the terminal observations of episodes longer
            than 32 steps and the observations of a push or two; with ``pairs``, twice that.
        frame_stack: store the observations as stacked frames, each frame once (``None``: when they look like
            stacked frames, :func:`~rlstruct.algos._replay_storage.is_frame_stack`).
        storage: ``"memory"`` or ``"disk"`` (memory-mapped files; CPU only).
        folder: the files of ``disk`` storage (``None``: a temporary folder).
        pairs: store two observations per transition whichever method pushes it (stacked frames still read the
            number of new frames on the host).

    Raises:
        ValueError: ``capacity < 1``, ``obs_capacity < 1``, an unknown ``storage``.

    >>> buf = ReplayBuffer(3, 2, "cpu", seed=0)
    >>> for a in ([0, 1], [2, 3]):
    ...     buf.push(torch.zeros(2, 2), torch.tensor(a), torch.ones(2), torch.zeros(2, 2), torch.ones(2))
    >>> len(buf), buf.action.tolist()
    (3, [3, 1, 2])
    >>> frames = ReplayBuffer(64, (4, 84, 84), "cpu", obs_dtype=torch.uint8)
    >>> frames.store.frames.dtype, frames.store.frames.shape
    (torch.uint8, torch.Size([154, 84, 84]))
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: int | tuple[int, ...],
        device: DeviceLike,
        *,
        obs_dtype: torch.dtype = torch.float32,
        action_shape: tuple[int, ...] = (),
        action_dtype: torch.dtype = torch.int64,
        seed: int = 0,
        obs_capacity: int | None = None,
        frame_stack: bool | None = None,
        storage: str = "memory",
        folder: str | os.PathLike | None = None,
        pairs: bool = False,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 transition, got {capacity!r}")
        if obs_capacity is None:
            obs_capacity = default_obs_rows(capacity, pairs=pairs)
        if obs_capacity < 1:
            raise ValueError(f"obs_capacity must be >= 1 observation or None, got {obs_capacity!r}")
        self.capacity = capacity
        self.pairs = pairs
        self.device = as_device(device)
        self.obs_shape = _shape(obs_shape)
        self.action_shape = _shape(action_shape)
        self.alloc = Allocator(self.device, storage=storage, folder=folder)
        if frame_stack is None:
            frame_stack = is_frame_stack(self.obs_shape, obs_dtype)
        #: the observations, observation ``k`` (a global number) at row ``k % store.rows``
        self.store: WholeObservations | StackedFrames
        if frame_stack:
            self.store = StackedFrames(obs_capacity, self.obs_shape, obs_dtype, self.alloc,
                                       frame_rows=default_frame_rows(obs_capacity, self.obs_shape[0]))
        else:
            self.store = WholeObservations(obs_capacity, self.obs_shape, obs_dtype, self.alloc)
        f32 = {"dtype": torch.float32, "device": self.device}
        i64 = {"dtype": torch.int64, "device": self.device}
        self.obs_id = torch.zeros(capacity, **i64)
        self.next_id = torch.zeros(capacity, **i64)
        self.action = torch.zeros(capacity, *self.action_shape, dtype=action_dtype, device=self.device)
        self.ret = torch.zeros(capacity, **f32)
        self.discount = torch.zeros(capacity, **f32)
        self.pos = 0
        self.size = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._n_obs = 0  # observations written so far (the next observation's number)
        self._n_pushed = 0  # transitions pushed so far
        # (transitions pushed after a push, lowest observation number its transitions may point to), one per push
        # whose floor a later push does not cover: the observations from the lowest floor of the kept ones on stay.
        self._pushes: collections.deque[tuple[int, int]] = collections.deque()
        self._streams: _Streams | None = None

    @classmethod
    def for_spec(cls, spec: EnvSpec, capacity: int, device: DeviceLike, *, seed: int = 0,
                 **kwargs: Any) -> ReplayBuffer:
        """A buffer for the observations and actions of ``spec``'s env (its observation dtype; ``int64``
        actions when discrete, ``float32`` ones of ``spec.action_shape`` when continuous); ``kwargs`` go to the
        constructor (``storage``, ``folder``, a :class:`PrioritizedReplayBuffer`'s ``alpha`` and ``beta0``).

        >>> from rlstruct.algos import EnvSpec
        >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
        >>> buf = ReplayBuffer.for_spec(spec, 100, "cpu")
        >>> buf.store.obs.shape, buf.action.shape, buf.action.dtype
        (torch.Size([167, 3]), torch.Size([100, 1]), torch.float32)
        """
        action_dtype = torch.int64 if spec.discrete else torch.float32
        return cls(capacity, spec.obs_shape, device, obs_dtype=getattr(torch, spec.obs_dtype),
                   action_shape=spec.action_shape, action_dtype=action_dtype, seed=seed, **kwargs)

    @classmethod
    def planned_nbytes(cls, spec: EnvSpec, capacity: int, *, pairs: bool = False) -> int:
        """The bytes that :meth:`for_spec` allocates for ``capacity`` transitions of ``spec``'s env (with
        ``pairs``), computed without allocating them.

        >>> from rlstruct.algos import EnvSpec
        >>> spec = EnvSpec((4, 84, 84), "uint8", 6, 1000)
        >>> ReplayBuffer.planned_nbytes(spec, 50) == ReplayBuffer.for_spec(spec, 50, "cpu").nbytes()
        True
        """
        action = (8 if spec.discrete else 4) * math.prod(spec.action_shape)
        store = cls.planned_disk_nbytes(spec, capacity, pairs=pairs)
        tree = 2 * (1 << max(0, (capacity - 1).bit_length())) * 8 if cls is PrioritizedReplayBuffer else 0
        return store + tree + capacity * (8 + 8 + action + 4 + 4)

    @classmethod
    def planned_disk_nbytes(cls, spec: EnvSpec, capacity: int, *, pairs: bool = False) -> int:
        """The bytes of the files that :meth:`for_spec` with ``storage="disk"`` makes for ``capacity`` transitions
        of ``spec``'s env (the observations, with ``pairs``; the rest stays in memory), computed without making
        them.

        >>> from rlstruct.algos import EnvSpec
        >>> spec = EnvSpec((4, 84, 84), "uint8", 6, 1000)
        >>> ReplayBuffer.planned_disk_nbytes(spec, 50) == ReplayBuffer.for_spec(spec, 50, "cpu").store.nbytes()
        True
        """
        obs_dtype = getattr(torch, spec.obs_dtype)
        return store_nbytes(default_obs_rows(capacity, pairs=pairs), spec.obs_shape, obs_dtype,
                            is_frame_stack(spec.obs_shape, obs_dtype))

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        """Removes the files of ``disk`` storage (idempotent; also at garbage collection)."""
        self.alloc.close()

    def nbytes(self) -> int:
        """Bytes held by the buffer's tensors."""
        tensors = (self.obs_id, self.next_id, self.action, self.ret, self.discount)
        return self.store.nbytes() + sum(t.element_size() * math.prod(t.shape) for t in tensors)

    # ----------------------------------------------------------------- writing
    def _check(self, given: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], n: int, fix: str) -> None:
        for name, shape in expected.items():
            if tuple(given[name].shape) != shape:
                raise ValueError(f"{name} must have shape {list(shape)} (N={n} transitions), got "
                                 f"{list(given[name].shape)}; {fix}")

    def _reserve(self, n_obs: int, n_transitions: int, lowest: int) -> int:
        """Grows the observation ring when writing ``n_obs`` more observations, for a push of ``n_transitions``
        transitions that point to observations from ``lowest`` on, would overwrite one a kept transition points to;
        returns the lowest observation number still referenced."""
        pushes = self._pushes
        # A sliding-window minimum: a push whose transitions point to observations from `lowest` on outlives every
        # earlier push that points no lower, so those need no record of their own; the first record holds the floor.
        while pushes and pushes[-1][1] >= lowest:
            pushes.pop()
        pushes.append((self._n_pushed + n_transitions, lowest))
        oldest_kept = self._n_pushed + n_transitions - min(self.size + n_transitions, self.capacity)
        while pushes[0][0] <= oldest_kept:
            pushes.popleft()
        floor = pushes[0][1]
        if self._streams is not None:  # the observations the next window of push_steps may carry
            floor = min(floor, self._streams.lowest)
        needed = self._n_obs + n_obs - floor
        rows = self.store.rows
        if needed > rows:
            grown = max(needed, rows + rows // 8)
            log.info("the replay buffer's observation ring grows from %d to %d observations to keep those of its %d "
                     "transitions (pass a larger obs_capacity to preallocate them)", rows, grown, self.capacity)
            self.store.grow(grown, torch.arange(max(floor, self._n_obs - rows), self._n_obs, device=self.device))
        return floor

    def _write_obs(self, obs: torch.Tensor, parent: torch.Tensor, parent_obs: torch.Tensor, live_from: int
                   ) -> torch.Tensor:
        """Writes observations ``obs`` (room reserved; ``parent`` and ``parent_obs`` as
        :meth:`StackedFrames.write` takes them) and returns their numbers, ``int64 [K]``."""
        ids = torch.arange(self._n_obs, self._n_obs + obs.shape[0], device=self.device)
        self.store.write(ids, obs, parent, parent_obs, live_from)
        self._n_obs += obs.shape[0]
        return ids

    def _append(self, obs_id: torch.Tensor, action: torch.Tensor, ret: torch.Tensor, next_id: torch.Tensor,
                discount: torch.Tensor) -> torch.Tensor:
        """Appends ``N`` transitions whose observations are written (the newest ``capacity`` when ``N`` is larger);
        returns the rows written."""
        n = obs_id.shape[0]
        self._n_pushed += n
        if n > self.capacity:  # only the newest fit
            keep = slice(n - self.capacity, None)
            obs_id, action, ret = obs_id[keep], action[keep], ret[keep]
            next_id, discount = next_id[keep], discount[keep]
            n = self.capacity
        idx = (torch.arange(n, device=self.device) + self.pos) % self.capacity
        self.obs_id[idx] = obs_id
        self.action[idx] = action.to(self.device, self.action.dtype)
        self.ret[idx] = ret.to(self.device, torch.float32)
        self.next_id[idx] = next_id
        self.discount[idx] = discount.to(self.device, torch.float32)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return idx

    def push(self, obs: torch.Tensor, action: torch.Tensor, ret: torch.Tensor, next_obs: torch.Tensor,
             discount: torch.Tensor) -> None:
        """Appends ``N`` transitions (copied, cast to the buffer's dtypes), storing two observations for each.

        Args:
            obs: ``[N, *obs_shape]``.
            action: ``[N, *action_shape]``.
            ret: ``float [N]``, the (n-step) reward.
            next_obs: ``[N, *obs_shape]``, the observation the target bootstraps from.
            discount: ``float [N]``, the bootstrap's factor (0 where the episode terminated).

        Raises:
            ValueError: a tensor's shape does not match the buffer's (the message names it).
        """
        n = obs.shape[0]
        expected = {"obs": (n, *self.obs_shape), "action": (n, *self.action_shape), "ret": (n,),
                    "next_obs": (n, *self.obs_shape), "discount": (n,)}
        given = {"obs": obs, "action": action, "ret": ret, "next_obs": next_obs, "discount": discount}
        self._check(given, expected, n, "build the buffer with the env's shapes (ReplayBuffer.for_spec)")
        if n > self.capacity:  # only the newest fit: their observations alone are written
            keep = slice(n - self.capacity, None)
            obs, action, ret, next_obs, discount = obs[keep], action[keep], ret[keep], next_obs[keep], discount[keep]
            n = self.capacity
        live_from = self._reserve(2 * n, n, self._n_obs)
        # obs, next_obs, obs, ...: each next_obs follows its obs
        both = torch.stack([obs, next_obs], 1).flatten(0, 1).to(self.device)
        parent = torch.arange(2 * n, device=self.device) - 1 + self._n_obs
        parent[0::2] = -1
        ids = self._write_obs(both, parent, torch.roll(both, 1, 0), live_from)
        self._append(ids[0::2], action, ret, ids[1::2], discount)

    def push_steps(self, obs: torch.Tensor, next_obs: torch.Tensor, done: torch.Tensor, action: torch.Tensor,
                   ret: torch.Tensor, last: torch.Tensor, discount: torch.Tensor, *, carried: int = 0) -> None:
        """Appends the transitions of a window of consecutive steps of ``B`` auto-reset envs, storing every
        observation once.

        The window's steps ``p`` in ``[0, L)`` hold ``obs[:, p]`` (the observation the step acted on) and
        ``next_obs[:, p]`` (the one it reached, before any auto-reset: at an episode's end, its terminal
        observation). Row ``b``'s transition ``s`` in ``[0, M)`` starts at step ``s`` and ends at step
        ``last[b, s]``: it is ``(obs[b, s], action[b, s], ret[b, s], next_obs[b, last[b, s]], discount[b, s])``,
        and the batches :meth:`sample` draws are bit for bit those of :meth:`push` of these transitions, flattened
        row-major (``N = B * M``). Successive calls continue the same envs: the first ``carried`` steps of a window
        are the last ``carried`` steps of the previous window (as
        :class:`NStepWindow` carries them), and its step ``carried`` follows the previous
        window's last step.

        Each observation is stored once: ``obs[:, p + 1]`` is ``next_obs[:, p]`` where the episode goes on (the
        batcher's auto-reset contract), so only ``next_obs`` at episode ends (``done``) adds one. A window of
        ``T`` new steps writes ``B * T`` observations and one per episode end, the first window one more per row.
        The call reads the number of new observations on the host (one sync per call, none per step); a buffer with
        ``pairs`` pushes the transitions with :meth:`push` instead, which reads nothing.

        Args:
            obs: ``[B, L, *obs_shape]``, the window's ``observation/frame``.
            next_obs: ``[B, L, *obs_shape]``, its ``_observation/frame``.
            done: ``bool [B, L]``, its ``_observation/done``.
            action: ``[B, M, *action_shape]``, ``M <= L``.
            ret: ``float [B, M]``.
            last: ``int64 [B, M]``, the step each transition ends at (``s <= last[b, s] < L``, no ``done`` before
                it).
            discount: ``float [B, M]``.
            carried: steps of this window that the previous one held (0 for the first window).

        Raises:
            ValueError: a tensor's shape does not match, ``carried`` is out of range, or ``B`` changed.
        """
        if done.dim() != 2:
            raise ValueError(f"done must be bool [B, L] (B envs, L steps), got shape {list(done.shape)}; pass the "
                             "window's _observation/done")
        B, L = done.shape
        M = ret.shape[-1] if ret.dim() else 0
        n = B * M
        given = {"obs": obs, "next_obs": next_obs, "action": action, "ret": ret, "last": last, "discount": discount}
        expected = {"obs": (B, L, *self.obs_shape), "next_obs": (B, L, *self.obs_shape),
                    "action": (B, M, *self.action_shape), "ret": (B, M), "last": (B, M), "discount": (B, M)}
        self._check(given, expected, n, "pass [B, L] steps and [B, M] transitions (M <= L) of the env's shapes")
        if not 1 <= M <= L:
            raise ValueError(f"ret must hold M transitions per row with 1 <= M <= L={L} (the window's steps), got "
                             f"M={M}; push the transitions that start in the window")
        if self.pairs:
            self.push(**steps_to_transitions(given))
            return
        streams = self._streams
        if streams is None:
            if carried != 0:
                raise ValueError(f"carried must be 0 in the first window (no previous one), got {carried}")
        elif not (0 <= carried <= streams.length and streams.rows == B):
            raise ValueError(
                f"carried must be in [0, {streams.length}] (the previous window's steps) with B={streams.rows} rows "
                f"as before, got carried={carried}, B={B}; push the windows of the same envs in order"
            )
        dev = self.device
        done = done.to(dev).bool()
        x_id = torch.full((B, L + 1), -1, dtype=torch.int64, device=dev)  # the observation of each step
        z_id = torch.full((B, L), -1, dtype=torch.int64, device=dev)  # the terminal observation of each episode end
        lowest = self._n_obs
        if streams is not None:
            start = streams.length - carried
            x_id[:, : carried + 1] = streams.x_id[:, start:]
            z_id[:, :carried] = streams.z_id[:, start:]
            # The carried observations were written by the previous window, or by the one before when it carried
            # them too.
            lowest = streams.start if start > streams.carried else streams.lowest
        # The step after the last one is the next window's first: written now where the episode goes on, since the
        # last transitions bootstrap from it.
        x_new = x_id < 0
        x_new[:, L] &= ~done[:, L - 1]
        z_new = (z_id < 0) & done
        # Each row's observations in the order of its env, x[0], z[0], x[1], ..., x[L] (slot 2p is step p's
        # observation, 2p + 1 its terminal one), so that the frames of a row's chain are written one after another.
        slot_id = torch.empty(B, 2 * L + 1, dtype=torch.int64, device=dev)
        slot_id[:, 0::2], slot_id[:, 1::2] = x_id, z_id
        slot_new = torch.empty(B, 2 * L + 1, dtype=torch.bool, device=dev)
        slot_new[:, 0::2], slot_new[:, 1::2] = x_new, z_new
        at = torch.nonzero(slot_new.flatten(), as_tuple=False).squeeze(1)
        live_from = self._reserve(at.shape[0], n, lowest)
        start_obs = self._n_obs
        slot_id.view(-1)[at] = torch.arange(start_obs, start_obs + at.shape[0], device=dev)
        # Each slot's row in `src` (the steps' observations, then the terminal ones) and the slot it follows: step
        # p's observation follows step p - 1's unless that one ended an episode; a terminal one follows its step's.
        b_ = torch.arange(B, device=dev).unsqueeze(1)
        p_ = torch.arange(L + 1, device=dev)
        src_row = torch.empty(B, 2 * L + 1, dtype=torch.int64, device=dev)
        src_row[:, 0::2] = b_ * (L + 1) + p_
        src_row[:, 1::2] = B * (L + 1) + b_ * L + p_[:L]
        parent_slot = torch.full((B, 2 * L + 1), -1, dtype=torch.int64, device=dev)
        parent_slot[:, 2::2] = torch.where(done, -1, 2 * p_[:L])
        parent_slot[:, 1::2] = 2 * p_[:L]
        has_parent = parent_slot >= 0
        parent_id = torch.where(has_parent, slot_id.gather(1, parent_slot.clamp(min=0)), -1).flatten()[at]
        src = torch.cat([torch.cat([obs, next_obs[:, L - 1 :]], 1).flatten(0, 1), next_obs.flatten(0, 1)]).to(dev)
        new_obs = src.index_select(0, src_row.flatten()[at])
        if isinstance(self.store, StackedFrames):
            parent_obs = src.index_select(0, src_row.gather(1, parent_slot.clamp(min=0)).flatten()[at])
        else:
            parent_obs = new_obs
        self._write_obs(new_obs, parent_id, parent_obs, live_from)
        x_id, z_id = slot_id[:, 0::2].contiguous(), slot_id[:, 1::2].contiguous()
        last = last.to(dev)
        ends = done.gather(1, last)
        next_id = torch.where(ends, z_id.gather(1, last), x_id.gather(1, last + 1))
        self._append(x_id[:, :M].flatten(), action.flatten(0, 1), ret.flatten(), next_id.flatten(),
                     discount.flatten())
        self._streams = _Streams(x_id, z_id, carried, start_obs, lowest)

    # ----------------------------------------------------------------- reading
    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement.

        Returns:
            ``obs [batch_size, *obs_shape]`` and ``next_obs`` alike (the stored dtype), ``action [batch_size,
            *action_shape]`` (its stored dtype), ``ret float [batch_size]``, ``discount float [batch_size]``.

        Raises:
            ValueError: the buffer is empty.
        """
        self._check_not_empty()
        return self._rows(torch.randint(self.size, (batch_size,), generator=self.generator, device=self.device))

    def update_priorities(self, index: torch.Tensor | None, td_error: torch.Tensor | None) -> None:
        """Does nothing: uniform replay draws every transition alike. A learner calls it after each loss whichever
        buffer it holds (:meth:`PrioritizedReplayBuffer.update_priorities` sets the priorities), with its batch's
        ``index`` and its loss's TD errors, of which a uniform batch has neither (``None``): the losses compute TD
        errors only for a batch with importance-sampling weights, so a uniform one costs no kernel for them.

        >>> ReplayBuffer(4, 1, "cpu").update_priorities(None, None)
        """

    def anneal(self, fraction: float) -> None:
        """Does nothing: uniform replay has no importance-sampling exponent to anneal (see
        :meth:`PrioritizedReplayBuffer.anneal`)."""

    def _check_not_empty(self) -> None:
        if self.size == 0:
            raise ValueError("the replay buffer is empty; push transitions before sampling")

    def _rows(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"obs": self.store.read(self.obs_id[idx]), "action": self.action[idx],
                "ret": self.ret[idx], "next_obs": self.store.read(self.next_id[idx]),
                "discount": self.discount[idx]}


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016): transition ``i`` is drawn with probability
    ``P(i) = p_i / sum_j p_j``, ``p_i = (|delta_i| + eps)^alpha`` from its last TD error ``delta_i``, and weighted by
    ``w_i = (N P(i))^-beta / max_j w_j`` in the loss (``j`` over the sampled batch); a new transition gets the largest
    priority so far.

    The priorities sit in a :class:`~rlstruct.algos._replay_priority.SumTree` over tensors: a batch is drawn by
    stratified masses (one per ``1/batch_size`` of the total, Schaul et al.'s appendix) and updated at once.

    Args:
        capacity: transitions kept.
        obs_shape: shape of one observation.
        device: where the tensors live.
        alpha: how much the priorities shape the draws (0: uniform).
        beta0: the importance-sampling exponent at the start; :meth:`anneal` takes it to 1.
        eps: added to ``|delta|`` so that no transition stops being drawn.
        **kwargs: :class:`ReplayBuffer`'s.

    Raises:
        ValueError: ``alpha < 0`` or ``beta0`` outside ``[0, 1]``, and :class:`ReplayBuffer`'s.

    >>> buf = PrioritizedReplayBuffer(4, 1, "cpu", alpha=1.0, beta0=1.0)
    >>> buf.push(torch.zeros(2, 1), torch.tensor([0, 1]), torch.zeros(2), torch.zeros(2, 1), torch.ones(2))
    >>> buf.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, -3.0]))
    >>> batch = buf.sample(4)  # one draw per quarter of the total: row 0 once, row 1 three times
    >>> batch["index"].tolist(), [round(w, 3) for w in batch["weight"].tolist()]
    ([0, 1, 1, 1], [1.0, 0.333, 0.333, 0.333])
    """

    def __init__(self, capacity: int, obs_shape: int | tuple[int, ...], device: DeviceLike, *, alpha: float = 0.6,
                 beta0: float = 0.4, eps: float = 1e-6, **kwargs: Any):
        if alpha < 0 or not 0 <= beta0 <= 1:
            raise ValueError(f"alpha must be >= 0 and beta0 in [0, 1], got alpha={alpha!r}, beta0={beta0!r}")
        super().__init__(capacity, obs_shape, device, **kwargs)
        self.alpha, self.beta0, self.beta, self.eps = alpha, beta0, beta0, eps
        self.tree = SumTree(capacity, self.device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)

    def nbytes(self) -> int:
        """Bytes held by the buffer's tensors, the tree's included."""
        return super().nbytes() + self.tree.sum.numel() * 8

    def anneal(self, fraction: float) -> None:
        """Sets ``beta`` to ``beta0 + (1 - beta0) * fraction`` (``fraction``: of the step budget spent)."""
        self.beta = self.beta0 + (1.0 - self.beta0) * min(max(fraction, 0.0), 1.0)

    def _append(self, obs_id: torch.Tensor, action: torch.Tensor, ret: torch.Tensor, next_id: torch.Tensor,
                discount: torch.Tensor) -> torch.Tensor:
        idx = super()._append(obs_id, action, ret, next_id, discount)
        self.tree.update(idx, self.max_priority.expand(idx.shape[0]))
        return idx

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn in proportion to their priorities.

        Returns:
            :meth:`ReplayBuffer.sample`'s, with ``index int64 [batch_size]`` (the rows, for
            :meth:`update_priorities`) and ``weight float [batch_size]`` (the importance-sampling weights at the
            current ``beta``).

        Raises:
            ValueError: the buffer is empty.
        """
        self._check_not_empty()
        f64 = {"dtype": torch.float64, "device": self.device}
        u = torch.rand(batch_size, generator=self.generator, **f64)
        idx = self.tree.find((torch.arange(batch_size, **f64) + u) / batch_size * self.tree.total)
        idx = idx.clamp(max=self.size - 1)
        batch = self._rows(idx)
        batch["index"] = idx
        batch["weight"] = importance_weights(self.tree.get(idx), self.beta)
        return batch

    def update_priorities(self, index: torch.Tensor | None, td_error: torch.Tensor | None) -> None:
        """Sets the priorities of rows ``index`` (``int64 [N]``, a sample's ``index``) from their TD errors
        (``[N]``, any sign; no gradient is kept).

        Raises:
            ValueError: ``index`` or ``td_error`` is ``None`` (a batch of this buffer has an ``index``, and a loss
                given its ``weight`` gives the TD errors).
        """
        if index is None or td_error is None:
            missing = "index" if index is None else "td_error"
            raise ValueError(f"{missing} must be a tensor of the sampled rows' {missing}, got None; pass the batch's "
                             "index and the TD errors of a loss given the batch's weight")
        priority = (td_error.detach().abs().double() + self.eps).pow(self.alpha)
        self.tree.update(index, priority)
        self.max_priority = torch.maximum(self.max_priority, priority.max())


class _Streams:
    """What :meth:`ReplayBuffer.push_steps` keeps of a window for the next: the observation numbers of its steps
    (``x_id [B, L + 1]``, -1 where none was written) and of its terminal observations (``z_id [B, L]``), the steps it
    carried, the first observation it wrote and the lowest observation its transitions point to."""

    def __init__(self, x_id: torch.Tensor, z_id: torch.Tensor, carried: int, start: int, lowest: int):
        self.x_id, self.z_id, self.carried, self.start, self.lowest = x_id, z_id, carried, start, lowest
        self.rows, self.length = z_id.shape
