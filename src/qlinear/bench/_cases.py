"""The benchmark's matrix: operators x element types x granularities, and their inputs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from qlinear.dtypes import ElementType, element_type
from qlinear.ops import dequantize_linear, quantize_linear
from qlinear.spec import type_opset

__all__ = ["Case", "GRANULARITIES", "MORE_TYPES", "TYPES", "X_DTYPES", "cases", "inputs", "qlinear_calls"]

TYPES = ("uint8", "int8", "int16", "uint4", "int4", "int2", "float8e4m3fn", "float8e5m2", "float4e2m1")
# The other quantized types, measured when asked for by name.
MORE_TYPES = ("uint16", "uint2", "float8e4m3fnuz", "float8e5m2fnuz", "float6e2m3", "float6e3m2")
# name -> (axis, block_size, per_tensor)
GRANULARITIES = {
    "per-tensor": (1, 0),
    "per-axis 0": (0, 0),
    "per-axis last": (1, 0),
    "blocked 32 last": (1, 32),
    "blocked 32 axis 0": (0, 32),
}
# Columns of x: the last axis; the rows make up the requested size.
COLUMNS = 1024


@dataclass(frozen=True)
class Case:
    """One benchmarked call: ``op`` is ``"Q"`` or ``"DQ"``."""

    op: str
    type_name: str
    granularity: str

    @property
    def element(self) -> ElementType:
        return element_type(self.type_name)

    @property
    def axis(self) -> int:
        return GRANULARITIES[self.granularity][0]

    @property
    def block_size(self) -> int:
        return GRANULARITIES[self.granularity][1]

    @property
    def packed(self) -> bool:
        """Sub-byte types are handled in ONNX's packed layout, as ONNX Runtime holds them."""
        return self.element.bits < 8

    def opset(self) -> int:
        """The oldest opset whose operators accept this type and granularity, and x of every :data:`X_DTYPES` type.

        19: QuantizeLinear takes float16 and bfloat16 x from version 19; 21: ``block_size``.
        """
        return max(type_opset(self.type_name), 19, 21 if self.block_size else 0)


def cases(types: tuple[str, ...] = TYPES, granularities: tuple[str, ...] = tuple(GRANULARITIES)) -> list[Case]:
    return [Case(op, t, g) for t in types for g in granularities for op in ("Q", "DQ")]


def case_groups(types: tuple[str, ...] = TYPES, granularities: tuple[str, ...] = tuple(GRANULARITIES)) -> list[Case]:
    """One case for each type and granularity (its Q), for modes that time Q and DQ of one input together."""
    return [c for c in cases(types, granularities) if c.op == "Q"]


# x's types the benchmark takes (``--x-dtype``); the scale has x's type, as ONNX asks.
X_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@functools.lru_cache(maxsize=1)
def _shared_x(size: int, seed: int, x_dtype: str) -> np.ndarray:
    """The x every case of one size and type shares, made once (a few hundred ms at 16M elements).

    Left writeable: numba compiles a read-only array as another type.
    """
    x = np.random.default_rng(seed).standard_normal((max(1, size // COLUMNS), COLUMNS), dtype=np.float32)
    return x.astype(X_DTYPES[x_dtype], copy=False)


def inputs(case: Case, size: int, seed: int = 0, x_dtype: str = "float32") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, scale, zero_point)`` for ``case``: x of ``size`` elements as (rows, COLUMNS), the same for every case, and a scale of x's type."""
    x = _shared_x(size, seed, x_dtype)
    shape = x.shape
    rng = np.random.default_rng([seed, 1])
    axis, block = case.axis, case.block_size
    if case.granularity == "per-tensor":
        sshape: tuple[int, ...] = ()
    elif block:
        sshape = tuple(-(-d // block) if i == axis else d for i, d in enumerate(shape))
    else:
        sshape = (shape[axis],)
    t = case.element
    top = t.qmax if t.is_integer else t.max_finite
    scale = (rng.uniform(3.0, 5.0, sshape) / top).astype(x.dtype)
    zp = np.zeros(sshape, t.dtype)
    if t.name == "uint8":
        zp[...] = 128
    return x, np.asarray(scale), np.asarray(zp)


def qlinear_calls(case: Case, x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> tuple[Callable[[], Any], ...]:
    """Q and DQ calls for ``case`` on the cpu backend (into reused buffers, then allocating), and DQ's input."""
    kw = dict(axis=case.axis, block_size=case.block_size, backend="cpu")  # the kernels, however small the size
    q = quantize_linear(x, scale, zp, packed=case.packed, **kw)
    # Outputs go to reused buffers, as ONNX Runtime's arena reuses its memory:
    # a fresh 64 MB array costs page faults that would dominate the timing.
    q_out, dq_out = np.empty_like(q), np.empty_like(x)

    def run_q():
        return quantize_linear(x, scale, zp, packed=case.packed, out=q_out, **kw)

    def run_dq(out=dq_out):
        if case.packed:
            return dequantize_linear(q, scale, zp, packed_dtype=case.type_name, shape=x.shape, out=out, **kw)
        return dequantize_linear(q, scale, zp, out=out, **kw)

    def allocating_q():
        return quantize_linear(x, scale, zp, packed=case.packed, **kw)

    return run_q, run_dq, allocating_q, lambda: run_dq(None), q
