"""Device normalisation and comparison (the module's doctests run under ``pytest --doctest-modules``)."""

from __future__ import annotations

import re

import pytest
import torch

from rlstruct.devices import as_device, available_devices, check_device_exists, same_device
from rlstruct.errors import DeviceUnavailableError
from tests.conftest import device_params


@pytest.mark.parametrize(
    "given, expected",
    [
        ("cpu", torch.device("cpu")),
        ("cpu:0", torch.device("cpu")),
        (torch.device("cpu", 0), torch.device("cpu")),
        ("cuda", torch.device("cuda", 0)),
        ("cuda:1", torch.device("cuda", 1)),
        (torch.device("cuda"), torch.device("cuda", 0)),
        (2, torch.device("cuda", 2)),
        ("meta", torch.device("meta")),
    ],
)
def test_as_device_normalises(given, expected):
    d = as_device(given)
    assert isinstance(d, torch.device)
    assert (d.type, d.index) == (expected.type, expected.index)


def test_as_device_does_not_initialise_cuda():
    if torch.cuda.is_initialized():
        pytest.skip("an earlier test in this process initialised CUDA")
    as_device("cuda:3")
    same_device("cuda", "cuda:1")
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("bad", [None, 1.0, True, ["cpu"]])
def test_as_device_rejects_other_types(bad):
    with pytest.raises(TypeError, match=rf"device must be a str, int or torch.device, got {type(bad).__name__}"):
        as_device(bad)


@pytest.mark.parametrize("bad", ["gpu", "tpu", "cuda:x", -1])
def test_as_device_rejects_unknown_names_with_a_typed_error(bad):
    with pytest.raises(DeviceUnavailableError, match=rf"learner_device={bad!r} is not a device torch knows .*'cuda:1'"):
        as_device(bad, argument="learner_device")
    with pytest.raises(DeviceUnavailableError, match=rf"^batcher_device={bad!r} is not a device"):
        check_device_exists(bad, argument="batcher_device")


@pytest.mark.parametrize("argv", [["train", "a2c", "--learner-device", "tpu"],
                                  ["train", "ppo", "--batcher-device", "cuda:x"],
                                  ["profile", "--device", "tpu"]])
def test_the_cli_rejects_a_bad_device_string_in_one_line(argv, capsys):
    from rlstruct.algos._train.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a device torch knows" in err[0]


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("cpu", torch.device("cpu"), True),
        ("cpu", "cpu:0", True),
        ("cuda", "cuda:0", True),
        (torch.device("cuda"), torch.device("cuda", 0), True),
        (0, "cuda:0", True),
        ("cuda:0", "cuda:1", False),
        ("cpu", "cuda:0", False),
        ("cpu", "meta", False),
        (None, None, True),
        (None, "cpu", False),
        ("cpu", None, False),
    ],
)
def test_same_device(a, b, same):
    assert same_device(a, b) is same
    assert same_device(b, a) is same


def test_available_devices_lists_cpu_first():
    names = available_devices()
    assert names[0] == "cpu"
    assert len(names) == 1 + (torch.cuda.device_count() if torch.cuda.is_available() else 0)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_check_device_exists_accepts_what_is_there(device):
    assert check_device_exists(device) == as_device(device)


@pytest.mark.parametrize("device", device_params())
def test_check_device_exists_on_each_available_device(device):
    assert check_device_exists(device) == as_device(device)


def test_check_device_exists_names_the_available_devices():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = f"cuda:{max(7, n)}"
    expected = ", ".join(available_devices())
    with pytest.raises(
        DeviceUnavailableError,
        match=re.escape(f"learner_device='{missing}' does not exist on this machine; available devices: {expected}"),
    ):
        check_device_exists(missing, argument="learner_device")
    with pytest.raises(ValueError, match=r"^device="):  # also a ValueError, named 'device' by default
        check_device_exists(missing)


def test_check_device_exists_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    message = r"device='cuda:7' does not exist on this machine; available devices: cpu$"
    with pytest.raises(DeviceUnavailableError, match=message):
        check_device_exists("cuda:7")
    with pytest.raises(DeviceUnavailableError, match=r"device='cuda:0'"):
        check_device_exists("cuda")
