"""The evaluate pass: the quantized model against the float model on held-out data.

Both models run batch by batch; only sums are kept (signal and noise power
for each output and for each quantized node's output, agreement and label
counts), so evaluation memory does not grow with the data either. Every
float output is judged, and the output SQNR is the worst output's: a
detector that gives boxes and class scores as two outputs is as good as
the worse of the two. Top-1 agreement is the first output's. The
quantized model runs on ONNX Runtime, with qlinear's Q/DQ kernels where
ONNX Runtime has none for its types (int2, float4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx._graph import producers
from qlinear.onnx._ort_with_qlinear import MixedRunner
from qlinear.quantize._data import Dataset, samples_in
from qlinear.quantize._metric import Metric, checked_figure
from qlinear.quantize._output_power import OutputsPower, Power, judged_outputs
from qlinear.quantize._session import load_reason, run_batch, with_outputs

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = [
    "Evaluation",
    "Reference",
    "Runner",
    "evaluate",
    "evaluation_batches",
    "metric_figure",
    "output_figures",
    "output_power",
    "output_sqnr",
]


class Runner:
    """Runs a model batch by batch: on the target's runtime if it can, else on ONNX Runtime with qlinear's Q/DQ kernels.

    The second is ``qlinear.onnx.run``'s ``"onnxruntime+qlinear"`` backend:
    weights of types ONNX Runtime lacks (int2, float4, ...) dequantized once
    by qlinear, activation Q/DQ nodes run by qlinear between ONNX Runtime
    segments.
    """

    def __init__(
        self, model: onnx.ModelProto, outputs: list[str], runtime: Target, *, arena: bool | None = None, spinning: bool = True
    ) -> None:
        """``arena``, ``spinning``: the runtime's (see ``Target.session``); the arena by default only where no tensor is watched."""
        model = with_outputs(model, outputs) if outputs else model  # not held: the session has what it needs
        self.outputs = [o.name for o in model.graph.output]
        self._mixed = None
        self.onnxruntime_error: str | None = None  # why the runtime cannot load it, where it cannot
        try:
            self._session = runtime.session(model, arena=not outputs if arena is None else arena, spinning=spinning)
            self.backend = runtime.backend
        except QuantizationError as e:  # no kernels for its types (float4, int2), or a fusion it cannot run
            self.onnxruntime_error = load_reason(e)
            self._session = None
            self._mixed = MixedRunner(model)
            self.backend = "onnxruntime+qlinear"

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is not None:
            values = run_batch(self._session, self.outputs, feeds, "an evaluation batch")
            return dict(zip(self.outputs, values, strict=True))
        return self._mixed(feeds, self.outputs)


def concat_parts(
    model: onnx.ModelProto, outputs: list[str], feeds: dict[str, np.ndarray], runtime: Target
) -> dict[str, tuple[int, list[slice]] | None]:
    """For each of ``outputs`` made by a Concat of several tensors: the axis and each tensor's slice of it (from ``feeds``).

    The Concats' inputs are read in one run of the model; an output made otherwise maps to None.
    """
    made = producers(model.graph)
    concats = {
        name: node
        for name in outputs
        if (node := made.get(name)) is not None
        and node.op_type == "Concat"
        and node.domain in ("", "ai.onnx")
        and len(node.input) >= 2
    }
    found: dict[str, tuple[int, list[slice]] | None] = dict.fromkeys(outputs)
    if not concats:
        return found
    values = Runner(model, list(dict.fromkeys(i for node in concats.values() for i in node.input)), runtime)(feeds)
    for name, node in concats.items():
        shapes = [np.shape(values[i]) for i in node.input]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(shapes[0])
        ends = np.cumsum([shape[axis] for shape in shapes])
        found[name] = axis, [slice(int(end - s[axis]), int(end)) for end, s in zip(ends, shapes, strict=True) if s[axis]]
    return found


@dataclass
class Evaluation:
    """Figures of the quantized model against the float model."""

    samples: int = 0
    output_sqnr_db: float | None = None  # the worst output's; a concatenated output's: its worst part's
    output_part_sqnr_db: list[float | None] | None = None  # each part's, where the first output is a Concat
    output_sqnr_db_by_output: dict[str, float | None] | None = None  # each judged output's, where there are several
    top1_agreement: float | None = None
    top1_decisions: int = 0  # the argmaxes compared (samples, or every time step of a sequence's)
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    node_sqnr_db: dict[str, float | None] = field(default_factory=dict)
    backend: str = "onnxruntime"
    onnxruntime_error: str | None = None  # why ONNX Runtime cannot load the quantized model (backend onnxruntime+qlinear)


def evaluate(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    node_outputs: dict[str, str],
    known: Reference,
    *,
    node_samples: int,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    """Compare the models' judged outputs on ``known``'s batches (the float model's :class:`Reference`), and their nodes'.

    The quantized model runs as it is written (its outputs alone, so the
    runtime fuses it as it will), against the float outputs ``known``
    holds. ``node_outputs`` (node name -> tensor) are compared on the
    first ``node_samples`` samples: each model run with every one of them
    as an output, which keeps the runtime from fusing across them, in the
    small batches that many outputs take. ``progress`` is called once a
    batch of either pass.
    """
    candidate = Runner(quant_model, known.outputs, known.runtime)
    c = _compared(candidate, known, labelled=True, progress=progress)
    first = known.output
    result = Evaluation(samples=c.samples, backend=candidate.backend)
    result.onnxruntime_error = candidate.onnxruntime_error
    result.output_sqnr_db, result.output_sqnr_db_by_output = c.power.db, c.power.by_output
    result.output_part_sqnr_db = c.power.outputs[first].part_dbs
    result.top1_agreement = c.agreement
    result.top1_decisions = c.rows
    if any(labels is not None for labels in known.labels) and c.rows:
        result.accuracy_before, result.accuracy_after = c.correct_before / c.rows, c.correct_after / c.rows
    tensors = list(dict.fromkeys(node_outputs.values()))
    node_power = _node_powers(float_model, quant_model, tensors, known.head(node_samples), progress)
    result.node_sqnr_db = {node: node_power[t].db for node, t in node_outputs.items()}
    return result


def evaluation_batches(known: Reference, node_samples: int) -> int:
    """The batches :func:`evaluate` runs on ``known`` (its progress bar's length)."""
    return len(known.batches) + len(known.head(node_samples).batches)


def _node_powers(float_model: onnx.ModelProto, quant_model: onnx.ModelProto, tensors: list[str], known: Reference,
                 progress: Callable[[int], None] | None) -> dict[str, Power]:  # fmt: skip
    """Each of ``tensors``' power, quantized against float, on ``known``'s batches."""
    power = {t: Power() for t in tensors}
    reference, candidate = Runner(float_model, tensors, known.runtime), Runner(quant_model, tensors, known.runtime)
    for feeds, _ in known.batches:
        ref, got = reference(feeds), candidate(feeds)
        for t in tensors:
            power[t].add(ref[t], got[t])
        if progress:
            progress(1)
    return power


# What class scores pass through on their way out, the classes staying on the last axis.
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"})
# A bias or a temperature on the scores: followed through their one computed input.
_AFFINE = frozenset({"Add", "Sub", "Mul", "Div"})
# Ops that make scores along the last axis.
_SCORES = frozenset({"Softmax", "LogSoftmax", "Gemm", "MatMul"})


def _normalized_exp(g: onnx.GraphProto, div: onnx.NodeProto, producer: dict, rank: int | None) -> bool:
    """Whether ``div`` divides an ``Exp`` by its own sum over the Exp's last axis (through reshapes and broadcasts).

    ``rank``: the Exp's rank where known (the output's, no reshape between);
    else only a sum over axis -1 is the last axis. A sum whose axes are not
    a constant (an initializer or an attribute) is not read.
    """
    exp = producer.get(div.input[0])
    if exp is None or exp.op_type != "Exp" or len(div.input) < 2:
        return False
    name = div.input[1]
    for _ in range(8):  # reshapes and broadcasts between the sum and the Div: an exporter writes two or three
        node = producer.get(name)
        if node is None or node.op_type not in (*_PASS_THROUGH, "Expand", "ReduceSum"):
            return False
        if node.op_type == "ReduceSum":
            return node.input[0] == exp.output[0] and _sums_last_axis(g, node, rank)
        name = node.input[0]
    return False


def _sums_last_axis(g: onnx.GraphProto, node: onnx.NodeProto, rank: int | None) -> bool:
    """Whether ReduceSum ``node`` sums over the last axis alone (of ``rank`` axes; None: read as -1 only)."""
    attribute = [list(a.ints) for a in node.attribute if a.name == "axes"]
    if attribute:  # before opset 13
        axes = attribute[0]
    else:
        given = next((t for t in g.initializer if len(node.input) > 1 and t.name == node.input[1]), None)
        if given is None:
            return False
        axes = onnx.numpy_helper.to_array(given).reshape(-1).tolist()
    if rank is None:
        return axes == [-1]
    return [a % rank for a in axes] == [rank - 1]


def classifies(model: onnx.ModelProto, output: str, first: np.ndarray, *, labelled: bool = False) -> bool:
    """Whether ``output`` (``first``: its first batch) holds class scores along its last axis.

    Float, two or more along that axis, and either given labels
    (``labelled``: the user says it classifies) or made by a Softmax (or
    one written out, ``Exp(a) / ReduceSum(Exp(a))`` over the last axis, as
    jax2tf exports it), LogSoftmax, Gemm or MatMul, through reshapes, casts
    and a constant bias or scale. Anything else is a map or a regression (a detector's Sigmoid
    probabilities over the image, boxes, an image, features), compared by
    SQNR: the top-1 along a map's width is no figure of its quality.
    """
    if first.ndim == 0 or first.shape[-1] < 2 or not np.issubdtype(first.dtype, np.floating):
        return False
    if labelled:
        return True
    g = model.graph
    producer = producers(g)
    constant = {t.name for t in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    name, rank = output, first.ndim  # the rank of the value reached, while no reshape lies between it and the output
    for _ in range(32):
        node = producer.get(name)
        if node is None:
            return False
        if node.op_type in _SCORES and node.domain in ("", "ai.onnx"):
            return True
        if node.op_type == "Div" and _normalized_exp(g, node, producer, rank):
            return True
        if node.op_type in _PASS_THROUGH:
            rank = rank if node.op_type in ("Identity", "Cast") else None
            name = node.input[0]
        elif node.op_type in _AFFINE and len([i for i in node.input if i not in constant]) == 1:
            name = next(i for i in node.input if i not in constant)
        else:
            return False
    return False


class Reference:
    """The float model's judged outputs on the data's batches, computed once, for models compared against it many times.

    ``output`` is the first output (the one top-1 agreement reads),
    ``outputs`` every judged one (:func:`judged_outputs`), and ``batches``
    each batch's feeds with those outputs' values by name. Every model
    compared against it runs on ``runtime``, as the float model did.
    """

    def __init__(self, float_model: onnx.ModelProto, data: Dataset, *, batch_size: int, runtime: Target) -> None:
        self.runtime = runtime
        self.axes = dict(data.axes)  # each input's batch axis
        self.output = float_model.graph.output[0].name
        self.outputs = judged_outputs(float_model)
        runner = Runner(float_model, self.outputs, runtime)
        self.batches: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
        self.labels: list[np.ndarray | None] = []  # each batch's labels, where the data has them
        offset = 0
        for feeds in data.batches(batch_size):
            values = runner(feeds)
            self.batches.append((feeds, {name: np.asarray(values[name]) for name in self.outputs}))
            n = samples_in(feeds)
            self.labels.append(None if data.labels is None else data.labels[offset : offset + n])
            offset += n
        if not self.batches:
            raise QuantizationError("quantize: the eval data holds no batch")
        first_feeds, first_values = self.batches[0]
        self.classifies = classifies(float_model, self.output, first_values[self.output], labelled=data.labels is not None)
        self.parts = concat_parts(float_model, self.outputs, first_feeds, runtime)

    def head(self, max_samples: int) -> Reference:
        """The first batches holding ``max_samples`` samples, from the outputs already computed."""
        kept = count = 0
        for feeds, _ in self.batches:
            if kept >= max_samples:
                break
            kept += samples_in(feeds)
            count += 1
        return self.batch_range(0, count)

    def batch_range(self, start: int, stop: int) -> Reference:
        """Batches ``start`` to ``stop`` (exclusive) alone, from the outputs already computed."""
        part = object.__new__(Reference)
        part.runtime, part.axes, part.output, part.outputs = self.runtime, self.axes, self.output, self.outputs
        part.classifies, part.parts = self.classifies, self.parts
        part.batches, part.labels = self.batches[start:stop], self.labels[start:stop]
        return part


def output_figures(model: onnx.ModelProto, reference: Reference) -> tuple[float | None, float | None]:
    """``(output SQNR in dB, top-1 agreement)`` of ``model`` against ``reference`` (agreement None where it does not classify).

    The SQNR is the worst judged output's; None means the outputs are identical.
    """
    c = _compared(Runner(model, reference.outputs, reference.runtime), reference)
    return c.power.db, c.agreement


@dataclass
class _Compared:
    """A model's judged outputs against a reference's, over its batches: their power, and the top-1 counts."""

    power: OutputsPower
    samples: int = 0
    agree: int = 0
    rows: int = 0  # the argmaxes compared
    correct_before: int = 0  # of them, the float model's and the quantized one's that match the labels
    correct_after: int = 0

    @property
    def agreement(self) -> float | None:
        return self.agree / self.rows if self.rows else None


def _compared(runner: Runner, reference: Reference, *, labelled: bool = False,
              progress: Callable[[int], None] | None = None) -> _Compared:  # fmt: skip
    """``runner``'s outputs against ``reference``'s on each of its batches (``labelled``: the labels counted too)."""
    c, first = _Compared(OutputsPower(reference.parts)), reference.output
    for (feeds, ref), labels in zip(reference.batches, reference.labels, strict=True):
        got = runner(feeds)
        c.power.add(ref, got)
        c.samples += samples_in(feeds)
        if progress:
            progress(1)
        if not reference.classifies:  # top-1 is read along the last axis of an output with class scores there
            continue
        ref_top, got_top = np.argmax(ref[first], axis=-1), np.argmax(got[first], axis=-1)
        c.agree += int((ref_top == got_top).sum())
        c.rows += ref_top.size
        if labelled and labels is not None:
            if labels.shape != ref_top.shape:
                raise QuantizationError(
                    f"quantize: labels have shape {labels.shape} a batch, expected {ref_top.shape} (the argmax of output {first!r})"
                )
            c.correct_before += int((ref_top == labels).sum())
            c.correct_after += int((got_top == labels).sum())
    return c


def output_sqnr(reference: Reference, outputs: list[dict[str, np.ndarray]]) -> float | None:
    """The worst judged output's SQNR of ``outputs`` against ``reference`` (one dict a batch; None: exact).

    An output the dicts lack is the float model's own (exact), which leaves the worst output's SQNR as it is.
    """
    return output_power(reference, outputs).db


def output_power(reference: Reference, outputs: list[dict[str, np.ndarray]], power: OutputsPower | None = None) -> OutputsPower:
    """The judged outputs' signal and noise of ``outputs`` against ``reference``, added to ``power`` where given.

    ``.db`` is :func:`output_sqnr`'s figure; a power carried over from
    earlier batches of the same outputs continues their sums.
    """
    if power is None:
        power = OutputsPower({name: part for name, part in reference.parts.items() if outputs and name in outputs[0]})
    for (_, ref), got in zip(reference.batches, outputs, strict=True):
        power.add(ref, got)
    return power


def metric_figure(model: onnx.ModelProto, reference: Reference, metric: Metric, name: str) -> float:
    """A user's ``metric`` of ``model`` against ``reference``: its mean over the batches, weighted by their samples."""
    runner = Runner(model, reference.outputs, reference.runtime)
    total = weight = 0.0
    for (feeds, ref), labels in zip(reference.batches, reference.labels, strict=True):
        got = runner(feeds)
        n = max(samples_in(feeds), 1)
        total += n * checked_figure(metric, name, ref, {k: np.asarray(got[k]) for k in reference.outputs}, labels)
        weight += n
    return total / weight
