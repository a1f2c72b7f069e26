"""``weight_init``, the initialisation rlstructures' example programs apply to their models (``model.apply``)."""

from __future__ import annotations

from torch import nn
from torch.nn import init

__all__ = ["weight_init"]

#: layers whose weight is drawn from a standard normal, and those drawn by Xavier's normal initialisation
_NORMAL = (nn.Conv1d, nn.ConvTranspose1d)
_XAVIER = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear, nn.Embedding)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_RECURRENT = (nn.LSTM, nn.LSTMCell, nn.GRU, nn.GRUCell)


def weight_init(module: nn.Module) -> None:
    """Re-initialises one layer in place, for ``model.apply(weight_init)``: 1-d convolutions from a standard normal;
    other convolutions, linear layers and embeddings by Xavier's normal initialisation; batch norms' scales from
    ``N(1, 0.02)`` and their shifts at 0; the recurrent layers' matrices orthogonal and their vectors from a standard
    normal; every bias from a standard normal. Other modules are left as they are.

    >>> import torch
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.BatchNorm1d(8))
    >>> _ = torch.manual_seed(0)
    >>> _ = model.apply(weight_init)
    >>> float(model[2].bias.abs().sum()), tuple(model[0].weight.shape)
    (0.0, (8, 4))
    """
    if isinstance(module, _BATCH_NORMS):
        init.normal_(module.weight.data, mean=1.0, std=0.02)
        init.constant_(module.bias.data, 0.0)
    elif isinstance(module, _RECURRENT):
        for parameter in module.parameters():
            if parameter.dim() >= 2:
                init.orthogonal_(parameter.data)
            else:
                init.normal_(parameter.data)
    elif isinstance(module, _NORMAL + _XAVIER):
        if isinstance(module, _NORMAL):
            init.normal_(module.weight.data)
        else:
            init.xavier_normal_(module.weight.data)
        if getattr(module, "bias", None) is not None:
            init.normal_(module.bias.data)
