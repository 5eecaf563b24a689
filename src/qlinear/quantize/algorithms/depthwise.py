"""Depthwise equalization: give every channel of a depthwise convolution's input the same range before quantizing it.

A depthwise convolution filters each channel of its input alone, and the
input is quantized with one scale for all its channels (an integer
convolution takes no other), so a channel whose values span a tenth of
the largest one's keeps a tenth of the levels: in PP-OCRv4's recognizer
the inputs of its depthwise layers span 3 to 16 times the median channel,
and quantize at 26-36 dB of SQNR.

Dividing channel ``c`` of the input by ``s_c`` and multiplying the
depthwise filter of that channel by it leaves the output unchanged, and
the filter is quantized per channel, so its codes are the same but for
their scale. The division goes into the nodes that compute the input
(:func:`~._channel_scaling.fold_into_producer`: a Conv's output channels,
through a Relu or a pool, or a Mul and Add of one constant a channel; a
map of scalars, as a learnable affine block after HardSwish is written,
is folded into the depthwise Conv by the target's prepare pass before this
runs), whose weights are per channel too: the
rewrite costs no weight precision and adds no node. With ``s_c`` the
channel's largest magnitude over the calibration data over the largest of
all channels, every channel spans the same range, and a per-tensor scale
gives each as many levels as per-channel scales would; no channel is
scaled up more than :data:`MOST_GAIN` times, so a channel that is nearly
always zero does not take a filter of nearly zero (and a bias the integer
kernel could not hold). Where the producer cannot take the scale, nothing
changes: a ``Mul`` of its own would run in float between two integer
layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qlinear._errors import QuantizationError
from qlinear.quantize._data import Dataset
from qlinear.quantize._exclusion import excluded_nodes
from qlinear.quantize._model import FloatModel, attribute, index
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._channel_scaling import fold_into_producer, observe
from qlinear.quantize.algorithms._registry import Algorithm, Facts, check_data_read_twice, register
from qlinear.quantize.targets import Target, target

__all__ = ["MOST_GAIN", "EqualizedInput", "DepthwiseEqualized", "equalize_depthwise"]

# The most a channel's range is scaled up by: 5 bits of levels.
MOST_GAIN = 32.0
# Calibration samples the channels' ranges are observed on: a range ratio per channel, not the ranges calibration
# then measures on all the data.
SAMPLES = 256


@dataclass(frozen=True)
class EqualizedInput:
    """One depthwise input equalized: the tensor, its readers, and its widest channel's range over its narrowest's, before."""

    tensor: str
    nodes: list[str]
    spread_before: float


@dataclass(frozen=True)
class DepthwiseEqualized:
    """What the pass did: the inputs equalized, and the depthwise inputs whose producer could not take the scale."""

    inputs: list[EqualizedInput]
    not_folded: list[str]


def sites(fm: FloatModel, excluded: set[str]) -> dict[str, list[onnx.NodeProto]]:
    """Float tensors read only by depthwise Convs with constant weights of their own: tensor -> those Convs.

    ``excluded``: the names of the nodes the user leaves float (their input is theirs as it is).
    """
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in fm.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or node.name in excluded:
            continue
        x, w = node.input[0], node.input[1]
        shape, wshape = fm.shapes.get(x), fm.shapes.get(w)
        if w not in fm.initializers or len(fm.consumers.get(w, [])) != 1 or not shape or not wshape:
            continue
        channels = shape[1] if len(shape) > 2 else None
        if not isinstance(channels, int) or channels < 2 or attribute(node, "group", 1) != channels or wshape[1] != 1:
            continue
        if fm.elem_types.get(x) != onnx.TensorProto.FLOAT or x in fm.initializers:
            continue
        found.setdefault(x, []).append(node)
    return {x: nodes for x, nodes in found.items() if len(fm.consumers.get(x, [])) == len(nodes)}


def equalize_depthwise(
    fm: FloatModel, data: Dataset, *, batch_size: int, excluded: set[str], runtime: Target
) -> DepthwiseEqualized:
    """Equalize the channels of every depthwise input of ``fm`` whose producer takes the scale (``fm`` rewritten in place)."""
    found = sites(fm, excluded)
    if not found:
        return DepthwiseEqualized([], [])
    absmax, _, _ = observe(fm, list(found), data.head(SAMPLES), batch_size, 0, runtime, axis=1)
    done, not_folded = [], []
    for tensor, nodes in found.items():
        m = absmax.get(tensor)
        if m is None or not np.any(m > 0):
            continue
        m = m.astype(np.float64)
        s = np.clip(m / m.max(), 1.0 / MOST_GAIN, 1.0)
        s = np.where(m > 0, s, 1.0)
        if np.all(s == 1.0):
            continue
        if not fold_into_producer(fm, tensor, nodes, 1.0 / s, into_weights=True, axis=1):
            not_folded.append(tensor)
            continue
        for node in nodes:  # each output channel of a depthwise filter reads one input channel, in order
            w = fm.constant(node.input[1])
            per_output = np.repeat(s, w.shape[0] // len(s))
            fm.set_constant(node.input[1], (w.astype(np.float64) * per_output.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype))
        done.append(EqualizedInput(tensor, [n.name for n in nodes], float(m.max() / max(m[m > 0].min(), 1e-30))))
    index(fm)
    return DepthwiseEqualized(done, not_folded)


def _default(options, facts: Facts) -> bool:
    # The filters and the producers' weights absorb the scales only where their scales are per channel.
    return facts.has_inputs and facts.arrays and options.activations in ("uint8", "int8") and options.granularity == "per-channel"


def _check(options, facts: Facts) -> None:
    if options.activations is None:
        raise QuantizationError("quantize: equalize_depthwise evens out activation ranges; it needs quantized activations")
    if options.granularity != "per-channel":
        raise QuantizationError(
            f"quantize: equalize_depthwise scales weights channel by channel; it needs --granularity per-channel, "
            f"got {options.granularity}"
        )
    check_data_read_twice("equalize_depthwise", facts)


def _apply(fm: FloatModel, options, data: Dataset, bars) -> DepthwiseEqualized:
    with bars.task("equalizing depthwise inputs", 1) as step:
        done = equalize_depthwise(
            fm,
            data,
            batch_size=options.batch_size,
            excluded=excluded_nodes(fm, options.exclude),
            runtime=target(options.target),
        )
        step(1)
    return done


ALGORITHM = register(
    Algorithm(
        name="equalize_depthwise",
        summary="scale each depthwise Conv's input channels to one range, the filters taking the scales (needs data)",
        stage="float",
        fields=(
            (
                "equalize_depthwise",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="scale each depthwise Conv's input channels to one range, its filters and the producing layer "
                    "taking the scales (default: on for 8-bit activations, per-channel weights and calibration arrays)",
                ),
            ),
        ),
        default=_default,
        check=_check,
        apply=_apply,
        result=DepthwiseEqualized,
    )
)
