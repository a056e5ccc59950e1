"""What a new user runs into first: device names, gradients of non-scalars, completion handlers.

The CLI's own behaviour is in tests/test_cli.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.tensor_data import available_devices, resolve_device


# -- devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpu", "mps", "cpu:1", "cuda0", "", "CUDA"])
def test_an_unknown_device_says_which_are_accepted_and_present(name):
    g = sm.Graph()
    x = g.placeholder((2,), sm.float32)
    with pytest.raises(sm.DeviceError, match=r'expected "cpu", "cuda" or "cuda:N"; this machine has: cpu') as e:
        g.run({x: np.ones(2, np.float32)}, [x], device=name)
    assert repr(name) in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, sm.StitchError)
    with pytest.raises(sm.DeviceError):
        sm.TensorData(np.ones(2), device=name)


def test_a_cuda_device_that_is_not_present():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [f"cuda:{count}"] + ([] if count else ["cuda"])
    for name in missing:
        with pytest.raises(sm.DeviceError, match=r"was asked for but this machine has.*cpu") as e:
            resolve_device(name)
        assert repr(name) in str(e.value)
    assert available_devices() == ["cpu"] + [f"cuda:{i}" for i in range(count)]


def test_accepted_device_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
