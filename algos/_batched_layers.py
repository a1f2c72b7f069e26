"""The batched layers of :class:`~rlstruct.algos.population.Population`'s ``"batched"`` implementation: the forwards of
the built-in networks over stacked parameters ``[N, ...]`` and inputs with a leading member dimension.

Flat features are ``[N, B, F]`` (a linear layer is one ``baddbmm`` of the members' weights); a CNN's maps are
``[B, N * C, H, W]``, the members' channels side by side, on which one grouped convolution is every member's
convolution and ``GroupNorm(N * G)`` every member's ``GroupNorm(G)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlstruct.algos._normalization import ObservationNormalizer
from rlstruct.algos.distributions import Categorical, DiagGaussian
from rlstruct.algos.encoders import CNNEncoder, MLPEncoder
from rlstruct.algos.networks import ActorCritic, EncoderActorCritic
from rlstruct.algos.qnetworks import PixelQNetwork, QNetwork, dueling_q
from rlstruct.errors import ConfigError

__all__ = ["BATCHED", "batchable", "check_batchable"]

_ELEMENTWISE = (nn.Tanh, nn.ReLU, nn.Identity)


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = layer.weight.transpose(1, 2)
    return torch.bmm(x, w) if layer.bias is None else torch.baddbmm(layer.bias.unsqueeze(1), x, w)


def _layer_norm(layer: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    y = nn.functional.layer_norm(x, layer.normalized_shape, None, None, layer.eps)
    if layer.weight is None:
        return y
    return torch.addcmul(layer.bias.unsqueeze(1), y, layer.weight.unsqueeze(1))


def _sequence(layers: nn.Module, x: torch.Tensor) -> torch.Tensor:
    for layer in layers.children() if isinstance(layers, nn.Sequential) else (layers,):
        if isinstance(layer, nn.Sequential):
            x = _sequence(layer, x)
        elif isinstance(layer, nn.Linear):
            x = _linear(layer, x)
        elif isinstance(layer, nn.LayerNorm):
            x = _layer_norm(layer, x)
        else:
            x = layer(x)
    return x


def _map_layer(layer: nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
    if isinstance(layer, nn.Conv2d):
        return nn.functional.conv2d(x, layer.weight.flatten(0, 1), layer.bias.flatten(), layer.stride, layer.padding,
                                    layer.dilation, n * layer.groups)
    if isinstance(layer, nn.GroupNorm):
        return nn.functional.group_norm(x, n * layer.num_groups, layer.weight.flatten(), layer.bias.flatten(),
                                        layer.eps)
    return layer(x)


def _cnn(encoder: CNNEncoder, frame: torch.Tensor) -> torch.Tensor:
    n, b = frame.shape[:2]
    # [B, H, W, N * C] in memory, viewed as [B, N * C, H, W]: channels-last maps, as the solo encoder's on the CPU
    # (oneDNN's grouped convolution, forward and backward, about 2x faster on them than on contiguous maps)
    x = frame.permute(1, 2, 3, 0, 4) if encoder.channels_last else frame.permute(1, 3, 4, 0, 2)
    x = x.reshape(b, *x.shape[1:3], -1).permute(0, 3, 1, 2).float()
    if encoder.scale != 1.0:
        x = x * encoder.scale
    for i, layer in enumerate(encoder._map_layers):
        x = _map_layer(layer, x, n)
        if i == encoder._row_major_after:  # the solo encoder's row-major maps after the MinAtar conv (see there)
            x = x.contiguous()
    # each member's maps flattened in its own (C, H, W) order: the first linear layer's columns
    return _sequence(encoder.linear, x.reshape(b, n, -1).transpose(0, 1))


def _encoder(encoder: nn.Module, frame: torch.Tensor) -> torch.Tensor:
    if isinstance(encoder, CNNEncoder):
        return _cnn(encoder, frame)
    x = frame.float()
    return _sequence(encoder.net, x * encoder.scale if encoder.scale != 1.0 else x)


def _q_forward(model: QNetwork | PixelQNetwork, frame: torch.Tensor) -> torch.Tensor:
    if isinstance(model, PixelQNetwork):
        h = _cnn(model.encoder, frame)
    elif model.dueling:
        h = _sequence(model.trunk, frame.float())
    else:
        return _sequence(model.q, frame.float())
    if not model.dueling:
        return _sequence(model.q, h)
    return dueling_q(_sequence(model.value, h), _sequence(model.advantage, h))


def _ac_input(model: ActorCritic, frame: torch.Tensor) -> torch.Tensor:
    norm = model.normalizer
    if norm is None:
        return frame.float()
    mean, var = norm.mean.unsqueeze(1), norm.var.unsqueeze(1)
    return ((frame.float() - mean) * torch.rsqrt(var + norm.eps)).clamp(-norm.clip, norm.clip)


def _ac_policy(model: ActorCritic, frame: torch.Tensor) -> Categorical | DiagGaussian:
    out = _sequence(model.actor, _ac_input(model, frame))
    return DiagGaussian(out, model.log_std.unsqueeze(1)) if model.continuous else Categorical(out)


def _ac_value(model: ActorCritic, frame: torch.Tensor) -> torch.Tensor:
    return _sequence(model.critic, _ac_input(model, frame)).squeeze(-1).float()


def _eac_policy_value(model: EncoderActorCritic, frame: torch.Tensor) -> tuple[Categorical, torch.Tensor]:
    features = _encoder(model.encoder, frame)
    return Categorical(_linear(model.policy_head, features)), _linear(model.value_head, features).squeeze(-1).float()


BATCHED: dict[tuple[type, str], Callable[..., Any]] = {
    (QNetwork, "forward"): _q_forward,
    (PixelQNetwork, "forward"): _q_forward,
    (ActorCritic, "policy"): _ac_policy,
    (ActorCritic, "value"): _ac_value,
    (ActorCritic, "policy_value"): lambda m, x: (_ac_policy(m, x), _ac_value(m, x)),
    (EncoderActorCritic, "policy"): lambda m, x: _eac_policy_value(m, x)[0],
    (EncoderActorCritic, "value"): lambda m, x: _eac_policy_value(m, x)[1],
    (EncoderActorCritic, "policy_value"): _eac_policy_value,
}
_BATCHED_LAYERS = (nn.Sequential, nn.Linear, nn.LayerNorm, nn.Conv2d, nn.GroupNorm, nn.Flatten, *_ELEMENTWISE)


def batchable(module: nn.Module) -> bool:
    """Whether :data:`BATCHED` computes ``module``'s forwards."""
    try:
        check_batchable(module)
    except ConfigError:
        return False
    return True


def check_batchable(module: nn.Module) -> None:
    """Raises :class:`~rlstruct.errors.ConfigError` for a module whose forwards :data:`BATCHED` does not compute."""
    kinds = sorted({cls.__name__ for cls, _ in BATCHED})
    if not any(cls is type(module) for cls, _ in BATCHED):
        raise ConfigError(f"implementation='batched' batches the networks {kinds}, got a {type(module).__name__}; "
                          "pass implementation='vmap', which runs any module")
    for name, sub in module.named_modules():
        if sub is module or isinstance(sub, (CNNEncoder, MLPEncoder, ObservationNormalizer, *_BATCHED_LAYERS)):
            continue
        if next(sub.children(), None) is None:
            raise ConfigError(f"implementation='batched' has no batched {type(sub).__name__} (module {name!r}); "
                              "pass implementation='vmap', which runs any module")
