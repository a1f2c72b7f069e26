"""Batched containers of named tensors: DictTensor ``[B, ...]``, TemporalDictTensor ``[B, T, ...]`` with per-row
lengths, Trajectories (what a batcher returns), and the row-wise selects masked_tensor and masked_dicttensor.

A DictTensor of 0-d tensors is a record without a batch dimension (e.g. losses). Every structure is also a
pytree node.
"""

from rlstruct.structures import _pytree  # noqa: F401  (registers the structures as pytree nodes)
from rlstruct.structures._dicttensor import DictTensor, masked_dicttensor, masked_tensor
from rlstruct.structures._temporal import TemporalDictTensor, Trajectories

__all__ = [
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
]
