"""DictTensor and TemporalDictTensor as pytree nodes, so that ``torch.utils._pytree.tree_map``, ``torch.func``
and ``torch.compile`` see their tensors (a TemporalDictTensor's lengths last)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.utils._pytree as pytree

from rlstruct.structures._dicttensor import DictTensor, new_dicttensor
from rlstruct.structures._temporal import TemporalDictTensor, new_temporal


def _dt_flatten(d: DictTensor) -> tuple[list[torch.Tensor], list[str]]:
    return list(d.variables.values()), list(d.variables.keys())


def _dt_unflatten(values: Iterable[torch.Tensor], keys: list[str]) -> DictTensor:
    return new_dicttensor(dict(zip(keys, values)))


def _dt_flatten_with_keys(d: DictTensor) -> tuple[list[tuple[pytree.KeyEntry, torch.Tensor]], list[str]]:
    return [(pytree.MappingKey(k), v) for k, v in d.variables.items()], list(d.variables.keys())


def _tdt_flatten(d: TemporalDictTensor) -> tuple[list[torch.Tensor], list[str]]:
    return [*d.variables.values(), d.lengths], list(d.variables.keys())


def _tdt_unflatten(values: Iterable[torch.Tensor], keys: list[str]) -> TemporalDictTensor:
    values = list(values)
    return new_temporal(dict(zip(keys, values[:-1])), values[-1])


def _tdt_flatten_with_keys(d: TemporalDictTensor) -> tuple[list[tuple[pytree.KeyEntry, torch.Tensor]], list[str]]:
    kv = [(pytree.MappingKey(k), v) for k, v in d.variables.items()]
    return kv + [(pytree.GetAttrKey("lengths"), d.lengths)], list(d.variables.keys())


pytree.register_pytree_node(
    DictTensor,
    _dt_flatten,
    _dt_unflatten,
    serialized_type_name="rlstruct.DictTensor",
    flatten_with_keys_fn=_dt_flatten_with_keys,
)
pytree.register_pytree_node(
    TemporalDictTensor,
    _tdt_flatten,
    _tdt_unflatten,
    serialized_type_name="rlstruct.TemporalDictTensor",
    flatten_with_keys_fn=_tdt_flatten_with_keys,
)
