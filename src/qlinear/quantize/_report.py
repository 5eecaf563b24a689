"""The report pass: the typed :class:`Report` of what the quantizer did and measured, from what each stage produced."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlinear.onnx import _large as large
from qlinear.onnx._graph import node_reads
from qlinear.quantize._calibrate import CalibrationRun
from qlinear.quantize._data import Dataset
from qlinear.quantize._evaluate import Evaluation
from qlinear.quantize._fusion import MODEL_OUTPUT_CONV, FusionCheck, float_by_design
from qlinear.quantize._interval import wilson_interval
from qlinear.quantize._latency import Latency, worst_ratio
from qlinear.quantize._placement import Plan, listed
from qlinear.quantize._promotion import Search
from qlinear.quantize._report_schema import (
    BeforeAfter,
    CalibrationSummary,
    CosineFigures,
    Decision,
    EvalSummary,
    FusionSummary,
    Interval,
    LeftFloat,
    MetricFigure,
    ModelFiles,
    NodeAnalysis,
    NodeRow,
    OutputFigures,
    Promotions,
    PromotionStep,
    Report,
    Requested,
    Settings,
    TargetSpec,
    Widened,
    algorithm_results,
)
from qlinear.quantize._report_text import figure_text, share_text, unloadable_text
from qlinear.quantize._run_settings import RunSetting
from qlinear.quantize._sensitivity import NodeSensitivity
from qlinear.quantize._speed import Floated
from qlinear.quantize._to_qdq import ConvertedNode
from qlinear.quantize._tradeoff import Candidate
from qlinear.quantize.algorithms._channel_scaling import ScaledActivation
from qlinear.quantize.algorithms.equalize import Equalized
from qlinear.quantize.targets import target

if TYPE_CHECKING:
    from qlinear.quantize._options import QuantizeOptions


__all__ = ["UNLOADABLE", "ReportInputs", "build_report", "report_json"]

# How the warning about a model ONNX Runtime cannot load begins: the command line says it even when told to be quiet.
UNLOADABLE = "ONNX Runtime cannot load the quantized model"
_UNFUSED_SHOWN = 5  # names the unfused-node warning lists before ", and N more"


@dataclass
class ReportInputs:
    """What each stage of one run produced, as the report reads it."""

    model_name: str
    output: Path | None
    options: QuantizeOptions
    opset: int
    size_before: int
    size_after: int
    plan: Plan
    converted: dict[str, ConvertedNode]
    calibration: CalibrationRun | None  # None: weight-only
    calibration_data: Dataset
    stats_path: str | None
    eval_data: Dataset
    evaluation: Evaluation
    fusion: FusionCheck | None  # None: ONNX Runtime cannot load the model
    latency: list[Latency]  # at each batch the users run (none where the runtime cannot load the model)
    sensitivity: dict[str, NodeSensitivity] = field(default_factory=dict)  # every node the requested types quantize
    requested_figures: tuple[float | None, float | None] = (None, None)  # output SQNR, agreement at the requested types
    search: Search | None = None  # None: no target
    smoothed: list[ScaledActivation] = field(default_factory=list)
    awq: list[ScaledActivation] = field(default_factory=list)
    equalized: list[Equalized] = field(default_factory=list)
    finetuned: Any = None  # a FinetuneResult, where fine-tuning was asked for
    gates: list[str] = field(default_factory=list)  # gates written for integer kernels (_integer_gates)
    algorithms: dict[str, Any] = field(default_factory=dict)  # what each algorithm that ran gave, by name
    batch_fixed_by: str | None = None  # the input whose fixed batch dimension set the batch
    onnxruntime_error: str | None = None  # why ONNX Runtime cannot load the model as written, where it cannot
    tradeoff: list[Candidate] = field(default_factory=list)  # the models the search built, timed
    kept_float_weights: list[str] = field(default_factory=list)  # quantized weights float nodes still read whole
    measures: dict[str, Any] = field(default_factory=dict)  # the written model's other measures (_measures.measures)
    floated: list[Floated] = field(default_factory=list)  # the kinds of node tried in float for speed
    run_settings: list[RunSetting] = field(default_factory=list)  # the runtime's settings tried for speed
    data_flags: list[str] = field(default_factory=list)  # the data flags that repeat the run
    judged: bool = True  # False: no data was given, so nothing was judged or timed
    untimed: str | None = None  # why the models were not timed, where the runtime could have run them

    @classmethod
    def of(cls, model: Any, output: Path | None, options: QuantizeOptions, met: Any, *, fm_size: int, qmodel: Any, run: Any,
           data: Any, eval_data: Dataset, stats: Any, evaluation: Evaluation, fusion: FusionCheck | None,
           latency: list[Latency], algorithms: dict[str, Any],
           onnxruntime_error: str | None = None, measures: dict[str, Any] | None = None,
           data_flags: list[str] | None = None, judged: bool = True, untimed: str | None = None) -> ReportInputs:  # fmt: skip
        """The inputs of one run's report: ``met`` is the run's TargetResult, ``algorithms`` what each algorithm did."""
        built = met.built
        return cls(
            model_name=str(model) if isinstance(model, (str, PathLike)) else "<ModelProto>",
            output=output, options=options, opset=built.opset, size_before=fm_size, size_after=large.byte_size(qmodel),
            plan=built.plan, converted=built.converted, calibration=run, calibration_data=data.calibration,
            stats_path=str(stats) if stats is not None else None, eval_data=eval_data, evaluation=evaluation,
            fusion=fusion, latency=latency, sensitivity=met.sensitivity, tradeoff=met.tradeoff, floated=met.floated,
            run_settings=met.settings,
            requested_figures=met.requested_figures, search=met.search, smoothed=algorithms.get("smoothquant", []),
            awq=algorithms.get("awq", []), equalized=algorithms.get("equalize", []), finetuned=algorithms.get("finetune"),
            gates=built.gates, algorithms=algorithms, batch_fixed_by=data.fixed_by,
            onnxruntime_error=onnxruntime_error or evaluation.onnxruntime_error, measures=measures or {},
            data_flags=data_flags or [], judged=judged, kept_float_weights=_kept_float(qmodel, built.plan), untimed=untimed,
        )  # fmt: skip


# Below these the report warns: activation ranges from fewer calibration samples are rough, and fewer held-out
# samples judge no figure (a sample's agreement is all or nothing).
FEW_CALIBRATION_SAMPLES = 16
FEW_HELD_OUT_SAMPLES = 16

# What a run given no data could not do, and how to have it done.
NOT_JUDGED = (
    "no data was given, so the model was not timed and no accuracy target was checked: give calibration data "
    "(--calibration) or eval data (--eval) for both"
)

# The quantized model's latency over the float one's past which the report warns (the timing's noise is about 0.1).
SLOWER = 1.15


def _slower_text(latency: Latency, by_design: dict[str, str], fusion: FusionCheck | None, runtime: str) -> str:
    """Why the quantized model may be slower than the float one, as far as the run knows."""
    before, after, batch = latency.before, latency.after, latency.batch
    causes = []
    reasons = Counter(why.split(":")[0] for why in by_design.values())
    for what, n in reasons.most_common():
        advice = " (promotions: --no-promote or a lower target trades accuracy for speed)" if what == "16-bit activations" else ""
        causes.append(f"{n} node(s) in float by design ({what}){advice}")
    if fusion is not None and fusion.qdq_nodes_left:
        causes.append(f"{fusion.qdq_nodes_left} Q/DQ nodes left around float operators, each a pass over its tensor")
    return (
        f"the quantized model is slower than the float one on {runtime}: {after:.3f} ms against {before:.3f} ms a "
        f"batch of {batch} ({latency.ratio:.2f}x)" + "".join(f"; {c}" for c in causes)
    )


def _decision(r: ReportInputs) -> Decision:
    """What a user decides on, in one line: faster or slower than float at the batches they run, the target met or not."""
    if not r.judged:
        return Decision(None, None, f"weights rounded; {NOT_JUDGED}")
    faster = None if not r.latency else all(t.ratio <= 1.0 for t in r.latency)
    untimed = f"not timed ({r.untimed or 'the runtime cannot run it'})"
    speed = ", ".join(f"{t.ratio:.2f}x at a batch of {t.batch}" for t in r.latency) or untimed
    if faster is None:
        head = f"latency {speed}"
    else:
        head = f"{'faster' if faster else 'SLOWER'} than the float model: {speed}"
    search = r.search
    if search is None:
        goal = "the types asked for everywhere (no promotion)"
    elif search.budget is not None:
        goal = (
            f"the most accurate model within {search.budget:g}x the float model's latency: "
            f"{figure_text(search.figure, search.target.metric)}"
            + ("" if search.met else f" (not met: {search.target.describe()})")
        )
    else:
        figure = figure_text(search.figure, search.target.metric)
        interval = _interval(r.evaluation) if search.target.metric == "agreement" else None
        if interval:  # 99% on 100 samples is not evidence of 99%
            figure += f", 95% interval {share_text(interval.low)} to {share_text(interval.high)} on {interval.decisions}"
        goal = f"target {'met' if search.met else 'NOT met'} ({search.target.describe()}: {figure})"
    advice = ""
    if faster is False or (search is not None and not search.met):
        chosen = next((c for c in r.tradeoff if c.chosen and c.latency is not None), None)
        faster_ones = [
            c
            for c in r.tradeoff
            if chosen and not c.chosen and c.latency and worst_ratio(c.latency) < worst_ratio(chosen.latency)
        ]
        if faster_ones:
            advice = "; the trade-off table gives the faster models measured and the flags that write them"
        elif faster is False:
            advice = "; no faster quantized model was measured: its Q/DQ cost more here than its integer kernels save"
    return Decision(faster, None if search is None else search.met, f"{head}; {goal}{advice}")


def build_report(r: ReportInputs) -> Report:
    """The report: the run's settings and every figure."""
    fusion, evaluation, run, options = r.fusion, r.evaluation, r.calibration, r.options
    nodes = []
    for p in r.plan.nodes:
        c = r.converted[p.name]
        found = r.sensitivity.get(p.name)
        nodes.append(
            NodeRow(
                name=p.name,
                op_type=p.op_type,
                weight_type=c.weight_type,
                activation_type=c.activation_type,
                weight_sqnr_db=c.weight_sqnr_db,
                output_sqnr_db=evaluation.node_sqnr_db.get(p.name),
                sensitivity_db=None if found is None else found.sensitivity_db,
                activation_sqnr_db=None if found is None else found.activation_db,
                fused=None if fusion is None else fusion.fused[p.name],
                runs_as=None if fusion is None else fusion.runs_as[p.name],
                bias_int32=c.bias_int32,
                bias_corrected=c.bias_corrected,
                weight_bytes=BeforeAfter(c.weight_bytes_before, c.weight_bytes_after),
            )
        )
    no_output_q = {p.name for p in r.plan.nodes if p.op_type == "Conv" and p.activations and p.output is None}
    by_design = {
        n.name: why
        for n in nodes
        if fusion is not None and n.name in fusion.unfused
        if (
            why := float_by_design(n.op_type, n.weight_type, n.activation_type)
            or (MODEL_OUTPUT_CONV if n.name in no_output_q else None)
            or fusion.by_layout.get(n.name)
        )
    }
    accuracy = None
    if evaluation.accuracy_after is not None:
        accuracy = BeforeAfter(evaluation.accuracy_before, evaluation.accuracy_after)
    return Report(
        model=ModelFiles(r.model_name, str(r.output) if r.output else None),
        settings=Settings(**{**options.to_dict(), "opset": r.opset}),
        data_flags=r.data_flags,
        size_bytes=BeforeAfter(r.size_before, r.size_after),
        decision=_decision(r),
        latency_ms=list(r.latency),
        tradeoff=list(r.tradeoff),
        float_where_faster=list(r.floated),
        run_settings=list(r.run_settings),
        calibration=CalibrationSummary(
            method=options.method if options.activations else None,
            source=None if options.activations is None or r.stats_path else r.calibration_data.source,
            batches=run.batches if run else 0,
            batch_size=run.batch_size if run else 0,
            samples=run.samples if run else 0,
            seconds=run.seconds if run else 0.0,
            peak_rss_bytes=run.peak_rss_bytes if run else 0,
            from_stats=r.stats_path,
            batch_fixed_by=r.batch_fixed_by,
        ),
        eval=EvalSummary(r.eval_data.source, evaluation.samples, evaluation.backend, r.onnxruntime_error),
        output=OutputFigures(
            sqnr_db=evaluation.output_sqnr_db,
            sqnr_db_parts=evaluation.output_part_sqnr_db,
            sqnr_db_outputs=evaluation.output_sqnr_db_by_output,
            top1_agreement=evaluation.top1_agreement,
            top1_agreement_interval=_interval(evaluation),
            accuracy=accuracy,
            metric=MetricFigure(**metric) if (metric := r.measures.get("metric")) else None,
            decisions_kept=r.measures.get("decisions_kept"),
            detections_kept=r.measures.get("detections_kept"),
            cosine_similarity=CosineFigures(*cosine) if (cosine := r.measures.get("cosine_similarity")) else None,
        ),
        fusion=FusionSummary(
            checked=fusion is not None,
            unfused=[] if fusion is None else fusion.unfused,
            float_by_design=by_design,
            qdq_nodes_left=None if fusion is None else fusion.qdq_nodes_left,
            integer_gates=r.gates,
        ),
        nodes=nodes,
        analysis=[NodeAnalysis(f.name, f.sensitivity_db, f.weight_db, f.activation_db) for f in r.sensitivity.values()],
        requested=Requested(*r.requested_figures),
        promotions=_promotions(r.search),
        smoothquant=list(r.smoothed),
        awq=list(r.awq),
        equalized=list(r.equalized),
        left_float=[LeftFloat(n, op, why) for n, op, why in r.plan.left_float],
        widened=[Widened(n, asked, stored, why) for n, asked, stored, why in r.plan.widened],
        finetune=r.finetuned,
        algorithms=algorithm_results(r.algorithms),
        warnings=_warnings(r, nodes, by_design),
    )


def _kept_float(qmodel: Any, plan: Plan) -> list[str]:
    """The weights the plan quantizes that a node of ``qmodel`` still reads as float initializers (stored twice)."""
    weights = {p.weight.tensor for p in plan.nodes if p.weight is not None}
    stored = {t.name for t in qmodel.graph.initializer} & weights
    read = {i for n in qmodel.graph.node for i in node_reads(n)}
    return sorted(stored & read)


def _warnings(r: ReportInputs, nodes: list[NodeRow], by_design: dict[str, str]) -> list[str]:
    """What the user should know before shipping the model, most basic first."""
    fusion, run, options = r.fusion, r.calibration, r.options
    warnings = []
    if r.finetuned is not None and r.finetuned.note:
        warnings.append(f"finetune: {r.finetuned.note.removeprefix('finetune: ')}")
    if run is not None and r.calibration_data.random:
        warnings.append("calibrated on random data: a smoke test; real inputs give the real ranges")
    warnings += _data_warnings(r, run)
    if not r.judged:
        warnings.append(NOT_JUDGED)
    if r.size_after > r.size_before and r.kept_float_weights:
        warnings.append(
            f"the quantized model is larger than the float model ({r.size_before} -> {r.size_after} bytes): "
            f"weight(s) {listed(r.kept_float_weights, 3)} are read by quantized nodes and by nodes left float, so each is stored "
            "twice, float and quantized: quantize every reader of a shared weight, or leave them all float"
        )
    elif r.size_after > r.size_before:
        warnings.append(
            f"the quantized model is larger than the float model ({r.size_before} -> {r.size_after} bytes): its Q/DQ "
            "nodes, scales and zero points outweigh what its weights save; a model of so few weights gains no size"
        )
    if r.onnxruntime_error is not None:
        runtime = target(options.target)
        warnings.append(unloadable_text(UNLOADABLE, r.onnxruntime_error, options, runtime, r.evaluation.backend))
    unexpected = [] if fusion is None else [n for n in fusion.unfused if n not in by_design]
    if unexpected:
        warnings.append(
            f"{target(options.target).runtime} runs {len(unexpected)} quantized node(s) in float where an integer kernel was expected "
            f"(its selectors did not match the layout): {listed(unexpected, _UNFUSED_SHOWN)}"
        )
    if fusion is not None:
        warnings += target(options.target).run_notes(fusion, r.judged)
    slowest = max(r.latency, key=lambda t: t.ratio, default=None)
    if slowest is not None and slowest.ratio > SLOWER:
        warnings.append(_slower_text(slowest, by_design, fusion, target(options.target).runtime))
    if r.search is not None and not r.search.met:
        warnings.append(
            f"target not met ({r.search.target.describe()}): the best model found has {figure_text(r.search.figure, r.search.target.metric)} "
            f"after {len(r.search.promotions)} promotion(s); allow more nodes in float (max_float) or lower the target"
        )
    return warnings


def _data_warnings(r: ReportInputs, run: CalibrationRun | None) -> list[str]:
    """What the data leaves unjudged: too few samples to calibrate or to judge the target on, arrays no input reads."""
    out = []
    if run is not None and not r.calibration_data.random and 0 < run.samples < FEW_CALIBRATION_SAMPLES:
        out.append(f"calibrated on {run.samples} sample(s): ranges from so few are rough; give more calibration data")
    held = r.evaluation.samples
    goal = r.search.target if r.search is not None else None
    if 0 < held < FEW_HELD_OUT_SAMPLES:
        # One sample more or less moves the agreement by 1/held: what was met on so few says little.
        judged = f"the accuracy target ({goal.describe()}) was judged" if goal is not None else "the figures rest"
        out.append(
            f"{judged} on {held} held-out sample(s), each {1 / held:.1%} of the agreement: too few to tell; "
            "give more data, or eval data of your own"
        )
    for what, ds in (("calibration data", r.calibration_data), ("eval data", r.eval_data)):
        if ds.unused:
            out.append(f"the {what} holds arrays no model input reads, ignored: {listed(ds.unused, _UNFUSED_SHOWN)}")
    return list(dict.fromkeys(out))


def _interval(evaluation: Evaluation) -> Interval | None:
    """The agreement's 95% Wilson interval and the decisions it was measured on."""
    n = evaluation.top1_decisions
    if evaluation.top1_agreement is None or not n:
        return None
    low, high = wilson_interval(round(evaluation.top1_agreement * n), n)
    return Interval(low, high, n)


def _promotions(search: Search | None) -> Promotions | None:
    if search is None:
        return None
    return Promotions(
        target=TargetSpec(search.target.metric, search.target.value, search.target.describe()),
        met=search.met,
        before=search.start_figure,
        after=search.figure,
        evaluations=search.evaluations,
        steps=[
            PromotionStep(
                p.node, p.before.describe(), p.after.describe(), p.figure if p.measured else None, search.costs.get(p.node)
            )
            for p in search.promotions
        ],
        order=search.order,
    )


def report_json(report: Report) -> str:
    """The report as strict JSON (an infinite SQNR, which no JSON number holds, is written as null)."""
    return report.to_json()
