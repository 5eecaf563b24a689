"""A MatMul + Add over an input of rank 3 or more as ONNX Runtime fuses it: ``Reshape -> Gemm -> Reshape``.

The prepare pass's MatMul + Add rewrite (:func:`._prepare.matmul_add_to_gemm`)
puts these nodes in place of the pair, so the Gemm takes an int32 bias.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qlinear.quantize._model import reserve_name

__all__ = ["gemm_between_open_reshapes", "gemm_between_reshapes"]


def gemm_between_reshapes(
    g: onnx.GraphProto, matmul: onnx.NodeProto, add: onnx.NodeProto, bias: str, a_shape: tuple, n: int, taken: set[str]
) -> list[onnx.NodeProto]:
    """``Reshape(A, (M, K)) -> Gemm(W, bias) -> Reshape(..., (..., N))`` for a MatMul + Add whose ``A`` has a fixed shape.

    ONNX Runtime makes the same of it (its MatMul + Add fusion, for inputs of
    fixed shape): as a MatMul there it became a Gemm behind a Reshape, with a
    float bias and no QuantizeLinear after it, which no integer kernel takes.
    """

    fresh = functools.partial(reserve_name, taken=taken)

    rows, cols = int(np.prod(a_shape[:-1])), a_shape[-1]
    shape_in, shape_out = fresh(f"{matmul.name}_rows_shape"), fresh(f"{matmul.name}_out_shape")
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([rows, cols], np.int64), shape_in),
            numpy_helper.from_array(np.array([*a_shape[:-1], n], np.int64), shape_out),
        ]
    )
    a2, y2 = fresh(f"{matmul.input[0]}_rows"), fresh(f"{add.output[0]}_rows")
    return [
        helper.make_node("Reshape", [matmul.input[0], shape_in], [a2], name=fresh(f"{matmul.name}_rows")),
        helper.make_node("Gemm", [a2, matmul.input[1], bias], [y2], name=matmul.name),
        helper.make_node("Reshape", [y2, shape_out], [add.output[0]], name=fresh(f"{matmul.name}_restore")),
    ]


def gemm_between_open_reshapes(
    g: onnx.GraphProto,
    matmul: onnx.NodeProto,
    add: onnx.NodeProto,
    bias: str,
    weight_shape: tuple[int, int],
    opset: int,
    taken: set[str],
    leading: dict[str, tuple[str, str]],
) -> list[onnx.NodeProto]:
    """``Reshape(A, (-1, K)) -> Gemm(W, bias) -> Reshape(..., (A's leading dimensions, N))`` for an ``A`` of open shape.

    A transformer exported with a dynamic batch or sequence length: as a
    MatMul, ONNX Runtime ran it as MatMulIntegerToFloat and the bias as a
    float Add over the whole output; as a Gemm the int32 bias is added in
    QGemm's accumulator. The rows and the leading dimensions (``Shape``,
    and ``Slice`` before opset 15) are made once for every Gemm reading
    ``A``, as q, k and v read one LayerNorm: one Reshape, so one
    QuantizeLinear, and SmoothQuant sees the three layers together.
    """
    fresh = functools.partial(reserve_name, taken=taken)
    a = matmul.input[0]
    k, n = weight_shape
    nodes = []
    if a not in leading:
        rows, rows_shape, lead = fresh(f"{a}_rows"), fresh(f"{a}_rows_shape"), fresh(f"{a}_leading")
        g.initializer.append(numpy_helper.from_array(np.array([-1, k], np.int64), rows_shape))
        if opset >= 15:  # Shape takes start and end from opset 15
            nodes.append(helper.make_node("Shape", [a], [lead], name=fresh(f"{a}_leading"), end=-1))
        else:
            shape, start, end = fresh(f"{a}_shape"), fresh(f"{a}_leading_start"), fresh(f"{a}_leading_end")
            g.initializer.extend([numpy_helper.from_array(np.array([v], np.int64), t) for v, t in ((0, start), (-1, end))])
            nodes.append(helper.make_node("Shape", [a], [shape], name=fresh(f"{a}_shape")))
            nodes.append(helper.make_node("Slice", [shape, start, end], [lead], name=fresh(f"{a}_leading")))
        # The Reshape reads A last: ONNX Runtime then lets its output alias A's buffer instead of copying it.
        nodes.append(helper.make_node("Reshape", [a, rows_shape], [rows], name=fresh(f"{a}_rows")))
        leading[a] = (rows, lead)
    rows, lead = leading[a]
    width, y2, out_shape = fresh(f"{matmul.name}_width"), fresh(f"{add.output[0]}_rows"), fresh(f"{matmul.name}_out_shape")
    g.initializer.append(numpy_helper.from_array(np.array([n], np.int64), width))
    return [
        *nodes,
        helper.make_node("Gemm", [rows, matmul.input[1], bias], [y2], name=matmul.name),
        helper.make_node("Concat", [lead, width], [out_shape], name=fresh(f"{matmul.name}_out_shape"), axis=0),
        helper.make_node("Reshape", [y2, out_shape], [add.output[0]], name=fresh(f"{matmul.name}_restore")),
    ]
