"""What a run refuses before any work: options that leave nothing to quantize or name no node, types the target's
runtime cannot load, what needs data when none was given, an agreement target on an output with no classes.

Each refusal is one QuantizationError line, raised in the load stage so that no minute of calibration comes first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from qlinear._errors import QuantizationError
from qlinear.quantize._data import Dataset
from qlinear.quantize._evaluate import Runner, classifies
from qlinear.quantize._exclusion import unmatched
from qlinear.quantize._model import FloatModel
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._placement import COMPUTE_OPS, left_float_text, plan
from qlinear.quantize.algorithms import ALGORITHMS
from qlinear.quantize.targets import target
from qlinear.quantize.targets._target import Target as Runtime

__all__ = ["check_goal", "check_plannable", "check_without_data", "no_classes"]


def check_plannable(fm: FloatModel, options: QuantizeOptions) -> None:
    """Raise where the options leave no node of ``fm`` to quantize, or an ``exclude`` pattern names none, saying why."""
    missing = unmatched(fm, options.exclude)
    if missing:
        raise QuantizationError(
            f"quantize: exclude pattern(s) {', '.join(map(repr, missing))} name no node of the model: give node names, op "
            "types, globs (/encoder/*), re:EXPRESSION or FROM..TO (qlinear inspect lists the nodes)"
        )
    planned = plan(fm, options)
    if planned.nodes:
        _check_loadable(planned, target(options.target))
        return
    if not planned.left_float:
        raise QuantizationError(
            "quantize: the model has nothing to quantize: no Conv, ConvTranspose, Gemm, MatMul or Gather on constant weights"
            + _why_none(fm)
        )
    raise QuantizationError(
        f"quantize: the model has nothing to quantize: every node stays float: {left_float_text(planned.left_float, 5)}"
    )


# Ops that compute on quantized values: a model holding them (and nothing left to quantize) was quantized already.
_QUANTIZED_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv",
     "QLinearMatMul", "QGemm", "MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
)  # fmt: skip


def _why_none(fm: FloatModel) -> str:
    """Why a model's graph holds nothing to quantize, where it says: quantized already, or its compute in subgraphs."""
    done = _counted(fm.graph.node, _QUANTIZED_OPS)
    if done:
        return f"; it is quantized already ({done}): quantize the float model it was made from"
    nested = _counted(_subgraph_nodes(fm.graph), frozenset(COMPUTE_OPS))
    if nested:  # Silero VAD's all-rates export: every layer in the branches of one If on the sample rate
        return f" in its main graph; its compute nodes ({nested}) lie inside If, Loop or Scan bodies, which stay float"
    return ""


def _subgraph_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph``'s subgraphs (If branches, Loop and Scan bodies), nested ones too."""
    found = []
    for node in graph.node:
        for a in node.attribute:
            for sub in (a.g,) if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                found += [*sub.node, *_subgraph_nodes(sub)]
    return found


def _counted(nodes: Iterable[onnx.NodeProto], ops: frozenset[str]) -> str:
    """The nodes of ``ops`` among ``nodes``, counted by op (``22 DynamicQuantizeLinear, 21 ConvInteger``), most first."""
    counts: dict[str, int] = {}
    for node in nodes:
        if node.op_type in ops:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda item: -item[1]))


def _check_loadable(planned: Any, runtime: Runtime) -> None:
    """Refuse activation types the target's runtime fuses around a node into a kernel it lacks (the model would not load)."""
    placement = runtime.placement
    found = [p for p in planned.nodes if p.activation_type in placement.unloadable_activations.get(p.op_type, ())]
    if not found:
        return
    kinds = list(dict.fromkeys(p.op_type for p in found))
    ops = " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    raise QuantizationError(
        f"quantize: activations {found[0].activation_type} cannot be written around {ops} for {runtime.runtime} "
        f"(target {runtime.name}): {placement.unloadable_why} (nodes {', '.join(repr(p.name) for p in found[:3])}{more}); "
        f"use uint8 or int8 activations, none for {found[0].weight_type or 'float'} weights alone, or exclude {ops}"
    )


_JUDGED_ON_DATA = ("target_agreement", "target_sqnr_db", "target_metric", "metric", "latency_budget")


def check_without_data(options: QuantizeOptions) -> None:
    """Refuse, before any work, what a run given no data cannot do: a target, a budget, an algorithm that reads data."""
    asked = [name for name in _JUDGED_ON_DATA if getattr(options, name) is not None]
    asked += ["analyze"] if options.analyze else []
    asked += [a.name for a in ALGORITHMS if a.reads_data and a.on(options)]
    if asked:
        raise QuantizationError(
            f"quantize: {asked[0]} needs data, and none was given: give calibration data (an .npz with one array per model "
            "input, --calibration) or eval data (--eval)"
        )


def check_goal(fm: FloatModel, options: QuantizeOptions, eval_data: Dataset, runtime: Runtime) -> None:
    """Refuse, before any work, an agreement target on an output that holds no classes (one eval batch run to see)."""
    if options.target_agreement is None:
        return
    first = next(iter(eval_data.batches(options.batch_size)), None)
    if first is None:
        return
    output = fm.model.graph.output[0].name
    value = np.asarray(Runner(fm.model, [output], runtime)(first)[output])
    if not classifies(fm.model, output, value, labelled=eval_data.labels is not None):
        raise no_classes(output, value.shape)


def no_classes(output: str, shape: tuple[int, ...]) -> QuantizationError:
    return QuantizationError(
        f"quantize: target_agreement needs an output with classes along its last axis; "
        f"output {output!r} has shape {shape} a batch: give target_sqnr_db"
    )
