"""The replay buffer of the off-policy algorithms (DQN, SAC): uniform replay in preallocated circular tensors.

:class:`ReplayBuffer` keeps ``(obs, action, ret, next_obs, discount)`` transitions on the learner device,
in the dtypes the batcher returns them: observations of any shape and dtype (image frames stay ``uint8``
and become float only in :meth:`ReplayBuffer.sample`), discrete ``int64`` or continuous ``float32``
actions. ``ret`` is the (n-step) reward and ``discount`` the factor of the bootstrap at ``next_obs``
(``gamma^m``, or 0 where the episode terminated), so one buffer serves every off-policy target.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from rlstruct.devices import DeviceLike, as_device

if TYPE_CHECKING:
    from rlstruct.algos.run import EnvSpec

__all__ = ["ReplayBuffer"]


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


class ReplayBuffer:
    """Uniform replay of ``(obs, action, ret, next_obs, discount)`` in preallocated circular tensors.

    :meth:`push` writes a whole batch with one index tensor per call (no loop per transition, no host
    sync); :meth:`sample` draws indices with the buffer's own generator, so a buffer's samples depend on
    its seed and what was pushed, nothing else. Everything stays on ``device``.

    Observations are stored in ``obs_dtype`` (``uint8`` frames take a quarter of the memory of float ones)
    and :meth:`sample` returns them as ``float32`` (not rescaled: a pixel network divides by 255 itself).
    ``obs`` and ``next_obs`` are both stored: ``2 * capacity * prod(obs_shape)`` elements.

    Args:
        capacity: transitions kept (the oldest are overwritten).
        obs_shape: shape of one observation (an int for a flat one).
        device: where the tensors live (the learner device).
        obs_dtype: dtype of the stored observations.
        action_shape: shape of one action (``()`` for a discrete action).
        action_dtype: ``torch.int64`` for discrete actions, ``torch.float32`` for continuous ones.
        seed: seeds the sampling generator.

    Raises:
        ValueError: ``capacity < 1``.

    >>> buf = ReplayBuffer(3, 2, "cpu", seed=0)
    >>> for a in ([0, 1], [2, 3]):
    ...     buf.push(torch.zeros(2, 2), torch.tensor(a), torch.ones(2), torch.zeros(2, 2), torch.ones(2))
    >>> len(buf), buf.action.tolist()
    (3, [3, 1, 2])
    >>> frames = ReplayBuffer(10, (4, 84, 84), "cpu", obs_dtype=torch.uint8)
    >>> frames.obs.dtype, frames.obs.shape
    (torch.uint8, torch.Size([10, 4, 84, 84]))
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
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 transition, got {capacity!r}")
        self.capacity = capacity
        self.device = as_device(device)
        self.obs_shape = _shape(obs_shape)
        self.action_shape = _shape(action_shape)
        f32 = {"dtype": torch.float32, "device": self.device}
        self.obs = torch.zeros(capacity, *self.obs_shape, dtype=obs_dtype, device=self.device)
        self.next_obs = torch.zeros(capacity, *self.obs_shape, dtype=obs_dtype, device=self.device)
        self.action = torch.zeros(capacity, *self.action_shape, dtype=action_dtype, device=self.device)
        self.ret = torch.zeros(capacity, **f32)
        self.discount = torch.zeros(capacity, **f32)
        self.pos = 0
        self.size = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @classmethod
    def for_spec(cls, spec: EnvSpec, capacity: int, device: DeviceLike, *, seed: int = 0) -> ReplayBuffer:
        """A buffer for the observations and actions of ``spec``'s env (its observation dtype; ``int64``
        actions when discrete, ``float32`` ones of ``spec.action_shape`` when continuous).

        >>> from rlstruct.algos.run import EnvSpec
        >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
        >>> buf = ReplayBuffer.for_spec(spec, 100, "cpu")
        >>> buf.obs.shape, buf.action.shape, buf.action.dtype
        (torch.Size([100, 3]), torch.Size([100, 1]), torch.float32)
        """
        action_dtype = torch.int64 if spec.discrete else torch.float32
        return cls(capacity, spec.obs_shape, device, obs_dtype=getattr(torch, spec.obs_dtype),
                   action_shape=spec.action_shape, action_dtype=action_dtype, seed=seed)

    def __len__(self) -> int:
        return self.size

    def nbytes(self) -> int:
        """Bytes held by the buffer's tensors."""
        tensors = (self.obs, self.next_obs, self.action, self.ret, self.discount)
        return sum(t.element_size() * math.prod(t.shape) for t in tensors)

    def push(self, obs: torch.Tensor, action: torch.Tensor, ret: torch.Tensor, next_obs: torch.Tensor,
             discount: torch.Tensor) -> None:
        """Appends ``N`` transitions (copied, cast to the buffer's dtypes).

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
        for name, shape in expected.items():
            if tuple(given[name].shape) != shape:
                raise ValueError(f"{name} must have shape {list(shape)} (N={n} transitions), got "
                                 f"{list(given[name].shape)}; build the buffer with the env's shapes "
                                 "(ReplayBuffer.for_spec)")
        if n > self.capacity:  # only the newest fit
            keep = slice(n - self.capacity, None)
            obs, action, ret, next_obs, discount = obs[keep], action[keep], ret[keep], next_obs[keep], discount[keep]
            n = self.capacity
        idx = (torch.arange(n, device=self.device) + self.pos) % self.capacity
        self.obs[idx] = obs.to(self.device, self.obs.dtype)
        self.action[idx] = action.to(self.device, self.action.dtype)
        self.ret[idx] = ret.to(self.device, torch.float32)
        self.next_obs[idx] = next_obs.to(self.device, self.obs.dtype)
        self.discount[idx] = discount.to(self.device, torch.float32)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement.

        Returns:
            ``obs float [batch_size, *obs_shape]``, ``action [batch_size, *action_shape]`` (its stored dtype),
            ``ret float [batch_size]``, ``next_obs float [batch_size, *obs_shape]``,
            ``discount float [batch_size]``.

        Raises:
            ValueError: the buffer is empty.
        """
        if self.size == 0:
            raise ValueError("the replay buffer is empty; push transitions before sampling")
        idx = torch.randint(self.size, (batch_size,), generator=self.generator, device=self.device)
        return {"obs": self.obs[idx].float(), "action": self.action[idx], "ret": self.ret[idx],
                "next_obs": self.next_obs[idx].float(), "discount": self.discount[idx]}
