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

A Conv is the same layer with its input's patches as rows
(:mod:`qlinear.quantize._patches`): each group of its filters is rounded
against the Gram matrix of the patches of its group's channels, per output
channel (a depthwise Conv's filters one channel at a time). A Conv whose
group's patches are wider than :data:`MAX_PATCH_COLUMNS` rounds to nearest:
its Gram matrices would take more memory than its weight saves time. So
does a Conv where bias correction is on: GPTQ's objective holds the input's
mean already (its Gram matrix is not centred), and bias correction, which
takes every kernel position to meet the channel's mean, moves GPTQ's
errors on kernel positions that mostly read padding into the bias (on the
text direction classifier's small feature maps, int8 weight-only: round to
nearest 33.0 dB, GPTQ 35.1 dB, GPTQ then bias correction 26.5 dB).

Integer types only (2, 4 and 8 bits); float weight types keep plain rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qlinear.dtypes import ElementType
from qlinear.quantize._choose import QuantParams, clipped_range, scale_and_zero_point, symmetric_weights
from qlinear.quantize._option_fields import option
from qlinear.quantize._patches import Patches, patches_of
from qlinear.quantize._weight_search import searched_params
from qlinear.quantize.algorithms._registry import Algorithm, Calibrated, Facts, Needs, register

__all__ = ["DAMPING", "MAX_PATCH_COLUMNS", "conv_patches", "gptq_conv_weight", "gram_inputs", "gptq_weight", "layer_input"]

DAMPING = 0.01  # share of the mean diagonal added to H, for a stable inverse
_LAZY_ROWS = 128  # rows whose updates are applied to the rest together
MAX_PATCH_COLUMNS = 4608  # a group's patch width at most (3 x 3 x 512): its Gram matrix is 170 MB in float64
# Rows a Conv's Gram matrix must sum for each of its columns. A squeeze-and-excitation Conv sees one position a
# sample: 400 calibration samples give 400 rows for its 200 columns, a matrix GPTQ would fit the samples to, not the
# layer. A precaution (the rows are counted for patches only; a MatMul's tokens are many).
ROWS_A_COLUMN = 16


def layer_input(fm, node: onnx.NodeProto) -> str | None:
    """The activation whose Gram matrix GPTQ needs for ``node``: a MatMul's or Gemm's first input, rows along its last axis."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in fm.initializers:
        return None
    if node.input[0] in fm.initializers:
        return None
    if node.op_type == "Gemm" and any(a.name == "transA" and helper.get_attribute_value(a) for a in node.attribute):
        return None  # its rows run along the first axis
    return node.input[0]


def conv_patches(fm, node: onnx.NodeProto) -> Patches | None:
    """How a Conv with a constant weight reads its input, where GPTQ takes it (not too wide a group), else None."""
    if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in fm.initializers or node.input[0] in fm.initializers:
        return None
    shape = tuple(fm.initializers[node.input[1]].dims)
    patches = patches_of(node, shape)
    if patches is None or shape[1] * patches.columns > MAX_PATCH_COLUMNS:
        return None
    return patches


def _rounds_convs(options) -> bool:
    """Whether GPTQ rounds Convs under ``options``: per channel, and with bias correction off (see the module's doc)."""
    return options.granularity == "per-channel" and not options.bias_correction


def gram_inputs(fm, nodes: list[onnx.NodeProto], options) -> Needs:
    """The inputs (and Convs' input patches, where it rounds Convs) whose Gram matrices GPTQ needs for ``nodes`` (each once)."""
    convs = nodes if _rounds_convs(options) else []
    return Needs(
        gram_tensors=tuple(dict.fromkeys(t for t in (layer_input(fm, n) for n in nodes) if t is not None)),
        gram_patches=tuple(dict.fromkeys(p for p in (conv_patches(fm, n) for n in convs) if p is not None)),
    )


def _rounds(fm, p, w: np.ndarray, t: ElementType, options, calibrated: Calibrated):
    """GPTQ's rounding of the layer's weight, or None (no Gram matrix, or a layout it does not take)."""
    if p.weight.index != 1 or w.dtype != np.float32:
        return None
    node = fm.node(p.name)
    if node.op_type == "Conv":
        patches = conv_patches(fm, node)
        gram = _enough(calibrated, patches.key) if patches is not None else None
        if gram is None or not _rounds_convs(options):
            return None
        return gptq_conv_weight(w, gram, t, clip=options.weight_clip, weight_only=p.activation_type is None)
    source = layer_input(fm, node)
    gram = _enough(calibrated, source) if source is not None else None
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
    q, scale, zero = (v[0] for v in _gptq(weight[None], np.array(gram, np.float64)[None], t, block, symmetric, clip))
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


def _enough(calibrated: Calibrated, key: str) -> np.ndarray | None:
    """The Gram matrix kept under ``key``, where it sums at least :data:`ROWS_A_COLUMN` rows a column (or its rows were not counted)."""
    gram = calibrated.grams.get(key)
    rows = calibrated.gram_rows.get(key)
    if gram is None or (rows is not None and rows < ROWS_A_COLUMN * gram.shape[-1]):
        return None
    return gram


def gptq_conv_weight(
    w: np.ndarray, gram: np.ndarray, t: ElementType, *, clip: str = "minmax", weight_only: bool = False
) -> tuple[np.ndarray, QuantParams, int, int] | None:
    """``(dequantized weight, params, 0, 0)`` for a Conv's weight, per output channel, or None where GPTQ does not apply.

    ``w``: ``(C_out, C_in / groups, *kernel)``; ``gram``: ``(groups, K, K)``
    from :func:`qlinear.quantize._patches.patch_gram`, K = ``C_in / groups``
    x the kernel's positions.
    """
    groups = gram.shape[0]
    out_channels, k = w.shape[0], int(np.prod(w.shape[1:]))
    if not t.is_integer or out_channels % groups or gram.shape[1:] != (k, k):
        return None
    symmetric = symmetric_weights(t, weight_only=weight_only)
    # Each group's filters against its channels' patches, all groups at once: (groups, K, filters of a group).
    layers = np.asarray(w, np.float64).reshape(groups, out_channels // groups, k).transpose(0, 2, 1)
    q, scale, zero = _gptq(layers, np.array(gram, np.float64), t, 0, symmetric, clip)
    params = QuantParams(scale.reshape(out_channels).astype(np.float32), zero.reshape(out_channels).astype(t.dtype))
    return np.ascontiguousarray(q.transpose(0, 2, 1).reshape(w.shape), np.float32), params, 0, 0


def _gptq(w: np.ndarray, h: np.ndarray, t: ElementType, block: int, symmetric: bool, clip: str):
    """GPTQ on ``w`` (G, K, N): G layers at once, each against its own ``h`` (G, K, K).

    Gives the dequantized weights and the scales/zero points ``(G, blocks, N)``,
    one row of them a block (or one row).
    """
    layers, k, n = w.shape
    w = w.copy()
    dead = np.diagonal(h, axis1=1, axis2=2) == 0  # (G, K): inputs that never saw a value
    diagonal = (slice(None), *np.diag_indices(k))
    h[diagonal] = np.where(dead, 1.0, h[diagonal])
    w[dead] = 0.0
    h[diagonal] += DAMPING * np.mean(h[diagonal], axis=1, keepdims=True)
    hinv = _upper_cholesky_of_inverse(h)
    nblocks = -(-k // block) if block else 1
    scales = np.ones((layers, nblocks, n))
    zeros = np.zeros((layers, nblocks, n))
    if not block:
        scales[:, 0], zeros[:, 0] = _params(w, t, symmetric, clip)
    q = np.zeros_like(w)
    lazy = _LAZY_ROWS if not block else block * max(1, _LAZY_ROWS // block)
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        w1 = w[:, i1:i2].copy()
        err1 = np.zeros_like(w1)
        h1 = hinv[:, i1:i2, i1:i2]
        for i in range(i2 - i1):
            row = i1 + i
            if block and row % block == 0:
                # The block's scale from its rows as they stand now (all inside this batch: lazy is a multiple of block).
                scales[:, row // block], zeros[:, row // block] = _params(w1[:, i : i + block], t, symmetric, clip)
            s, z = scales[:, row // block if block else 0], zeros[:, row // block if block else 0]
            qrow = (np.clip(np.rint(w1[:, i] / s) + z, t.qmin, t.qmax) - z) * s
            q[:, row] = qrow
            err = (w1[:, i] - qrow) / h1[:, i, i, None]
            w1[:, i:] -= h1[:, i, i:, None] * err[:, None, :]
            err1[:, i] = err
        w[:, i2:] -= hinv[:, i1:i2, i2:].transpose(0, 2, 1) @ err1
    return q, scales, zeros


def _params(rows: np.ndarray, t: ElementType, symmetric: bool, clip: str):
    """Scale and zero point of each column of each layer's ``rows`` (G, rows, N), as ``weight_clip`` ``clip`` chooses them."""
    low, high = rows.min(axis=1), rows.max(axis=1)
    if clip == "search" and t.is_integer:
        columns = rows.transpose(0, 2, 1).reshape(-1, rows.shape[1])
        scale, zero_point = searched_params(columns, t.qmin, t.qmax, symmetric)
        return scale.reshape(low.shape), zero_point.reshape(low.shape)
    if clip in ("mse", "search"):
        columns = rows.transpose(0, 2, 1).reshape(-1, rows.shape[1])
        low, high = (v.reshape(low.shape) for v in clipped_range(columns, low.ravel(), high.ravel(), t, symmetric))
    return scale_and_zero_point(low, high, t, symmetric)


def _upper_cholesky_of_inverse(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor of ``h^-1`` for each of the stacked ``h`` (symmetric positive definite)."""
    lower = np.linalg.cholesky(h)
    inv_lower = np.linalg.solve(lower, np.broadcast_to(np.eye(h.shape[-1]), h.shape))
    hinv = inv_lower.transpose(0, 2, 1) @ inv_lower  # h^-1
    return np.linalg.cholesky(hinv).transpose(0, 2, 1)


def _default(options, facts: Facts) -> bool:
    low_bits = options.weight_type.is_integer and options.weight_type.bits <= 4
    return facts.has_inputs and low_bits and options.granularity != "per-tensor"


ALGORITHM = register(
    Algorithm(
        name="gptq",
        summary="round Conv, MatMul and Gemm weights by GPTQ, from the Gram matrix of each layer's input (a Conv's: of "
        "its input patches), instead of to nearest",
        stage="calibration",
        fields=(
            (
                "gptq",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="round Conv/MatMul/Gemm weights by GPTQ instead of to nearest (default: on for 2/4-bit integer weights "
                    "with calibration data)",
                ),
            ),
        ),
        default=_default,
        calibrates=gram_inputs,
        rounds=_rounds,
    )
)
