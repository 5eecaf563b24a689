"""The rows a convolution's filters meet: its input's patches, and their Gram matrix (GPTQ for a Conv).

A Conv computes each output position as the product of its filters with the
patch of input under them (``groups`` apart: each group's filters meet
only its channels). So rounding a Conv's weight changes its output as a
MatMul's would, with the patches as rows: the Gram matrix of those rows,
``X^T X`` over ``(channels of a group) x kernel`` columns, is what GPTQ
needs. The rows are gathered at sampled output positions only
(:data:`ROWS_A_SAMPLE`), never as the whole unfolded input, which would take
the kernel's size times the activation's bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from qlinear.quantize._model import attribute

__all__ = ["ROWS_A_SAMPLE", "Patches", "patch_gram", "patches_of"]

# Output positions a sample contributes to a Gram matrix of K columns: K / 8 of them, within these bounds. A
# Conv's input at 160 x 160 has 25,600 positions, and gathering and multiplying rows costs rows x K (x K); a few
# hundred calibration samples at K / 8 rows a sample give tens of K rows, which estimate the matrix well.
ROWS_A_SAMPLE = (16, 128)


@dataclass(frozen=True)
class Patches:
    """How a Conv reads ``tensor``: its kernel, strides, padding, dilations and groups (ONNX's attributes)."""

    tensor: str
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # the begins of every spatial axis, then their ends (ONNX's order); with auto_pad NOTSET
    dilations: tuple[int, ...]
    groups: int
    auto_pad: str = "NOTSET"

    @property
    def key(self) -> str:
        """The name its Gram matrix is kept under (two Convs that read the same patches share it)."""
        parts = ",".join("x".join(map(str, v)) for v in (self.kernel, self.strides, self.pads, self.dilations))
        return f"patches({parts},g{self.groups},{self.auto_pad}):{self.tensor}"

    @property
    def columns(self) -> int:
        """The kernel's positions: a group's Gram matrix has (channels of the group) x this many columns."""
        return math.prod(self.kernel)


def patches_of(node: onnx.NodeProto, weight_shape: tuple[int, ...]) -> Patches | None:
    """How Conv ``node`` (whose weight has ``weight_shape``) reads its input, or None for another op."""
    if node.op_type != "Conv" or len(weight_shape) < 3:
        return None
    kernel = tuple(int(k) for k in weight_shape[2:])
    rank = len(kernel)
    auto_pad = attribute(node, "auto_pad", b"NOTSET")
    return Patches(
        tensor=node.input[0],
        kernel=kernel,
        strides=tuple(int(s) for s in attribute(node, "strides", [1] * rank)),
        pads=tuple(int(p) for p in attribute(node, "pads", [0] * 2 * rank)),
        dilations=tuple(int(d) for d in attribute(node, "dilations", [1] * rank)),
        groups=int(attribute(node, "group", 1)),
        auto_pad=auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad),
    )


def _pads(p: Patches, spatial: tuple[int, ...]) -> list[tuple[int, int]]:
    """(begin, end) of each spatial axis, as ONNX's Conv pads an input of these dimensions."""
    rank = len(p.kernel)
    if p.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, p.kernel, p.strides, p.dilations, strict=True):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            out.append((small, total - small) if p.auto_pad == "SAME_UPPER" else (total - small, small))
        return out
    if p.auto_pad == "VALID":
        return [(0, 0)] * rank
    return [(p.pads[i], p.pads[rank + i]) for i in range(rank)]


def patch_gram(x: np.ndarray, p: Patches) -> tuple[np.ndarray, int]:
    """``X^T X`` (float64, ``(groups, K, K)``, K = channels of a group x kernel positions) of ``x``'s patches, and its rows.

    ``x``: the Conv's input, ``(N, C, *spatial)``. Rows are the patches at up
    to K / 8 (:data:`ROWS_A_SAMPLE`) x N output positions, drawn without replacement
    by a generator seeded with the number of positions, so a batch gives the
    same matrix in whichever process reduces it. The product runs in
    float32 (BLAS's single-precision speed; a batch's sum of a few thousand
    rows loses nothing GPTQ's damping does not swamp), returned as float64
    for the sum over batches.
    """
    x = np.asarray(x)
    pads = _pads(p, x.shape[2:])
    spatial = [
        (size + begin + end - (k - 1) * d - 1) // s + 1
        for size, (begin, end), k, s, d in zip(x.shape[2:], pads, p.kernel, p.strides, p.dilations, strict=True)
    ]
    positions = (x.shape[0], *spatial)
    count = math.prod(positions)
    k = x.shape[1] // p.groups * p.columns
    most = min(max(k // 8, ROWS_A_SAMPLE[0]), ROWS_A_SAMPLE[1]) * x.shape[0]
    chosen = np.arange(count)
    if count > most:
        chosen = np.sort(np.random.default_rng(count).choice(count, most, replace=False))
    at = np.unravel_index(chosen, positions)
    # Each kernel position's input values at the chosen outputs, (rows, C) a time: no padded copy of the input.
    rows = np.zeros((len(chosen), x.shape[1], *p.kernel), np.float32)
    for offset in np.ndindex(*p.kernel):
        coords = [
            o * s - begin + j * d for o, s, (begin, _), j, d in zip(at[1:], p.strides, pads, offset, p.dilations, strict=True)
        ]
        inside = np.logical_and.reduce([(c >= 0) & (c < size) for c, size in zip(coords, x.shape[2:], strict=True)])
        clipped = [np.clip(c, 0, size - 1) for c, size in zip(coords, x.shape[2:], strict=True)]
        values = x[(at[0], slice(None), *clipped)]  # (rows, C): the advanced indices' axis comes first
        values[~inside] = 0  # a padded zero
        rows[(slice(None), slice(None), *offset)] = values
    rows = rows.reshape(len(chosen), p.groups, -1)
    if p.groups == 1:
        flat = rows[:, 0]
        return (flat.T @ flat)[None].astype(np.float64), len(chosen)
    grouped = np.ascontiguousarray(rows.transpose(1, 0, 2))  # (groups, rows, K)
    return np.matmul(grouped.transpose(0, 2, 1), grouped).astype(np.float64), len(chosen)
