"""Row reductions of the native CPU backend (codegen/cpu.py): softmax's kernel fetches the next row while it
computes on the current one and multiplies by the reciprocal of the row's sum; a division by a row's value
whose reciprocal would be infinite or subnormal still divides. Against float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm

NATIVE = {"backend": "native"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _kernel(exe) -> str:
    (source,) = [st.source for st in exe.steps if st.source]
    return source


def test_softmax_rows_prefetch_the_next_row_and_scale_by_the_sums_reciprocal():
    g = sm.Graph()
    x = g.placeholder((64, 256), name="x")
    y = g.softmax(x, axis=-1)
    exe = g.compile({x: sm.TensorType((64, 256), sm.float32)}, [y], device="cpu", options=NATIVE)
    source = _kernel(exe)
    assert "__builtin_prefetch(&in0[rn * 256 + c0], 0, 3)" in source
    assert "__builtin_prefetch(&out0[rn * 256 + c0], 1, 3)" in source
    assert " * rcp" in source
    xv = torch.randn(64, 256) * 4
    xv[3] = float("-inf")  # a row of -inf: its sum is NaN (exp(-inf - -inf)), as in PyTorch
    xv[5, 7] = float("nan")
    xv[9, :5] = float("inf")
    got = exe.run({x: xv})[y].torch()
    want = torch.softmax(xv.double(), -1)
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-9, equal_nan=True)


def test_a_division_by_a_rows_subnormal_or_huge_value_divides_rather_than_overflowing_its_reciprocal():
    """x / sum(x) over rows whose sums are subnormal (their reciprocal is infinite), huge (their reciprocal is
    subnormal) and ordinary; the values are small integers times a power of two, so the sums are exact."""
    g = sm.Graph()
    x = g.placeholder((4, 16), name="x")
    y = g.division(x, g.reduction_sum(x, axes=-1, keep_dims=True))
    exe = g.compile({x: sm.TensorType((4, 16), sm.float32)}, [y], device="cpu", options=NATIVE)
    assert " * rcp" in _kernel(exe)
    k = np.arange(16, 32, dtype=np.float64)
    xv = torch.from_numpy(np.stack([k * 2.0 ** -140, k * 2.0 ** 119, k, k[::-1] * 2.0 ** -60]).astype(np.float32))
    assert 0 < xv[0].sum() < 2.0 ** -126 and xv[1].sum() > 2.0 ** 126  # the two edge rows are what they claim
    got = exe.run({x: xv})[y].torch()
    want = xv.double() / xv.double().sum(-1, keepdim=True)
    torch.testing.assert_close(got.double(), want, rtol=1.2e-7, atol=0)
