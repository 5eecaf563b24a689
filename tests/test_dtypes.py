"""Element types: the table, lookups, ONNX packing and TensorProto round trips."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear
from qlinear.dtypes import ELEMENT_TYPES, element_type, packed_size

SUB_BYTE = [t for t in ELEMENT_TYPES if t.bits < 8]
SHAPES = [(), (0,), (1,), (3,), (5,), (2, 3), (3, 7), (4, 1, 5)]


def random_array(t, shape, rng):
    """Every bit pattern is fair game, NaN and inf codes included."""
    n = math.prod(shape)
    if t.bits < 8:
        return (rng.integers(0, 1 << t.bits, n).astype(np.uint8)).view(t.dtype).reshape(shape)
    return rng.integers(0, 256, n * t.dtype.itemsize, dtype=np.uint8).view(t.dtype).reshape(shape)


def bits(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("t", ELEMENT_TYPES, ids=str)
def test_element_type_lookup_by_name_enum_and_dtype(t):
    assert element_type(t.name) is t
    assert element_type(t.onnx_enum) is t
    assert element_type(t.dtype) is t
    assert element_type(f"tensor({t.name})") is t
    assert helper.tensor_dtype_to_np_dtype(t.onnx_enum) == t.dtype


def test_element_type_known_ranges():
    assert (element_type("int4").qmin, element_type("int4").qmax) == (-8, 7)
    assert (element_type("uint2").qmin, element_type("uint2").qmax) == (0, 3)
    assert element_type("float8e4m3fn").max_finite == 448
    assert element_type("float8e4m3fnuz").max_finite == 240
    assert element_type("float8e5m2").max_finite == 57344
    assert element_type("float4e2m1").max_finite == 6
    assert element_type("float6e2m3").max_finite == 7.5
    assert element_type("float6e3m2").max_finite == 28
    assert element_type(ml_dtypes.float8_e5m2).has_inf and not element_type("float8e4m3fn").has_inf
    assert element_type("float32") is element_type(np.float32)


@pytest.mark.parametrize("bad", ["int3", 9999, np.float64, object(), True])
def test_element_type_unknown_raises(bad):
    with pytest.raises(qlinear.QuantizationError, match="expected one of"):
        element_type(bad)


@pytest.mark.parametrize("t", SUB_BYTE, ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 13])
def test_pack_matches_onnx_layout(t, n):
    rng = np.random.default_rng(n)
    a = random_array(t, (n,), rng)
    packed = qlinear.pack(a)
    assert packed.dtype == np.uint8 and packed.size == packed_size(n, t.bits)
    expected = numpy_helper.from_array(a).raw_data
    assert packed.tobytes() == expected
    assert np.array_equal(bits(qlinear.unpack(packed, t.name, (n,))), bits(a))


def test_pack_low_bits_first_hand_computed():
    assert qlinear.pack(np.array([1, -1, 3], dtype=ml_dtypes.int4)).tolist() == [0xF1, 0x03]
    assert qlinear.pack(np.array([1, -2, 0, -1, 1], dtype=ml_dtypes.int2)).tolist() == [0b11001001, 0b01]
    # float6e2m3: 1.0 is code 0b001000; four codes fill three bytes.
    assert qlinear.pack(np.ones(4, dtype=ml_dtypes.float6_e2m3fn)).tolist() == [0x08, 0x82, 0x20]


def test_unpack_too_few_bytes_raises():
    with pytest.raises(qlinear.QuantizationError, match="expected at least 2"):
        qlinear.unpack(np.zeros(1, np.uint8), "int4", (3,))


def test_pack_rejects_non_array():
    with pytest.raises(qlinear.QuantizationError, match="must be a numpy array"):
        qlinear.pack([1, 2])


@pytest.mark.parametrize("t", ELEMENT_TYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_proto_round_trip(t, shape):
    a = random_array(t, shape, np.random.default_rng(len(shape)))
    proto = qlinear.to_tensor_proto(a, "w")
    back = qlinear.from_tensor_proto(proto)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert np.array_equal(bits(back), bits(a))
    # onnx reads what qlinear writes, bit for bit.
    assert np.array_equal(bits(numpy_helper.to_array(proto)), bits(a))


@pytest.mark.parametrize("t", [t for t in ELEMENT_TYPES if t.name != "float8e8m0"], ids=str)
@pytest.mark.parametrize("shape", [(3,), (2, 5)], ids=str)
def test_from_tensor_proto_reads_typed_fields(t, shape):
    a = random_array(t, shape, np.random.default_rng(1))
    if t.kind in ("float", "wide"):
        a = np.where(np.isnan(a.astype(np.float32)) | np.isinf(a.astype(np.float32)), t.dtype.type(1), a).astype(t.dtype)
    proto = helper.make_tensor("w", t.onnx_enum, shape, a.reshape(-1), raw=False)
    assert not proto.raw_data
    back = qlinear.from_tensor_proto(proto)
    assert back.dtype == a.dtype and np.array_equal(bits(back), bits(a))


def test_from_tensor_proto_wrong_size_raises():
    proto = qlinear.to_tensor_proto(np.zeros(5, ml_dtypes.int4), "w")
    proto.raw_data = proto.raw_data[:-1]
    with pytest.raises(qlinear.QuantizationError, match="'w' raw_data has 2 bytes, expected 3"):
        qlinear.from_tensor_proto(proto)
    typed = helper.make_tensor("v", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    del typed.float_data[-1]
    with pytest.raises(qlinear.QuantizationError, match="float_data has 2 entries, expected 3"):
        qlinear.from_tensor_proto(typed)


def test_from_tensor_proto_external_data_not_loaded_raises():
    proto = qlinear.to_tensor_proto(np.zeros(4, np.float32), "w")
    proto.ClearField("raw_data")
    proto.data_location = onnx.TensorProto.EXTERNAL
    with pytest.raises(qlinear.QuantizationError, match="external data"):
        qlinear.from_tensor_proto(proto)
