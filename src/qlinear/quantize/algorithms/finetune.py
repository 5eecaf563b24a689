"""The fine-tune pass: the QDQ model's scales trained by distillation against the float model, then written back.

The post-training QDQ model runs in torch (:class:`qlinear.torch._from_onnx.QDQModule`:
its Q/DQ nodes exact, every scale a parameter), and Adam lowers the
normalized squared error between its outputs and the float model's (run by
ONNX Runtime) on the calibration batches. The learned scales are written
into the same QDQ model: weight codes and int32 biases are quantized again
with them by qlinear's kernels, nothing else changes. The result is kept
only if it beats the post-training model on the held-out data (output SQNR,
and top-1 agreement where the output classifies); otherwise the
post-training model stays and the report says why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx.shape_inference
from onnx import TensorProto, helper, numpy_helper

import qlinear
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.dtypes._tensor_proto import to_tensor_proto
from qlinear.onnx import _large as large
from qlinear.onnx._graph import producers
from qlinear.quantize._data import Dataset
from qlinear.quantize._evaluate import Reference, output_figures
from qlinear.quantize._model import FloatModel
from qlinear.quantize._option_fields import option
from qlinear.quantize._qdq_names import CODES
from qlinear.quantize._session import run_batch
from qlinear.quantize.algorithms._held_out import HeldOut, better
from qlinear.quantize.algorithms._registry import Algorithm, Facts, register

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = ["FinetuneResult", "finetune"]

# Adam's step for a scale, as a share of the scale's initial mean magnitude (Adam moves a parameter by
# about its learning rate a step, whatever the gradient's size).
SCALE_STEP = 2e-3
# For latent weights (finetune_weights), as a share of the weight's standard deviation.
WEIGHT_STEP = 1e-3
KL_WEIGHT = 1.0  # weight of the softmax KL term where the output classifies (agreement follows it, not the MSE)
MAX_BATCHES = 64  # calibration batches held for training (their float outputs too)


@dataclass
class FinetuneResult:
    """What the fine-tune pass did."""

    steps: int
    seconds: float
    loss_before: float
    loss_after: float
    held_out: HeldOut = field(metadata={"flatten": True})
    kept: bool = False  # the fine-tuned model replaced the post-training one
    note: str | None = None  # why not, where it was not kept or could not run


def finetune(
    fm: FloatModel,
    qmodel: onnx.ModelProto,
    data: Dataset,
    reference: Reference,
    *,
    steps: int,
    batch_size: int,
    train_weights: bool = True,
    progress: Any = None,
) -> tuple[onnx.ModelProto, FinetuneResult]:
    """``qmodel`` with its scales trained ``steps`` steps, or ``qmodel`` itself where that did not help or cannot run.

    Raises:
        QuantizationError: ``steps`` is not a positive int.
    """
    if not (isinstance(steps, int) and steps >= 1):
        raise QuantizationError(f"quantize: finetune must be an int >= 1 (training steps), got {steps!r}")
    before = output_figures(qmodel, reference)
    try:
        import torch

        from qlinear.torch._from_onnx import QDQModule, UnsupportedOperator
    except ImportError:
        return qmodel, _skipped(steps, before, "torch is not installed: pip install 'qlinear[torch]'")
    prefix = None
    try:
        module = QDQModule(qmodel, _float_weights(fm, qmodel), train_weights=train_weights)
    except UnsupportedOperator as e:
        # Nodes that depend on nothing trained (an audio model's STFT front end) need no torch form:
        # ONNX Runtime computes them once a batch, and the rest trains on their outputs.
        prefix, rest = _float_prefix(qmodel)
        if prefix is None:
            return qmodel, _skipped(steps, before, f"{e}; the post-training model is kept")
        try:
            module = QDQModule(rest, _float_weights(fm, qmodel), train_weights=train_weights)
        except UnsupportedOperator as e_rest:
            return qmodel, _skipped(steps, before, f"{e_rest}; the post-training model is kept")
    if not module.scales and not (train_weights and module.weights):
        # Every node was left float (promoted, or faster in float): nothing is quantized, so nothing trains.
        return qmodel, _skipped(steps, before, "no quantized node is left to train; the post-training model is kept")
    start = time.perf_counter()
    batches = _targets(fm, data, batch_size, reference.runtime, prefix)
    groups = [{"params": [p], "lr": SCALE_STEP * max(float(p.detach().abs().mean()), 2.0**-126)} for p in module.scales]
    if train_weights:
        groups += [{"params": [w], "lr": WEIGHT_STEP * float(w.detach().std() or 1.0)} for w in module.weights]
    optimizer = torch.optim.Adam(groups)
    first = last = 0.0
    for step in range(steps):
        feeds, targets = batches[step % len(batches)]
        outputs = module(feeds)
        loss = sum(_loss(y, t, classifies=reference.classifies) for y, t in zip(outputs, targets, strict=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # scales stay positive and finite: ONNX models must not hold others
            for p in module.scales:
                p.copy_(torch.nan_to_num(p, nan=2.0**-126, posinf=3.0e38).clamp_min(2.0**-126))
        last = float(loss.detach())
        first = last if step == 0 else first
        if progress is not None:
            progress(1)
    tuned = _written_back(qmodel, module)
    after = output_figures(tuned, reference)
    seconds = time.perf_counter() - start
    kept = better(after, before)
    result = FinetuneResult(steps, seconds, first, last, HeldOut.of(before, after), kept)
    if not kept:
        result.note = "the fine-tuned model was not better on the held-out data; the post-training model is kept"
        return qmodel, result
    return tuned, result


def _loss(y: Any, t: Any, *, classifies: bool) -> Any:
    """The normalized squared error of ``y`` against ``t``; for class scores, plus the KL divergence of their softmaxes."""
    import torch

    mse = ((y - t) ** 2).mean() / (t**2).mean().clamp_min(1e-30)
    if not classifies or KL_WEIGHT == 0:
        return mse
    kl = torch.nn.functional.kl_div(
        torch.log_softmax(y.float(), -1), torch.log_softmax(t.float(), -1), log_target=True, reduction="batchmean"
    )
    return mse + KL_WEIGHT * kl


def _skipped(steps: int, before: tuple, note: str) -> FinetuneResult:
    return FinetuneResult(steps, 0.0, float("nan"), float("nan"), HeldOut.of(before, before), False, note)


def _float_weights(fm: FloatModel, qmodel: onnx.ModelProto) -> dict[str, np.ndarray]:
    """For each weight's codes, its float weight where rounding it to nearest gives those codes.

    Codes that rounding to nearest does not give (GPTQ chose them) start
    from their dequantized value instead, so training starts from the
    post-training model exactly.
    """
    values = {t.name: t for t in qmodel.graph.initializer}
    out = {}
    for node in qmodel.graph.node:
        codes = node.input[0] if node.op_type == "DequantizeLinear" else None
        if codes not in values or not codes.endswith(CODES) or values[codes].data_type == TensorProto.INT32:
            continue
        w = fm.constant(codes.removesuffix(CODES))
        stored = large.value_of(values[codes])  # a large model's codes are markers
        if w is None or w.shape != stored.shape:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        scale = numpy_helper.to_array(values[node.input[1]])
        zp = numpy_helper.to_array(values[node.input[2]]) if len(node.input) > 2 and node.input[2] else None
        again = qlinear.quantize_linear(
            w.astype(scale.dtype), scale, zp, axis=a.get("axis", 1), block_size=a.get("block_size", 0),
            output_dtype=element_type(stored.dtype).name,
        )  # fmt: skip
        if np.array_equal(again.view(np.uint8), stored.view(np.uint8)):
            out[codes] = w.astype(np.float32)
    return out


def _float_prefix(qmodel: onnx.ModelProto) -> tuple[onnx.ModelProto | None, onnx.ModelProto]:
    """``(prefix, rest)``: the nodes that depend on no Q/DQ node, as a model of their own, and the model after them.

    ``rest`` reads the prefix's tensors as its inputs; its initializers
    keep their names, so scales trained on it write back into ``qmodel``.
    ``(None, qmodel)`` where there is no such prefix, or where it
    produces a graph output itself.
    """
    g = qmodel.graph
    known = {t.name for t in g.initializer} | {i.name for i in g.input} | {""}
    constants = [n for n in g.node if n.op_type == "Constant"]  # in both models: their values are no cut
    known |= {o for n in constants for o in n.output}
    fixed, fixed_outputs, rest_nodes = [], set(), []
    for node in g.node:
        if node.op_type == "Constant":
            continue
        # A node with a subgraph (If, Loop, Scan) may read any outer tensor without naming it: never fixed.
        subgraph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        if (
            node.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and not subgraph
            and all(i in known or i in fixed_outputs for i in node.input)
        ):
            fixed.append(node)
            fixed_outputs.update(o for o in node.output if o)
        else:
            rest_nodes.append(node)
    if not fixed or fixed_outputs & {o.name for o in g.output}:
        return None, qmodel
    cut = list(dict.fromkeys(i for n in rest_nodes for i in n.input if i in fixed_outputs))
    try:
        types = {v.name: v.type for v in onnx.shape_inference.infer_shapes(qmodel).graph.value_info}
    except Exception:  # onnx raises several types; ONNX Runtime then infers the types itself
        types = {}

    def declared(name: str) -> onnx.ValueInfoProto:
        info = onnx.ValueInfoProto(name=name)
        if name in types:
            info.type.CopyFrom(types[name])
        return info

    def model_of(nodes: list, inputs: list, outputs: list) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(qmodel)
        for repeated, items in ((m.graph.node, [*constants, *nodes]), (m.graph.input, inputs), (m.graph.output, outputs)):
            del repeated[:]
            repeated.extend(items)
        return m

    read = {i for n in fixed for i in n.input}
    prefix = model_of(fixed, [i for i in g.input if i.name in read], [declared(n) for n in cut])
    read = {i for n in rest_nodes for i in n.input}
    rest = model_of(rest_nodes, [*(i for i in g.input if i.name in read), *(declared(n) for n in cut)], list(g.output))
    return prefix, rest


def _targets(
    fm: FloatModel, data: Dataset, batch_size: int, runtime: Target, prefix: onnx.ModelProto | None = None
) -> list[tuple[dict, list]]:
    """Up to MAX_BATCHES calibration batches as torch tensors, with the float model's outputs on them.

    With a ``prefix`` (see :func:`_float_prefix`), a batch is what the
    prefix computes from the data (and the data the rest reads directly).
    """
    import torch

    sess = runtime.session(fm.model)
    names = fm.output_names
    prefix_sess = None if prefix is None else runtime.session(prefix)
    cut = [] if prefix is None else [o.name for o in prefix.graph.output]
    out = []
    for k, feeds in enumerate(data.batches(batch_size)):
        if k == MAX_BATCHES:
            break
        targets = run_batch(sess, names, feeds, f"fine-tuning batch {k}")
        if prefix_sess is not None:
            feeds = {**feeds, **dict(zip(cut, run_batch(prefix_sess, cut, feeds, f"fine-tuning batch {k}"), strict=True))}
        out.append(
            ({n: torch.from_numpy(np.asarray(v)) for n, v in feeds.items()}, [torch.from_numpy(np.asarray(t)) for t in targets])
        )
    if not out:
        raise QuantizationError("quantize: finetune needs calibration data (not saved statistics)")
    return out


def _written_back(qmodel: onnx.ModelProto, module: Any) -> onnx.ModelProto:
    """``qmodel`` with the module's scales, its weights' codes and int32 biases quantized again with them."""
    out = onnx.ModelProto()
    out.CopyFrom(qmodel)
    g = out.graph
    values = {t.name: t for t in g.initializer}
    new: dict[str, np.ndarray] = {}
    for name, index in module.scale_index.items():
        old = numpy_helper.to_array(values[name])
        new[name] = module.scales[index].detach().numpy().astype(old.dtype).reshape(old.shape)
    for dq_out, node in module.weight_nodes.items():
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        stored = large.value_of(values[node.input[0]])
        zp = numpy_helper.to_array(values[node.input[2]]) if len(node.input) > 2 and node.input[2] else None
        latent = module.weights[module.weight_index[dq_out]].detach().numpy()
        scale = new[node.input[1]]
        new[node.input[0]] = qlinear.quantize_linear(
            latent.astype(scale.dtype), scale, zp, axis=a.get("axis", 1), block_size=a.get("block_size", 0),
            output_dtype=element_type(stored.dtype).name,
        )  # fmt: skip
    producer = producers(g)
    for node in g.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[2] not in module.bias_values:
            continue
        bias_dq = producer[node.input[2]]
        act_dq, weight_dq = producer.get(node.input[0]), producer.get(node.input[1])
        if act_dq is None or weight_dq is None or act_dq.op_type != "DequantizeLinear" or weight_dq.op_type != "DequantizeLinear":
            continue
        s_act, s_w = new.get(act_dq.input[1]), new.get(weight_dq.input[1])
        if s_act is None or s_w is None:
            continue
        old_scale = numpy_helper.to_array(values[bias_dq.input[1]])
        bias_scale = (np.float32(s_act) * s_w.astype(np.float32)).astype(old_scale.dtype).reshape(old_scale.shape)
        bias = module.bias_values[node.input[2]].numpy().astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.rint(bias / bias_scale.astype(np.float64)), -(2**31), 2**31 - 1)
        new[bias_dq.input[1]] = bias_scale
        new[bias_dq.input[0]] = np.where(np.isfinite(q), q, 0).astype(np.int32)
    for name, value in new.items():
        values[name].CopyFrom(to_tensor_proto(np.ascontiguousarray(value), name))
    return out


def _validate(options) -> None:
    steps = options.finetune
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        raise QuantizationError(f"quantize: finetune must be an int >= 0 (training steps), got {steps!r}")


def _check(options, facts: Facts) -> None:
    if not facts.calibration_given and not facts.arrays:
        raise QuantizationError("quantize: finetune trains on the calibration data; give calibration data, not stats alone")


def _apply(fm: FloatModel, qmodel: onnx.ModelProto, data: Dataset, reference: Reference, options, bars):
    with bars.task("fine-tuning", options.finetune) as step:
        return finetune(
            fm, qmodel, data, reference, steps=options.finetune, batch_size=options.batch_size,
            train_weights=options.finetune_weights, progress=step,
        )  # fmt: skip


ALGORITHM = register(
    Algorithm(
        name="finetune",
        summary="train the quantized model's scales (and weights) by distillation against the float model (needs torch)",
        stage="refine",
        fields=(
            (
                "finetune",
                int,
                option(
                    0,
                    type=int,
                    metavar="STEPS",
                    group="algorithms",
                    help="train the quantized model's scales and weights STEPS steps against the float model on the "
                    "calibration data (needs torch); kept only if it beats the post-training model on the held-out data",
                ),
            ),
            (
                "finetune_weights",
                bool,
                option(
                    True,
                    form="negated",
                    flag="--finetune-scales-only",
                    group="algorithms",
                    help="with --finetune, train the scales and leave the weights' codes",
                ),
            ),
        ),
        check=_check,
        validate=_validate,
        apply=_apply,
        result=FinetuneResult,
    )
)
