"""Empirical bias correction: each quantized layer's mean output error, measured end to end, taken out through its bias.

Bias correction (:mod:`.bias_correction`) computes a layer's mean output
shift from its weight's rounding error and its input's mean, before any
activation is quantized. What the finished QDQ model adds on top (the
activations' rounding and clipping, and the errors of the layers before
it) it cannot see. This pass runs the float model and the quantized one
on the calibration data, takes the per-channel mean of each quantized
Conv's and Gemm's output difference, and subtracts it from the layer's
bias: its int32 codes behind the bias's DequantizeLinear (quantized again
at the same scale), or its float bias. It is the "empirical" bias
correction of Nagel et al., 2019 (Data-Free Quantization, section 4.2),
layer after layer in graph order. The result is kept only
where it beats the model before it on the held-out data (output SQNR, and
top-1 agreement where the output classifies), as fine-tuning's is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from qlinear._errors import QuantizationError
from qlinear.dtypes._tensor_proto import to_tensor_proto
from qlinear.onnx._graph import producers
from qlinear.quantize._data import Dataset
from qlinear.quantize._evaluate import Reference, Runner, output_figures
from qlinear.quantize._model import FloatModel
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._held_out import HeldOut, better
from qlinear.quantize.algorithms._registry import Algorithm, Facts, register

__all__ = ["MAX_BATCHES", "Corrected", "correct_biases"]

MAX_BATCHES = 16  # calibration batches the means are taken over
_INT32 = np.iinfo(np.int32)


@dataclass
class Corrected:
    """What the pass did: the layers whose bias moved, and the held-out figures before and after."""

    layers: list[str]
    held_out: HeldOut = field(metadata={"flatten": True})
    kept: bool = False


def correct_biases(
    fm: FloatModel, qmodel: onnx.ModelProto, data: Dataset, reference: Reference, *, batch_size: int
) -> tuple[onnx.ModelProto, Corrected]:
    """``qmodel`` with its layers' mean output errors taken out through their biases, where that is better held out.

    The layers are corrected in graph order, each measured with the
    corrections before it in place: a shift taken out upstream moves the
    means downstream, and measured all at once they would be taken out
    twice.
    """
    before = output_figures(qmodel, reference)
    layers = _biased_layers(qmodel, fm)
    if not layers:
        return qmodel, Corrected([], HeldOut.of(before, before), False)
    batches = [feeds for _, feeds in zip(range(MAX_BATCHES), data.batches(batch_size), strict=False)]
    float_means = _channel_means(fm.model, [f for _, f in layers.values()], batches, reference.runtime)
    corrected = onnx.ModelProto()
    corrected.CopyFrom(qmodel)  # one copy, its biases moved in place layer after layer
    for name, (q_out, f_out) in layers.items():
        (q_mean,) = _channel_means(corrected, [q_out], batches, reference.runtime).values()
        _shift(corrected, name, q_mean - float_means[f_out])
    after = output_figures(corrected, reference)
    kept = better(after, before)
    return (corrected if kept else qmodel), Corrected(list(layers), HeldOut.of(before, after), kept)


def _biased_layers(qmodel: onnx.ModelProto, fm: FloatModel) -> dict[str, tuple[str, str]]:
    """Each Conv or Gemm of ``qmodel`` with a constant bias, in graph order: its (output in ``qmodel``, in the float model)."""
    inits = {t.name for t in qmodel.graph.initializer}
    producer = producers(qmodel.graph)
    out = {}
    for node in qmodel.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or not node.input[2] or node.name not in fm.nodes:
            continue
        bias = node.input[2]
        dq = producer.get(bias)
        stored = bias in inits or (dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits)
        if stored and fm.node(node.name).op_type == node.op_type:
            out[node.name] = (node.output[0], fm.producer_output(node.name))
    return out


def _channel_means(model: onnx.ModelProto, names: list[str], batches: list[dict], runtime) -> dict[str, np.ndarray]:
    """The mean of each of ``names`` per channel (axis 1) over ``batches``, in float64.

    Run as the evaluation runs a model: on ``runtime`` (the target's), or with qlinear's Q/DQ kernels where it cannot load it.
    """
    runner = Runner(model, names, runtime)
    sums: dict[str, np.ndarray] = {}
    counts = dict.fromkeys(names, 0)
    for feeds in batches:
        got = runner(feeds)
        for name, value in ((n, got[n]) for n in names):
            v = np.asarray(value, np.float64)
            sums[name] = sums.get(name, 0.0) + v.sum(axis=tuple(a for a in range(v.ndim) if a != 1))
            counts[name] += v.size // v.shape[1]
    return {name: sums[name] / counts[name] for name in names}


def _shifted(qmodel: onnx.ModelProto, layer: str, shift: np.ndarray) -> onnx.ModelProto:
    """A copy of ``qmodel`` whose node ``layer`` has its bias lowered by ``shift`` (one value per output channel)."""
    out = onnx.ModelProto()
    out.CopyFrom(qmodel)
    _shift(out, layer, shift)
    return out


def _shift(model: onnx.ModelProto, layer: str, shift: np.ndarray) -> None:
    """Lower the bias of node ``layer`` of ``model`` by ``shift``, in place: a float bias, or its int32 codes."""
    g = model.graph
    values = {t.name: t for t in g.initializer}
    bias = next(n for n in g.node if n.name == layer).input[2]
    if bias in values:  # a float bias
        b = numpy_helper.to_array(values[bias])
        values[bias].CopyFrom(to_tensor_proto((b.astype(np.float64) - shift).astype(b.dtype), bias))
        return
    dq = producers(g)[bias]
    codes = numpy_helper.to_array(values[dq.input[0]])
    scale = numpy_helper.to_array(values[dq.input[1]]).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((codes.astype(np.float64) * scale - shift) / scale)
    q = np.clip(np.where(np.isfinite(q), q, codes), _INT32.min, _INT32.max).astype(codes.dtype)
    values[dq.input[0]].CopyFrom(to_tensor_proto(q, dq.input[0]))


def _check(options, facts: Facts) -> None:
    if not facts.has_inputs:  # saved statistics alone: the held-out data must not be what it corrects on
        raise QuantizationError(
            "quantize: empirical_bias_correction runs the models on the calibration data; give calibration data"
        )


def _apply(fm: FloatModel, qmodel: onnx.ModelProto, data: Dataset, reference: Reference, options, bars):
    with bars.task("correcting biases", 1) as step:
        done = correct_biases(fm, qmodel, data, reference, batch_size=options.batch_size)
        step(1)
    return done


ALGORITHM = register(
    Algorithm(
        name="empirical_bias_correction",
        summary="each quantized Conv's and Gemm's mean output error on the calibration data, measured end to end, "
        "taken out through its bias (kept where better held out)",
        stage="refine",
        fields=(
            (
                "empirical_bias_correction",
                bool,
                option(
                    False,
                    group="algorithms",
                    form="switch",
                    help="measure each Conv's and Gemm's mean output error of the finished model on the calibration "
                    "data and take it out through its bias; kept only if better on the held-out data",
                ),
            ),
        ),
        check=_check,
        apply=_apply,
        result=Corrected,
    )
)
