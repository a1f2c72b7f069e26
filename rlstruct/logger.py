"""rlstructures' ``rlstructures.logger`` path: Logger (in memory) and TFLogger (CSV and TensorBoard files)."""

from rlstruct._scalar_logger import Logger, TFLogger

__all__ = ["Logger", "TFLogger"]
