"""Observation encoders and their initialisation: :class:`CNNEncoder` for images (Nature-DQN or MinAtar), and
:class:`MLPEncoder` for flat frames, chosen by :func:`make_encoder` from the observation's shape.

Frames reach an encoder as the env gives them (``uint8`` pixels, ``bool`` planes) and become floats inside its
forward, scaled by the env's ``obs_high`` (fixed when the encoder is built, not read from each batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from rlstruct.errors import SpaceError

__all__ = ["MLPEncoder", "CNNEncoder", "make_encoder"]

#: Frames smaller than this (pixels a side) get the MinAtar network instead of the Nature-DQN stack.
NATURE_MIN_SIZE = 36


def image_layout(obs_shape: Sequence[int]) -> str:
    """``"chw"`` or ``"hwc"``: where the channels of an image observation are.

    Channels are last when the last dimension is smaller than both others (``[84, 84, 4]``, MinAtar's
    ``[10, 10, 4]``), first otherwise (``[4, 84, 84]``, and a tie such as ``[3, 3, 3]``).

    Raises:
        SpaceError: ``obs_shape`` is not 3-dimensional.

    >>> image_layout((4, 84, 84)), image_layout((10, 10, 4)), image_layout((210, 160, 3))
    ('chw', 'hwc', 'hwc')
    """
    if len(obs_shape) != 3:
        raise SpaceError(f"obs_shape must have 3 dimensions (an image), got {tuple(obs_shape)}; "
                         "use MLPEncoder for flat observations")
    a, b, c = obs_shape
    return "hwc" if c < a and c < b else "chw"


def pixel_scale(obs_dtype: str, obs_high: float | None = None) -> float:
    """What an encoder multiplies frames of ``obs_dtype`` by: ``1 / obs_high`` for ``uint8`` frames (``1/255`` when
    ``obs_high`` is ``None``), 1 otherwise.

    >>> pixel_scale("uint8") * 255, pixel_scale("uint8", 1.0), pixel_scale("bool"), pixel_scale("float32")
    (1.0, 1.0, 1.0, 1.0)
    """
    if obs_dtype != "uint8":
        return 1.0
    return 1.0 / (obs_high or 255.0)


def _to_float(frame: torch.Tensor, scale: float) -> torch.Tensor:
    x = frame.float()
    return x * scale if scale != 1.0 else x


def init_orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """``layer`` (a linear or convolution layer) with orthogonal weights of ``gain`` and zero biases."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLPEncoder(nn.Module):
    """A tanh MLP over a flat frame ``[N, F]`` -> ``[N, hidden_sizes[-1]]`` (orthogonal init, gain sqrt(2)).

    Args:
        obs_dim: the frame's size ``F``.
        hidden_sizes: the widths of the hidden layers; the last is :attr:`out_dim`.
        obs_dtype: the env's frame dtype (``"uint8"`` frames are divided by ``obs_high``).
        obs_high: the largest value of ``uint8`` frames (default 255).

    >>> MLPEncoder(4, (8, 16))(torch.zeros(3, 4)).shape
    torch.Size([3, 16])
    """

    def __init__(self, obs_dim: int, hidden_sizes: Sequence[int], *, obs_dtype: str = "float32",
                 obs_high: float | None = None):
        super().__init__()
        self.scale = pixel_scale(obs_dtype, obs_high)
        sizes = [obs_dim, *hidden_sizes]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [init_orthogonal(nn.Linear(a, b), math.sqrt(2)), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.out_dim = sizes[-1]

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Features ``float [N, out_dim]`` of frames ``[N, F]`` (any dtype)."""
        return self.net(_to_float(frame, self.scale))


class CNNEncoder(nn.Module):
    """A ReLU CNN over image frames ``[N, C, H, W]`` (or ``[N, H, W, C]`` with ``channels_last``).

    Frames at least :data:`NATURE_MIN_SIZE` pixels a side get the Nature-DQN stack (conv 32x8x8 s4,
    64x4x4 s2, 64x3x3 s1, linear 512); smaller ones (MinAtar's 10x10) the MinAtar network (conv 16x3x3 s1,
    linear 128). Frames become float inside the forward, on the encoder's device, divided by ``obs_high`` (255)
    when the env's are ``uint8``, whether they arrive as ``uint8`` or already as floats. With ``layer_norm`` each
    layer's output is normalised before its ReLU (over a conv's whole ``[C, H, W]`` map), as in PQN's CNN.

    Args:
        obs_shape: the shape of one frame, as the env gives it.
        obs_dtype: the env's frame dtype, e.g. ``"uint8"`` (Atari) or ``"bool"`` (MinAtar).
        obs_high: the largest value of ``uint8`` frames (default 255).
        channels_last: whether the channels are the last dimension (default: :func:`image_layout`).
        layer_norm: a LayerNorm before each ReLU (PQN's stabiliser).

    >>> enc = CNNEncoder((4, 84, 84))
    >>> enc(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape, enc.out_dim
    (torch.Size([2, 512]), 512)
    >>> CNNEncoder((10, 10, 4), obs_dtype="bool")(torch.zeros(3, 10, 10, 4, dtype=torch.bool)).shape
    torch.Size([3, 128])
    """

    def __init__(self, obs_shape: Sequence[int], *, obs_dtype: str = "uint8", obs_high: float | None = None,
                 channels_last: bool | None = None, layer_norm: bool = False):
        super().__init__()
        self.scale = pixel_scale(obs_dtype, obs_high)
        if channels_last is None:
            channels_last = image_layout(obs_shape) == "hwc"
        self.channels_last = channels_last
        c, h, w = (obs_shape[2], obs_shape[0], obs_shape[1]) if channels_last else tuple(obs_shape)
        relu_gain = math.sqrt(2)
        if min(h, w) >= NATURE_MIN_SIZE:
            self.kind = "nature"
            convs = [nn.Conv2d(c, 32, 8, stride=4), nn.Conv2d(32, 64, 4, stride=2), nn.Conv2d(64, 64, 3, stride=1)]
            self.out_dim = 512
        else:
            self.kind = "minatar"
            convs = [nn.Conv2d(c, 16, 3, stride=1)]
            self.out_dim = 128
        layers: list[nn.Module] = []
        # In-place ReLUs: no layer's backward needs its own output (a conv's, a norm's and a linear layer's take their
        # input), so the activation overwrites it instead of allocating a map as large again (the MinAtar CNN's forward
        # and backward 1.11x faster: benchmarks/ppo_learner.py's "encoder relu-copy").
        for conv in convs:
            # GroupNorm with one group is a LayerNorm over the conv's whole [C, H, W] output.
            norm = [nn.GroupNorm(1, conv.out_channels)] if layer_norm else []
            layers += [init_orthogonal(conv, relu_gain), *norm, nn.ReLU(inplace=True)]
        layers.append(nn.Flatten())
        self.convs = nn.Sequential(*layers)
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        norm = [nn.LayerNorm(self.out_dim)] if layer_norm else []
        self.linear = nn.Sequential(init_orthogonal(nn.Linear(n_flat, self.out_dim), relu_gain), *norm,
                                    nn.ReLU(inplace=True))
        # plain tuples (not registered twice): the layers before the flattening, and those after the first linear one
        self._map_layers = tuple(self.convs)[:-1]
        self._after_first = tuple(self.linear)[1:]
        # The MinAtar CNN's conv output is laid out row by row (contiguous) before its norm and ReLU when the flattening
        # below copies anyway (batches up to out_dim rows): the flattening is then a view, and the ReLU's backward
        # meets a gradient of its own layout, where on channels-last maps it was a strided pass (0.4 ms of a DQN
        # gradient step's 4, against 0.03). DQN's gradient step on MinAtar: 1.11-1.15x faster, the same numbers to the
        # bit; PQN's LayerNorm CNN at 128 rows: 1.12x (benchmarks/encoder_layout.py). The Nature CNN keeps its
        # channels-last maps: there the copy's place made no measurable difference (0.99x [0.91, 1.12]).
        # (an index into _map_layers: a module held as an attribute would be registered, and saved, twice)
        self._row_major_after = self._map_layers.index(convs[-1]) if self.kind == "minatar" else None

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Features ``float [N, out_dim]`` of frames ``[N, C, H, W]`` (``[N, H, W, C]`` with ``channels_last``)."""
        if self.channels_last:
            maps = _to_float(frame, self.scale).permute(0, 3, 1, 2)  # the memory stays channels-last
        elif frame.device.type == "cpu":
            # oneDNN's convolution gradients are faster on channels-last maps (the Nature CNN's forward and backward
            # over 32 Atari frames: 20 ms of CPU instead of 27, its first layer's weight gradient 2x), and the layout
            # carries through the layers. The uint8 frames are laid out first: a quarter of the float copy.
            maps = _to_float(frame.contiguous(memory_format=torch.channels_last), self.scale)
        else:
            maps = _to_float(frame, self.scale)
        # A trace (rlstruct export's TorchScript) records one branch for every batch size: the plain one, right for
        # any batch, without reading the batch size (the tracer warns of a branch on it).
        plain = torch.jit.is_tracing() or frame.shape[0] <= self.out_dim
        for i, layer in enumerate(self._map_layers):
            maps = layer(maps)
            if i == self._row_major_after and plain:
                maps = maps.contiguous()
        if plain or not _strictly_channels_last(maps):
            return self.linear(self.convs[-1](maps))
        # Flattening channels-last maps in the (C, H, W) order of the first linear layer's columns copies them,
        # forward and backward. For a batch larger than the layer's rows it is cheaper to flatten the maps in memory
        # order (a view) and permute the weight's columns to that order: the same products, summed in another order.
        first = self.linear[0]
        weight = first.weight.unflatten(1, maps.shape[1:]).permute(0, 2, 3, 1).flatten(1)
        out = nn.functional.linear(maps.permute(0, 2, 3, 1).flatten(1), weight, first.bias)
        for layer in self._after_first:
            out = layer(out)
        return out


def _strictly_channels_last(maps: torch.Tensor) -> bool:
    # channels-last memory, and not also contiguous (a map of 1x1 pixels or one channel is both)
    return maps.is_contiguous(memory_format=torch.channels_last) and not maps.is_contiguous()


def make_encoder(
    obs_shape: Sequence[int], hidden_sizes: Sequence[int], obs_dtype: str = "float32", obs_high: float | None = None
) -> MLPEncoder | CNNEncoder:
    """The encoder for frames of ``obs_shape``: a :class:`CNNEncoder` for images, an :class:`MLPEncoder` otherwise.

    Args:
        obs_shape: one frame's shape: ``(F,)`` or an image (3 dimensions).
        hidden_sizes: the MLP's widths (the CNN's sizes are fixed by the frame size).
        obs_dtype: the env's frame dtype (``EnvSpec.obs_dtype``): ``"uint8"`` frames are divided by ``obs_high``.
        obs_high: ``EnvSpec.obs_high`` (default 255).

    Raises:
        SpaceError: ``obs_shape`` has neither 1 nor 3 dimensions.

    >>> type(make_encoder((4,), (64, 64))).__name__, type(make_encoder((4, 84, 84), (64, 64), "uint8")).__name__
    ('MLPEncoder', 'CNNEncoder')
    """
    if len(obs_shape) == 1:
        return MLPEncoder(int(obs_shape[0]), hidden_sizes, obs_dtype=obs_dtype, obs_high=obs_high)
    if len(obs_shape) == 3:
        return CNNEncoder(obs_shape, obs_dtype=obs_dtype, obs_high=obs_high)
    raise SpaceError(f"obs_shape must be flat (1 dimension) or an image (3 dimensions), got {tuple(obs_shape)}; "
                     "flatten the observation")
