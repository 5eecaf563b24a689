"""Bias correction: the mean error a quantized weight adds to a layer's output, taken back out through its bias.

With ``W_q`` the dequantized weight and ``E[x]`` the mean of the layer's
input on the calibration data (per input channel), the quantized layer's
output is off on average by ``(W_q - W) E[x]`` per output channel; that
shift is subtracted from the bias, so the output's mean error is zero on
the calibration data (exactly for Gemm and MatMul; for Conv up to the
borders zero padding touches). Applied to:

- Conv: its bias (one is added where there is none);
- Gemm: its C when that is one value per output (added where there is none);
- MatMul on a 2-D weight followed by an Add of a constant vector (the
  bias of a linear layer on 3-D activations): that vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qlinear.quantize._model import FloatModel, attribute
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._registry import Algorithm, Calibrated, Needs, register

__all__ = ["BiasSite", "input_channel_axes", "output_shift", "site"]


@dataclass(frozen=True)
class BiasSite:
    """Where a node's output shift goes: its own bias input (``add`` None), or the constant input ``index`` of Add ``add``."""

    tensor: str | None  # the float vector corrected (None: the node has no bias yet)
    add: str | None = None
    index: int = 0


def input_channel_axes(fm: FloatModel, nodes: list[onnx.NodeProto], options=None) -> Needs:
    """The activation input of each node that bias correction can serve, and the axis its channels lie on (under any options)."""
    axes = {}
    for node in nodes:
        if not node.input or node.input[0] in fm.initializers:
            continue
        if node.op_type == "Conv":
            axes[node.input[0]] = 1
        elif node.op_type == "Gemm":
            axes[node.input[0]] = 0 if attribute(node, "transA", 0) else 1
        elif node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in fm.initializers:
            axes[node.input[0]] = -1
    return Needs(channel_axes=axes)


def site(fm: FloatModel, node: onnx.NodeProto, channels: int) -> BiasSite | None:
    """Where ``node``'s correction can go, or None (no place that holds one value per output channel)."""
    op = node.op_type
    if op in ("Conv", "Gemm"):
        if len(node.input) < 3 or not node.input[2]:
            return BiasSite(None)
        b = node.input[2]
        if b in fm.initializers and fm.shapes.get(b) == (channels,) and fm.is_float(b):
            return BiasSite(b)
        return None
    if op == "MatMul":
        users = fm.consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in fm.output_names:
            return None
        add = users[0]
        k = 1 - list(add.input).index(node.output[0])
        other = add.input[k]
        if other in fm.initializers and fm.shapes.get(other) == (channels,) and fm.is_float(other):
            # The vector must serve this Add alone: it is changed.
            if len(fm.consumers.get(other, [])) == 1:
                return BiasSite(other, add.name, k)
    return None


def output_shift(node: onnx.NodeProto, weight_error: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """``(W_q - W) E[x]``, one value per output channel, as the node's bias would take it; None where the layout is not one handled."""
    op, dw, mean = node.op_type, weight_error.astype(np.float64), mean.astype(np.float64)
    if op == "Conv":
        groups = attribute(node, "group", 1)
        out_channels, per_group = dw.shape[0], dw.shape[1]
        if mean.shape != (groups * per_group,):
            return None
        summed = dw.reshape(out_channels, per_group, -1).sum(axis=2)  # (O, C/g): the kernel's taps all see the channel mean
        group_means = mean.reshape(groups, per_group)[np.arange(out_channels) // (out_channels // groups)]
        return (summed * group_means).sum(axis=1)
    if op == "Gemm":
        b = dw.T if attribute(node, "transB", 0) else dw  # (K, N)
        if mean.shape != (b.shape[0],):
            return None
        beta = attribute(node, "beta", 1.0)
        if beta == 0:
            return None  # C is not added at all
        return attribute(node, "alpha", 1.0) * (mean @ b) / beta
    if op == "MatMul" and dw.ndim == 2 and mean.shape == (dw.shape[0],):
        return mean @ dw
    return None


def _corrects(fm: FloatModel, p, calibrated: Calibrated):
    """The layer's correction as a function of its weight's error, or None (no calibrated input mean)."""
    if p.weight.index != 1:
        return None
    mean = calibrated.means.get(fm.node_inputs(p.name)[0])
    if mean is None:
        return None
    node = fm.node(p.name)

    def shift_of(error: np.ndarray) -> tuple[np.ndarray, BiasSite] | None:
        shift = output_shift(node, error, mean)
        if shift is None:
            return None
        where = site(fm, node, shift.shape[0])
        # A MatMul without an Add after it has nowhere to take a bias (a Conv or Gemm is given one).
        if where is None or (where.tensor is None and where.add is None and node.op_type not in ("Conv", "Gemm")):
            return None
        return shift, where

    return shift_of


ALGORITHM = register(
    Algorithm(
        name="bias_correction",
        summary="take the mean error each quantized weight adds to its layer's output back out through the bias",
        stage="calibration",
        fields=(
            (
                "bias_correction",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="take each quantized weight's mean output error back out through the layer's bias "
                    "(default: on with calibration data)",
                ),
            ),
        ),
        # It reads the calibration inputs' per-channel means: on wherever there are inputs.
        default=lambda options, facts: facts.has_inputs,
        calibrates=input_channel_axes,
        corrects=_corrects,
    )
)
