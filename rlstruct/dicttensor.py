"""rlstructures' ``rlstructures.dicttensor`` path: the structures of :mod:`rlstruct.structures`, under that name."""

from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor, masked_tensor

__all__ = ["masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor", "Trajectories"]
