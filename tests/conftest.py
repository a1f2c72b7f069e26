"""Shared fixtures: the devices every contract suite is parametrized over."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])


def device_params() -> list:
    """``cpu``, plus ``cuda:0`` marked ``cuda`` when a GPU is present."""
    return [pytest.param(d, marks=pytest.mark.cuda) if d.startswith("cuda") else d for d in DEVICES]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
