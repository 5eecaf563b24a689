"""ONNX QuantizeLinear, every version and domain."""

from __future__ import annotations

from typing import Any

import numpy as np

from qlinear.dtypes import packed_size
from qlinear.kernels import quantize as _quantize
from qlinear.ops._buffers import apart_from_out, check_out, check_packable
from qlinear.spec import plan_quantize

__all__ = ["quantize_linear"]


def quantize_linear(
    x: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    saturate: bool = True,
    precision: Any = None,
    opset: int | None = None,
    domain: str = "",
    packed: bool = False,
    out: np.ndarray | None = None,
    backend: str = "auto",
) -> np.ndarray:
    """ONNX QuantizeLinear, all versions: ``y = saturate(round(x / y_scale) + y_zero_point)``.

    The division is done in the scale's type, or in ``precision``; ``round``
    is half to even for integer outputs and the conversion to the output
    type (round to nearest even, ONNX's cast tables) for float outputs.

    Args:
        x: the full-precision array (float32, float16, bfloat16 or int32, as
            the version allows).
        y_scale: scalar (per-tensor), 1-D along ``axis`` (per-axis), or the
            shape of ``x`` with ``ceil(D/block_size)`` along ``axis`` (blocked).
        y_zero_point: same shape as ``y_scale``; its type is the output type.
            Python numbers and lists take the types the defaults give: x
            float32, the scale x's float type, the zero point
            ``output_dtype`` or uint8 (docs/semantics.md).
        axis: quantization axis for per-axis and blocked; negative counts
            from the back.
        block_size: elements per block along ``axis``; 0 means not blocked.
        output_dtype: output type when there is no zero point (ONNX name,
            dtype or TensorProto enum); default uint8.
        saturate: float8 outputs clamp out-of-range values to the largest
            finite value (True) or follow ONNX's non-saturating table.
        precision: type in which ``x / y_scale`` is computed.
        opset: apply the version in force at this opset; None is the newest.
        domain: ``""`` for ai.onnx or ``"com.microsoft"``.
        packed: return a 2/4/6-bit result as ONNX's packed bytes (flat
            uint8, as :func:`qlinear.pack` lays them out) instead of one
            element per value.
        out: array to write the result into and return: the result's dtype
            and shape (``(packed_size,)`` uint8 when ``packed``), writeable,
            C-contiguous. It may share memory with ``x`` or the parameters:
            those are then copied first, and the result is the same.
        backend: ``"auto"`` (the default: ``"reference"`` when ``x`` has
            fewer than ``qlinear.kernels.AUTO_REFERENCE_BELOW`` elements, so
            that small calls need not start numba, else ``"cpu"``),
            ``"cpu"`` (fused multi-threaded numba kernels) or
            ``"reference"`` (the readable numpy oracle); all give the same
            bits.

    Returns:
        The quantized array, one element per value (ml_dtypes for sub-byte
        and float8 types), or its packed bytes.

    Raises:
        QuantizationError: any input the chosen version does not allow, a
            non-packable type with ``packed``, or an unfit ``out``.

    >>> quantize_linear(np.array([0.0, 1.5, 2.5, 300.0], np.float32), np.float32(1.0)).tolist()
    [0, 2, 2, 255]
    >>> quantize_linear(np.array([1.0, -1.0, 3.0], np.float32), np.float32(1.0), output_dtype="int4", packed=True).tolist()
    [241, 3]
    >>> quantize_linear([0.0, 0.1, 0.2], 0.05, 128).tolist()
    [128, 130, 132]
    """
    plan, x, y_scale, y_zero_point = plan_quantize(
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        saturate=saturate,
        precision=precision,
        opset=opset,
        domain=domain,
    )
    caller = "quantize_linear"
    t = plan.output_type
    if packed:
        check_packable(t, caller)
        out = check_out(out, np.dtype(np.uint8), (packed_size(x.size, t.bits),), caller)
    else:
        out = check_out(out, t.dtype, x.shape, caller)
    x, y_scale, y_zero_point = apart_from_out(out, x, y_scale, y_zero_point)
    return _quantize(backend, plan, x, y_scale, y_zero_point, out=out, packed=bool(packed), caller=caller)
