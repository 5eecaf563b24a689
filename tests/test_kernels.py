"""backend="auto" runs the reference kernels below the threshold and the cpu kernels from it up."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import qlinear
from qlinear.dtypes import element_type
from qlinear.kernels import AUTO_REFERENCE_BELOW, BACKENDS, backend, cpu, reference

TYPES = ["uint8", "int4", "float8e4m3fn"]
# name -> (axis, block_size); x has 64 columns.
GRANULARITIES = {"per-tensor": (1, 0), "per-axis 0": (0, 0), "blocked 32 last": (1, 32)}
COLUMNS = 64
# Just below the threshold, and at it.
SIZES = [AUTO_REFERENCE_BELOW - COLUMNS, AUTO_REFERENCE_BELOW]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _inputs(name: str, granularity: str, size: int):
    rng = np.random.default_rng(size)
    axis, block = GRANULARITIES[granularity]
    shape = (size // COLUMNS, COLUMNS)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    sshape = {"per-tensor": (), "per-axis 0": (shape[0],), "blocked 32 last": (shape[0], COLUMNS // 32)}[granularity]
    scale = rng.uniform(0.01, 0.1, sshape).astype(np.float32)
    zp = np.zeros(sshape, element_type(name).dtype)
    return x, scale, zp, dict(axis=axis, block_size=block, packed=element_type(name).bits < 8)


@pytest.fixture
def ran(monkeypatch):
    """Names of the kernel modules that ran, in order, as "cpu.quantize" etc."""
    calls: list[str] = []
    for module_name, module in BACKENDS.items():
        for function in ("quantize", "dequantize"):
            real = getattr(module, function)

            def spy(*args, _real=real, _name=f"{module_name}.{function}", **kwargs):
                calls.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, function, spy)
    return calls


def test_backend_auto_switches_at_threshold():
    assert backend("auto", size=0, caller="t") is reference
    assert backend("auto", size=AUTO_REFERENCE_BELOW - 1, caller="t") is reference
    assert backend("auto", size=AUTO_REFERENCE_BELOW, caller="t") is cpu


@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("size", SIZES)
def test_auto_runs_reference_below_threshold_and_cpu_from_it(ran, name, granularity, size):
    x, scale, zp, kw = _inputs(name, granularity, size)
    packed = kw.pop("packed")
    chosen = "reference" if size < AUTO_REFERENCE_BELOW else "cpu"

    q = qlinear.quantize_linear(x, scale, zp, packed=packed, **kw)
    assert ran == [f"{chosen}.quantize"]
    _assert_same(q, qlinear.quantize_linear(x, scale, zp, packed=packed, backend=chosen, **kw))

    dq_kw = dict(packed_dtype=name, shape=x.shape) if packed else {}
    ran.clear()
    y = qlinear.dequantize_linear(q, scale, zp, **dq_kw, **kw)
    assert ran == [f"{chosen}.dequantize"]
    _assert_same(y, qlinear.dequantize_linear(q, scale, zp, **dq_kw, backend=chosen, **kw))


@pytest.mark.parametrize("size", SIZES)
def test_auto_packed_and_out(ran, size):
    x, scale, zp, kw = _inputs("int4", "blocked 32 last", size)
    del kw["packed"]
    chosen = "reference" if size < AUTO_REFERENCE_BELOW else "cpu"
    want = qlinear.quantize_linear(x, scale, zp, packed=True, backend="reference", **kw)
    buf = np.empty_like(want)
    ran.clear()
    assert qlinear.quantize_linear(x, scale, zp, packed=True, out=buf, **kw) is buf
    assert ran == [f"{chosen}.quantize"]
    _assert_same(buf, want)

    want = qlinear.dequantize_linear(buf, scale, zp, packed_dtype="int4", shape=x.shape, backend="reference", **kw)
    back = np.empty(x.shape, np.float32)
    ran.clear()
    assert qlinear.dequantize_linear(buf, scale, zp, packed_dtype="int4", shape=x.shape, out=back, **kw) is back
    assert ran == [f"{chosen}.dequantize"]
    _assert_same(back, want)


@pytest.mark.parametrize("size", SIZES)
def test_dynamic_quantize_linear_auto(ran, size):
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    got = qlinear.dynamic_quantize_linear(x)
    assert ran == ["reference.quantize" if size < AUTO_REFERENCE_BELOW else "cpu.quantize"]
    for g, w in zip(got, qlinear.dynamic_quantize_linear(x, backend="reference"), strict=True):
        _assert_same(g, w)


def test_unknown_backend_lists_auto():
    with pytest.raises(
        qlinear.QuantizationError, match=r"quantize_linear: backend must be one of \['auto', 'cpu', 'reference'\], got 'gpu'"
    ):
        qlinear.quantize_linear(np.zeros(3, np.float32), np.float32(1), backend="gpu")


def test_small_auto_calls_do_not_import_numba():
    code = (
        "import sys, numpy as np, qlinear\n"
        "x = np.linspace(-1, 1, 1000, dtype=np.float32)\n"
        "q = qlinear.quantize_linear(x, np.float32(0.01), output_dtype='int4', packed=True)\n"
        "qlinear.dequantize_linear(q, np.float32(0.01), packed_dtype='int4', shape=x.shape)\n"
        "qlinear.dequantize_linear(qlinear.quantize_linear(x, np.float32(0.01)), np.float32(0.01))\n"
        "qlinear.dynamic_quantize_linear(x)\n"
        "assert 'numba' not in sys.modules, 'a small call imported numba'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
