"""The examples' logger, kept in memory: one float per name and iteration, as their TFLogger's scalars."""

from __future__ import annotations


class Logger:
    def __init__(self, log_dir=None, hps=None):
        self.log_dir = log_dir
        self.hps = dict(hps or {})
        self.scalars = {}

    def add_scalar(self, name, value, iteration):
        self.scalars.setdefault(name, []).append((iteration, float(value)))

    def values(self, name):
        return [v for _, v in self.scalars.get(name, [])]

    def close(self):
        pass
