"""The shared benchmark policy as a module TorchRL's collector workers can unpickle (``benchmarks/peers.py``)."""

from __future__ import annotations

import torch
from torch import nn


class SampledMLP(nn.Module):
    """Samples one action per row from the softmax of the MLP 4-64-64-2 (``peers.mlp``) over ``obs [N, 4]``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(self.model(obs.float()), -1), 1).squeeze(-1)
