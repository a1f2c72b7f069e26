"""rlstructures' ``rlstructures.tools`` path: weight_init, the initialisation of its example programs' models."""

from rlstruct._weight_init import weight_init

__all__ = ["weight_init"]
