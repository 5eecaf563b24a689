"""GPTQ: weights rounded one input row at a time, each row's rounding error spread over the rows not yet rounded.

For a layer ``y = x W`` (``W``: K inputs x N outputs) and the Gram matrix
``H = X^T X`` of its inputs on the calibration data, rounding row ``k`` of
``W`` changes the output by ``x_k (q_k - w_k)``; the rows after ``k`` are
moved to cancel as much of that as the inputs' correlations allow
(``W[k+1:] -= Hinv[k, k+1:]^T (w_k - q_k) / Hinv[k, k]``, with ``Hinv`` the
upper Cholesky factor of ``H^-1``). The output error on the calibration
data falls well below plain rounding's at the same bits (Frantar et al.,
"GPTQ", 2022, Algorithm 1). Here:

- the updates of a batch of rows are applied to the rest at once, as one
  matrix product (numpy/BLAS): a layer costs a few products of K x K by
  K x N, not a Python loop over elements;
- blocked weights take each block's scale from the block's rows as they
  stand when the block is reached (already moved by the rows before);
  per-channel weights take their scales from the original weights; with
  ``--weight-clip mse`` each range is first shrunk to the one with the
  least rounding error (:func:`._choose.clipped_range`), as without GPTQ;
- the result is the dequantized weight and its parameters: quantizing it
  again with those parameters (:func:`qlinear.quantize_linear`) gives the
  same codes, so the stored model is written by the same path as every
  other weight.

Integer types only (2, 4 and 8 bits); float weight types keep plain rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qlinear.dtypes import ElementType
from qlinear.quantize._choose import QuantParams, clipped_range, scale_and_zero_point, symmetric_weights
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._registry import Algorithm, Calibrated, Facts, Needs, register

__all__ = ["DAMPING", "gram_inputs", "gptq_weight", "layer_input"]

DAMPING = 0.01  # share of the mean diagonal added to H, for a stable inverse
_LAZY_ROWS = 128  # rows whose updates are applied to the rest together


def layer_input(fm, node: onnx.NodeProto) -> str | None:
    """The activation whose Gram matrix GPTQ needs for ``node``: a MatMul's or Gemm's first input, rows along its last axis."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in fm.initializers:
        return None
    if node.input[0] in fm.initializers:
        return None
    if node.op_type == "Gemm" and any(a.name == "transA" and helper.get_attribute_value(a) for a in node.attribute):
        return None  # its rows run along the first axis
    return node.input[0]


def gram_inputs(fm, nodes: list[onnx.NodeProto]) -> Needs:
    """The inputs whose Gram matrices GPTQ needs for ``nodes`` (each once)."""
    return Needs(gram_tensors=tuple(dict.fromkeys(t for t in (layer_input(fm, n) for n in nodes) if t is not None)))


def _rounds(fm, p, w: np.ndarray, t: ElementType, options, calibrated: Calibrated):
    """GPTQ's rounding of the layer's weight, or None (no Gram matrix, or a layout it does not take)."""
    if p.weight.index != 1 or w.dtype != np.float32:
        return None
    source = layer_input(fm, fm.node(p.name))
    gram = calibrated.grams.get(source) if source is not None else None
    if gram is None:
        return None
    return gptq_weight(
        w, gram, t, granularity=options.granularity, channel_axis=p.weight.channel_axis,
        reduction_axis=p.weight.reduction_axis, block_size=options.block_size, clip=options.weight_clip,
        weight_only=p.activation_type is None,
    )  # fmt: skip


def gptq_weight(
    w: np.ndarray,
    gram: np.ndarray,
    t: ElementType,
    *,
    granularity: str,
    channel_axis: int,
    reduction_axis: int,
    block_size: int,
    clip: str = "minmax",
    weight_only: bool = False,
) -> tuple[np.ndarray, QuantParams, int, int] | None:
    """``(dequantized weight, params, axis, block_size)`` for a 2-D weight, or None where GPTQ does not apply.

    ``gram``: ``X^T X`` of the layer's input over the calibration data
    (K x K, K the weight's length along ``reduction_axis``); ``weight_only``:
    the node's activations stay float (see :func:`symmetric_weights`).
    """
    if w.ndim != 2 or not t.is_integer or granularity not in ("per-channel", "blocked"):
        return None
    reduction_axis %= 2
    k = w.shape[reduction_axis]
    if gram.shape != (k, k):
        return None
    # Rows along the reduction axis: W is (K, N).
    weight = np.asarray(w, np.float64)
    weight = weight if reduction_axis == 0 else weight.T
    symmetric = symmetric_weights(t, weight_only=weight_only)
    block = block_size if granularity == "blocked" else 0
    q, scale, zero = _gptq(weight, np.array(gram, np.float64), t, block, symmetric, clip == "mse")
    if granularity == "per-channel":
        params = QuantParams(scale[0].astype(np.float32), zero[0].astype(t.dtype))
        axis = channel_axis % 2
    else:
        # (blocks, N) in (K, N) orientation; the DequantizeLinear's scale has the weight's own orientation.
        s, z = (scale, zero) if reduction_axis == 0 else (scale.T, zero.T)
        params = QuantParams(np.ascontiguousarray(s, np.float32), np.ascontiguousarray(z).astype(t.dtype))
        axis = reduction_axis
    out = q if reduction_axis == 0 else q.T
    return np.ascontiguousarray(out, np.float32), params, axis, block


def _gptq(w: np.ndarray, h: np.ndarray, t: ElementType, block: int, symmetric: bool, clip: bool):
    """GPTQ on ``w`` (K, N): the dequantized weight and the scales/zero points, one row of them a block (or one row)."""
    k, n = w.shape
    w = w.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[dead, :] = 0.0
    h[np.diag_indices(k)] += DAMPING * float(np.mean(np.diag(h)))
    hinv = _upper_cholesky_of_inverse(h)
    nblocks = -(-k // block) if block else 1
    scales = np.ones((nblocks, n))
    zeros = np.zeros((nblocks, n))
    if not block:
        scales[0], zeros[0] = _params(w, t, symmetric, clip)
    q = np.zeros_like(w)
    lazy = _LAZY_ROWS if not block else block * max(1, _LAZY_ROWS // block)
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        w1 = w[i1:i2].copy()
        err1 = np.zeros_like(w1)
        h1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            row = i1 + i
            if block and row % block == 0:
                # The block's scale from its rows as they stand now (all inside this batch: lazy is a multiple of block).
                scales[row // block], zeros[row // block] = _params(w1[i : i + block], t, symmetric, clip)
            s, z = scales[row // block if block else 0], zeros[row // block if block else 0]
            qrow = (np.clip(np.rint(w1[i] / s) + z, t.qmin, t.qmax) - z) * s
            q[row] = qrow
            err = (w1[i] - qrow) / h1[i, i]
            w1[i:] -= np.outer(h1[i, i:], err)
            err1[i] = err
        w[i2:] -= hinv[i1:i2, i2:].T @ err1
    return q, scales, zeros


def _params(rows: np.ndarray, t: ElementType, symmetric: bool, clip: bool):
    """Scale and zero point of each column of ``rows`` (its min-max range, or the clipped one)."""
    low, high = rows.min(axis=0), rows.max(axis=0)
    if clip:
        low, high = clipped_range(rows.T, low, high, t, symmetric)
    return scale_and_zero_point(low, high, t, symmetric)


def _upper_cholesky_of_inverse(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor of ``h^-1`` (``h`` symmetric positive definite)."""
    lower = np.linalg.cholesky(h)
    inv_lower = np.linalg.solve(lower, np.eye(h.shape[0]))
    hinv = inv_lower.T @ inv_lower  # h^-1
    return np.linalg.cholesky(hinv).T


def _default(options, facts: Facts) -> bool:
    low_bits = options.weight_type.is_integer and options.weight_type.bits <= 4
    return facts.has_inputs and low_bits and options.granularity != "per-tensor"


ALGORITHM = register(
    Algorithm(
        name="gptq",
        summary="round MatMul and Gemm weights by GPTQ, from the Gram matrix of each layer's input, instead of to nearest",
        stage="calibration",
        fields=(
            (
                "gptq",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="round MatMul/Gemm weights by GPTQ instead of to nearest (default: on for 2/4-bit integer weights "
                    "with calibration data)",
                ),
            ),
        ),
        default=_default,
        calibrates=gram_inputs,
        rounds=_rounds,
    )
)
