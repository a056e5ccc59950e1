"""TensorData: construction from NumPy, torch, DLPack, scalars and lists; zero-copy
sharing; export; wrapping buffers with strides and offsets, and every layout error."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.tensor_data import MAX_RANK


def _shares(a, b) -> bool:
    """Whether two objects (NumPy, torch, TensorData) view the same memory."""
    def ptr(x):
        if isinstance(x, sm.TensorData):
            x = x.torch()
        return x.data_ptr() if isinstance(x, torch.Tensor) else x.__array_interface__["data"][0]

    return ptr(a) == ptr(b)


# -- from NumPy --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in sm.dtypes.ALL if d.numpy is not None], ids=str)
def test_numpy_round_trip_is_zero_copy(dtype):
    a = (np.arange(6) % 3).astype(dtype.numpy).reshape(2, 3)
    t = sm.TensorData(a)
    assert t.dtype is dtype and t.shape == (2, 3) and t.strides == (3, 1) and t.offset == 0
    assert _shares(t, a) and _shares(t.numpy(), a)
    np.testing.assert_array_equal(t.numpy(), a)


def test_read_only_numpy_is_shared_not_copied():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = sm.TensorData(a)
    assert _shares(t, a)
    np.testing.assert_array_equal(t.numpy(), a)


def test_non_contiguous_numpy_keeps_its_strides():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = sm.TensorData(a.T)
    assert t.shape == (4, 3) and t.strides == (1, 4) and _shares(t, a)
    sliced = sm.TensorData(a[:, 1::2])
    assert sliced.strides == (4, 2) and sliced.offset == 0
    np.testing.assert_array_equal(sliced.numpy(), a[:, 1::2])


def test_negative_strides_and_big_endian_are_copied_to_native_order():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    flipped = sm.TensorData(a[:, ::-1])
    np.testing.assert_array_equal(flipped.numpy(), a[:, ::-1])
    assert all(s > 0 for s in flipped.strides)
    big = a.astype(">i4")
    t = sm.TensorData(big)
    assert t.dtype is sm.int32
    np.testing.assert_array_equal(t.numpy(), a.astype(np.int32))
    assert t.numpy().dtype.byteorder in ("=", "<", "|")


def test_numpy_bfloat16_and_zero_size_and_scalars():
    bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    assert sm.TensorData(bf).dtype is sm.bfloat16
    np.testing.assert_array_equal(sm.TensorData(bf).numpy().astype(np.float32), [1.5, -2.0])
    assert sm.TensorData(np.zeros((0, 3), np.int16)).shape == (0, 3)
    assert sm.TensorData(np.float16(2.5)).shape == () and sm.TensorData(np.float16(2.5)).dtype is sm.float16


def test_unsupported_element_types_are_refused():
    with pytest.raises(TypeError, match="unsupported element type"):
        sm.TensorData(np.zeros(2, np.complex64))
    with pytest.raises(TypeError, match="cannot make TensorData from str"):
        sm.TensorData("abc")
    with pytest.raises(TypeError, match="unsupported dtype"):
        sm.TensorData([1.0], dtype="float8")
    with pytest.raises(sm.LayoutError, match="rank 17 is over the limit of 16"):
        sm.TensorData(np.zeros((1,) * 17))


# -- from torch and DLPack ------------------------------------------------------------------------------------
def test_torch_round_trip_is_zero_copy_and_keeps_strides():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = sm.TensorData(x.t())
    assert t.torch().data_ptr() == x.data_ptr() and t.strides == (1, 4)
    v = sm.TensorData(x[1:, 2:])
    assert v.offset == 6 and v.shape == (2, 2)
    assert torch.equal(v.torch(), x[1:, 2:])


def test_torch_tensor_requiring_grad_is_detached():
    x = torch.ones(3, requires_grad=True)
    assert not sm.TensorData(x).torch().requires_grad


class _DLPackOnly:
    """An array from another library: only the DLPack protocol."""

    def __init__(self, t: torch.Tensor):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_dlpack_in_and_out_share_memory():
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    t = sm.TensorData(_DLPackOnly(x))
    assert t.dtype is sm.int32 and t.torch().data_ptr() == x.data_ptr()
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    via_numpy = np.from_dlpack(t)
    assert _shares(via_numpy, x)
    x[0, 0] = 42
    assert back[0, 0] == 42 and via_numpy[0, 0] == 42


def test_bfloat16_export():
    x = torch.tensor([1.0, -0.5, 3.0], dtype=torch.bfloat16)
    t = sm.TensorData(x)
    assert t.torch().dtype == torch.bfloat16
    a = t.numpy()
    assert a.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(a.astype(np.float32), [1.0, -0.5, 3.0])
    assert torch.equal(torch.from_dlpack(t), x)


# -- from Python -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, dtype", [(True, sm.bool), (3, sm.int64), (2.5, sm.float32),
                                          ([1, 2], sm.int64), ([[1, 2.5], [3, 4]], sm.float32),
                                          ([True, False], sm.bool), ([True, 2], sm.int64), ([], sm.float32)])
def test_python_values_infer_bool_int_float(value, dtype):
    t = sm.TensorData(value)
    assert t.dtype is dtype
    np.testing.assert_array_equal(t.numpy(), np.array(value, dtype=dtype.numpy))


def test_python_values_with_a_dtype():
    assert sm.TensorData(0.1, sm.float64).item() == 0.1  # not rounded through float32 first
    assert sm.TensorData([1, 2], sm.float16).dtype is sm.float16
    np.testing.assert_array_equal(sm.TensorData([0, 3], sm.bool).numpy(), [False, True])
    assert sm.TensorData(-128, sm.int8).item() == -128


@pytest.mark.parametrize("value, dtype", [(300, sm.uint8), (-1, sm.uint8), ([1, [200]], sm.int8), (2 ** 63, sm.int64),
                                          (2 ** 70, None)])
def test_python_ints_out_of_range_are_errors(value, dtype):
    with pytest.raises(ValueError, match="out of range for"):
        sm.TensorData(value, dtype)


def test_ragged_and_odd_lists_are_refused():
    with pytest.raises((TypeError, ValueError)):
        sm.TensorData([1, [2, 3]])
    with pytest.raises(TypeError, match="nested list holds a str"):
        sm.TensorData([1, "a"])


def test_cast_on_construction_copies():
    a = np.arange(3, dtype=np.int32)
    t = sm.TensorData(a, sm.float64)
    assert t.dtype is sm.float64 and not _shares(t, a)
    assert sm.TensorData(t).torch() is t.torch()


def test_constructors_and_description():
    z = sm.TensorData.zeros((2, 3), sm.int16, device="cpu")
    assert z.numpy().sum() == 0 and z.nbytes == 12 and z.device == "cpu" and z.rank == 2
    assert sm.TensorData.empty((4,), "float32").shape == (4,)
    assert "shape=(2, 3)" in repr(z) and "int16" in repr(z)
    assert z.to("cpu").shape == (2, 3)
    assert np.asarray(z).dtype == np.int16


# -- from_buffer ---------------------------------------------------------------------------------------------
def test_from_buffer_padded_rows_share_memory():
    buf = np.arange(12, dtype=np.float32)
    t = sm.TensorData.from_buffer(buf, (3, 3), sm.float32, strides=(4, 1))
    np.testing.assert_array_equal(t.numpy(), buf.reshape(3, 4)[:, :3])
    buf[5] = -1.0
    assert t.numpy()[1, 1] == -1.0


def test_from_buffer_offset_and_byte_buffers():
    raw = bytearray(np.arange(10, dtype=np.int16).tobytes())
    t = sm.TensorData.from_buffer(raw, (2, 2), sm.int16, strides=(3, 1), offset=2)
    np.testing.assert_array_equal(t.numpy(), [[2, 3], [5, 6]])
    assert t.offset == 2 and t.strides == (3, 1)
    raw[4:6] = np.int16(99).tobytes()
    assert t.numpy()[0, 0] == 99
    ro = sm.TensorData.from_buffer(bytes(8), (2,), sm.float32)
    np.testing.assert_array_equal(ro.numpy(), [0.0, 0.0])
    mv = sm.TensorData.from_buffer(memoryview(np.ones(4, np.float64)), (2, 2), "float64")
    assert mv.numpy().sum() == 4.0


def test_from_buffer_of_tensors_and_tensor_data():
    x = torch.arange(8, dtype=torch.int32)
    t = sm.TensorData.from_buffer(x, (2, 2), sm.int32, strides=(4, 1), offset=1)
    assert torch.equal(t.torch(), torch.tensor([[1, 2], [5, 6]], dtype=torch.int32))
    assert t.torch().untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    reinterpreted = sm.TensorData.from_buffer(sm.TensorData(np.zeros(4, np.float32)), (8,), sm.float16)
    assert reinterpreted.shape == (8,) and not reinterpreted.numpy().any()


def test_from_buffer_zero_size_and_rank_zero():
    assert sm.TensorData.from_buffer(bytes(0), (0, 3), sm.float32).shape == (0, 3)
    assert sm.TensorData.from_buffer(np.array([7], np.int64), (), sm.int64).item() == 7


@pytest.mark.parametrize("kwargs, match", [
    ({"shape": (2, 2), "strides": (1, 2)}, "the innermost stride must be 1; got strides (1, 2)"),
    ({"shape": (3, 3), "strides": (4, 1)},
     "address element 10, but the buffer holds 10 elements of float32 (40 bytes)"),
    ({"shape": (2, 2), "offset": 7}, "address element 10"),
    ({"shape": (2, 2), "strides": (-2, 1)}, "strides must be >= 0; got (-2, 1)"),
    ({"shape": (2,), "offset": -1}, "offset must be >= 0; got -1"),
    ({"shape": (2, -1)}, "shape (2, -1) has a negative extent"),
    ({"shape": (2, 2), "strides": (2,)}, "1 strides given for a shape of rank 2"),
    ({"shape": (1,) * (MAX_RANK + 1)}, "rank 17 is over the limit of 16"),
    ({"shape": (0, 2), "offset": 11}, "offset 11 lies past the buffer's 10 elements"),
])
def test_from_buffer_layout_errors(kwargs, match):
    with pytest.raises(sm.LayoutError) as info:
        sm.TensorData.from_buffer(np.zeros(10, np.float32), dtype=sm.float32, **kwargs)
    assert match in str(info.value)


def test_from_buffer_misaligned_and_strided_buffers():
    raw = np.zeros(33, np.uint8)
    with pytest.raises(sm.LayoutError, match="not aligned to 4 bytes for float32"):
        sm.TensorData.from_buffer(memoryview(raw)[1:], (2,), sm.float32)
    with pytest.raises(sm.LayoutError, match="one contiguous block of memory; got a strided NumPy view"):
        sm.TensorData.from_buffer(np.zeros((4, 4), np.float32)[:, ::2], (2,), sm.float32)
    with pytest.raises(sm.LayoutError, match="got a strided tensor"):
        sm.TensorData.from_buffer(torch.zeros(4, 4).t(), (2,), sm.float32)
    with pytest.raises(TypeError, match="exposes no memory"):
        sm.TensorData.from_buffer(object(), (2,), sm.float32)
