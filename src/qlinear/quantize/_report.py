"""The report pass: one JSON-able dict of what the quantizer did and measured, and its printed form."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from qlinear._table import Table
from qlinear.quantize._calibrate import MATMUL_NBITS_ACCURACY_LEVEL, CalibrationRun
from qlinear.quantize._convert import ConvertedNode
from qlinear.quantize._data import Dataset
from qlinear.quantize._equalize import Equalized
from qlinear.quantize._evaluate import Evaluation
from qlinear.quantize._fusion import MODEL_OUTPUT_CONV, FusionCheck, float_by_design
from qlinear.quantize._mixed import Search
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._plan import PROMOTED_TO_FLOAT, WIDENED_TABLE, Plan, left_float_text, listed
from qlinear.quantize._sensitivity import NodeSensitivity
from qlinear.quantize._smoothquant import Smoothed

__all__ = ["MOST_DEGRADED", "PassResults", "build_report", "print_report", "report_json"]

MOST_DEGRADED = 15
_UNFUSED_SHOWN = 5  # names the unfused-node warning lists before ", and N more"
NODE_MIN_WIDTH = 12  # characters of a node's name the degraded-nodes table keeps on one line at 80 columns


@dataclass
class PassResults:
    """What each pass of one run produced, as the report reads it."""

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
    latency: tuple[float, float] | None
    latency_batch: int
    sensitivity: dict[str, NodeSensitivity] = field(default_factory=dict)  # every node the requested types quantize
    requested_figures: tuple[float | None, float | None] = (None, None)  # output SQNR, agreement at the requested types
    search: Search | None = None  # None: no target
    smoothed: list[Smoothed] = field(default_factory=list)
    awq: list[Smoothed] = field(default_factory=list)
    equalized: list[Equalized] = field(default_factory=list)
    finetuned: Any = None  # a FinetuneResult, where fine-tuning was asked for
    gates: list[str] = field(default_factory=list)  # gates written for integer kernels (_integer_gates)


# The quantized model's latency over the float one's past which the report warns (the timing's noise is about 0.1).
SLOWER = 1.15


def _slower_text(latency: tuple[float, float], batch: int, by_design: dict[str, str], fusion: FusionCheck | None) -> str:
    """Why the quantized model may be slower than the float one, as far as the run knows."""
    before, after = latency
    causes = []
    reasons = Counter(why.split(":")[0] for why in by_design.values())
    for what, n in reasons.most_common():
        advice = " (promotions: --no-promote or a lower target trades accuracy for speed)" if what == "16-bit activations" else ""
        causes.append(f"{n} node(s) in float by design ({what}){advice}")
    if fusion is not None and fusion.qdq_nodes_left:
        causes.append(f"{fusion.qdq_nodes_left} Q/DQ nodes left around float operators, each a pass over its tensor")
    return (
        f"the quantized model is slower than the float one on ONNX Runtime: {after:.3f} ms against {before:.3f} ms a "
        f"batch of {batch} ({after / before:.2f}x)" + "".join(f"; {c}" for c in causes)
    )


def build_report(r: PassResults) -> dict[str, Any]:
    """The report: the run's settings and every figure, as plain JSON-able values."""
    fusion, evaluation, run, options = r.fusion, r.evaluation, r.calibration, r.options
    nodes = []
    for p in r.plan.nodes:
        c = r.converted[p.name]
        nodes.append(
            {
                "name": p.name,
                "op_type": p.op_type,
                "weight_type": c.weight_type,
                "activation_type": c.activation_type,
                "weight_sqnr_db": c.weight_sqnr_db,
                "output_sqnr_db": evaluation.node_sqnr_db.get(p.name),
                "sensitivity_db": _figure(r.sensitivity, p.name, "sensitivity_db"),
                "activation_sqnr_db": _figure(r.sensitivity, p.name, "activation_db"),
                "fused": None if fusion is None else fusion.fused[p.name],
                "runs_as": None if fusion is None else fusion.runs_as[p.name],
                "bias_int32": c.bias_int32,
                "bias_corrected": c.bias_corrected,
                "weight_bytes": {"before": c.weight_bytes_before, "after": c.weight_bytes_after},
            }
        )
    warnings = []
    if r.finetuned is not None and r.finetuned.note:
        warnings.append(f"finetune: {r.finetuned.note.removeprefix('finetune: ')}")
    if run is not None and r.calibration_data.random:
        warnings.append("calibrated on random data: a smoke test; real inputs give the real ranges")
    no_output_q = {p.name for p in r.plan.nodes if p.op_type == "Conv" and p.activations and p.output is None}
    by_design = {
        n["name"]: why
        for n in nodes
        if fusion is not None and n["name"] in fusion.unfused
        if (
            why := float_by_design(n["op_type"], n["weight_type"], n["activation_type"])
            or (MODEL_OUTPUT_CONV if n["name"] in no_output_q else None)
            or fusion.by_layout.get(n["name"])
        )
    }
    unexpected = [] if fusion is None else [n for n in fusion.unfused if n not in by_design]
    if unexpected:
        warnings.append(
            f"ONNX Runtime runs {len(unexpected)} quantized node(s) in float where an integer kernel was expected "
            f"(its selectors did not match the layout): {listed(unexpected, _UNFUSED_SHOWN)}"
        )
    nbits = 0 if fusion is None else sum(op == "MatMulNBits" for op in fusion.runs_as.values())
    if nbits:
        warnings.append(
            f"ONNX Runtime runs {nbits} MatMul(s) as MatMulNBits: the figures here are at its accuracy level 0 (the input "
            f"stays float, as the model says); its default, 4, quantizes their inputs to int8: set the session entry "
            f'"{MATMUL_NBITS_ACCURACY_LEVEL}" to "0" where you run the model'
        )
    if r.latency is not None and r.latency[1] > SLOWER * r.latency[0]:
        warnings.append(_slower_text(r.latency, r.latency_batch, by_design, fusion))
    if r.search is not None and not r.search.met:
        warnings.append(
            f"target not met ({r.search.target.describe()}): the best model found has {_figure_text(r.search.figure, r.search.target.metric)} "
            f"after {len(r.search.promotions)} promotion(s); allow more nodes in float (max_float) or lower the target"
        )
    accuracy = None
    if evaluation.accuracy_after is not None:
        accuracy = {"before": evaluation.accuracy_before, "after": evaluation.accuracy_after}
    return {
        "model": {"input": r.model_name, "output": str(r.output) if r.output else None},
        "settings": {**options.to_dict(), "opset": r.opset},
        "size_bytes": {"before": r.size_before, "after": r.size_after},
        "latency_ms": None if r.latency is None else {"before": r.latency[0], "after": r.latency[1], "batch": r.latency_batch},
        "calibration": {
            "method": options.method if options.activations else None,
            "source": None if options.activations is None or r.stats_path else r.calibration_data.source,
            "batches": run.batches if run else 0,
            "batch_size": run.batch_size if run else 0,  # cut below --batch-size where a batch's tensors are large
            "samples": run.samples if run else 0,
            "seconds": run.seconds if run else 0.0,
            "peak_rss_bytes": run.peak_rss_bytes if run else 0,
            "from_stats": r.stats_path,
        },
        "eval": {"source": r.eval_data.source, "samples": evaluation.samples, "backend": evaluation.backend},
        "output": {
            "sqnr_db": evaluation.output_sqnr_db,
            "sqnr_db_parts": evaluation.output_part_sqnr_db,
            "sqnr_db_outputs": evaluation.output_sqnr_db_by_output,  # each judged output's, where there are several
            "top1_agreement": evaluation.top1_agreement,
            "accuracy": accuracy,
        },
        "fusion": {
            "checked": fusion is not None,
            "unfused": [] if fusion is None else fusion.unfused,
            "float_by_design": by_design,  # unfused nodes whose types ONNX Runtime has no integer kernel for, and why
            "qdq_nodes_left": None if fusion is None else fusion.qdq_nodes_left,
            "integer_gates": r.gates,  # HardSwish, SiLU and like gates between uint8 tensors, as integer kernels take them
        },
        "nodes": nodes,
        "analysis": [
            {
                "name": f.name,
                "sensitivity_db": f.sensitivity_db,
                "weight_sqnr_db": f.weight_db,
                "activation_sqnr_db": f.activation_db,
            }
            for f in r.sensitivity.values()
        ],
        "requested": {"sqnr_db": r.requested_figures[0], "top1_agreement": r.requested_figures[1]},
        "promotions": _promotions(r.search),
        "smoothquant": _scaled(r.smoothed),
        "awq": _scaled(r.awq),
        "equalized": [
            {"first": e.first, "second": e.second, "largest_scale": e.largest, "smallest_scale": e.smallest} for e in r.equalized
        ],
        "left_float": [{"name": n, "op_type": op, "reason": why} for n, op, why in r.plan.left_float],
        "widened": [
            {"name": n, "asked": asked, "stored": stored, "reason": WIDENED_TABLE} for n, asked, stored in r.plan.widened
        ],
        "finetune": None if r.finetuned is None else r.finetuned.to_dict(),
        "warnings": warnings,
    }


def _figure(figures: dict[str, NodeSensitivity], name: str, attr: str) -> float | None:
    f = figures.get(name)
    return None if f is None else getattr(f, attr)


def _figure_text(value: float | None, metric: str) -> str:
    if metric == "agreement":
        return f"top-1 agreement {_share(value)}"
    return f"output SQNR {_db(value)} dB"


def _scaled(done: list[Smoothed]) -> list[dict[str, Any]]:
    return [
        {
            "tensor": m.tensor,
            "nodes": list(m.nodes),
            "alpha": m.alpha,
            "sample_error_before": m.error_before,
            "sample_error_after": m.error_after,
        }
        for m in done
    ]


def _promotions(search: Search | None) -> dict[str, Any] | None:
    if search is None:
        return None
    return {
        "target": {"metric": search.target.metric, "value": search.target.value},
        "met": search.met,
        "before": search.start_figure,
        "after": search.figure,
        "evaluations": search.evaluations,
        "steps": [
            {
                "node": p.node,
                "from": p.before.describe(),
                "to": p.after.describe(),
                "figure_after": p.figure if p.measured else None,
            }
            for p in search.promotions
        ],
    }


def report_json(report: dict[str, Any]) -> str:
    """The report as strict JSON (an infinite SQNR, which no JSON number holds, is written as null)."""
    return json.dumps(_strict(report), indent=2)


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _db(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


_LEFT_FLOAT_SHOWN = 4  # nodes named in the summary's "left float" row; the JSON report has them all


def print_report(report: dict[str, Any], console: Console, *, analysis: bool = False) -> None:
    """A summary table, the promotions, and the most degraded nodes (at most :data:`MOST_DEGRADED`).

    ``analysis``: also every node's sensitivity, weight and activation SQNR.
    """
    summary = Table(title="qlinear quantize", show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    size = report["size_bytes"]
    summary.add_row("model", f"{report['model']['input']} -> {report['model']['output']}")
    settings = report["settings"]
    acts = settings["activations"] or "float (weight-only)"
    summary.add_row(
        "types", f"weights {settings['weights']} {settings['granularity']}, activations {acts}, opset {settings['opset']}"
    )
    summary.add_row("size", f"{_bytes(size['before'])} -> {_bytes(size['after'])} ({size['after'] / size['before']:.2f}x)")
    lat = report.get("latency_ms")
    if lat:
        summary.add_row(
            "latency (ORT)",
            f"{lat['before']:.3f} ms -> {lat['after']:.3f} ms a batch of {lat['batch']} ({lat['after'] / lat['before']:.2f}x)",
        )
    out = report["output"]
    parts, outputs = out.get("sqnr_db_parts"), out.get("sqnr_db_outputs")
    worst = ""
    if outputs:  # the first output is the first key
        noisy = {name: db for name, db in outputs.items() if db is not None}
        name = min(noisy, key=noisy.get) if noisy else next(iter(outputs))
        worst = f" (the worst of {len(outputs)} outputs: {name})"
        parts = parts if name == next(iter(outputs)) else None  # the parts are the first output's
    if parts:
        worst += f" (the worst of {len(parts)} concatenated parts: {', '.join(_db(p) for p in parts)} dB)"
    summary.add_row("output SQNR", f"{_db(out['sqnr_db'])} dB{worst}")
    summary.add_row("top-1 agreement", _share(out["top1_agreement"]))
    if out.get("accuracy"):
        acc = out["accuracy"]
        summary.add_row("accuracy", f"{_share(acc['before'])} -> {_share(acc['after'])}")
    cal = report["calibration"]
    if cal["method"] is None:
        summary.add_row("calibration", "none (weight-only)")
    elif cal.get("from_stats"):
        summary.add_row("calibration", f"from saved statistics {cal['from_stats']} ({cal['method']})")
    else:
        summary.add_row(
            "calibration",
            f"{cal['method']} on {cal['source']}: {cal['samples']} samples in {cal['batches']} batches "
            f"of {cal.get('batch_size') or report['settings']['batch_size']}, "
            f"{cal['seconds']:.2f} s, peak RSS {_bytes(cal['peak_rss_bytes'])}",
        )
    summary.add_row(
        "evaluation", f"{report['eval']['source']} ({report['eval']['samples']} samples, {report['eval']['backend']})"
    )
    tuned = report.get("finetune")
    if tuned is not None:
        figures = (
            f"output SQNR {_db(tuned['sqnr_db_before'])} -> {_db(tuned['sqnr_db_after'])} dB"
            if tuned["agreement_before"] is None
            else f"top-1 agreement {_share(tuned['agreement_before'])} -> {_share(tuned['agreement_after'])}, "
            f"output SQNR {_db(tuned['sqnr_db_before'])} -> {_db(tuned['sqnr_db_after'])} dB"
        )
        kept = "kept" if tuned["kept"] else "[red]not kept[/]"
        summary.add_row("fine-tuned", f"{tuned['steps']} steps, {tuned['seconds']:.1f} s: {figures} on the held-out data; {kept}")
    fusion = report["fusion"]
    if fusion["checked"]:
        unfused, by_design = fusion["unfused"], fusion.get("float_by_design", {})
        text = f"{len(report['nodes']) - len(unfused)} of {len(report['nodes'])} quantized nodes"
        if by_design:
            reasons = Counter(why.split(":", 1)[0] for why in by_design.values())
            text += "; in float by design: " + ", ".join(f"{count} ({what})" for what, count in reasons.most_common())
        gates = fusion.get("integer_gates") or []
        if gates:
            text += f"; {len(gates)} gates (HardSwish, SiLU, ...) as integer Add/Mul/Sigmoid"
        summary.add_row("fused by ORT", f"{text}; {fusion['qdq_nodes_left']} Q/DQ nodes left")
    else:
        summary.add_row("fused by ORT", "not checked (ONNX Runtime cannot load the model's types)")
    kept_float = [
        (n["name"], n["op_type"], n["reason"]) for n in report.get("left_float", []) if n["reason"] != PROMOTED_TO_FLOAT
    ]
    if kept_float:  # the promoted ones have their own table below
        summary.add_row("left float", left_float_text(kept_float, _LEFT_FLOAT_SHOWN))
    widened = report.get("widened", [])
    if widened:
        shown = listed([f"{n['name']} {n['asked']} -> {n['stored']}" for n in widened], _LEFT_FLOAT_SHOWN)
        summary.add_row("tables widened", f"{shown} ({widened[0]['reason']})")
    promotions = report.get("promotions")
    if promotions:
        metric = promotions["target"]["metric"]
        value = promotions["target"]["value"]
        target = f"top-1 agreement >= {_share(value)}" if metric == "agreement" else f"output SQNR >= {value:g} dB"
        state = "met" if promotions["met"] else "[red]not met[/]"
        summary.add_row(
            "target",
            f"{target}: {state}; {_figure_text(promotions['before'], metric)} at the requested types, "
            f"{_figure_text(promotions['after'], metric)} after {len(promotions['steps'])} promotion(s) "
            f"({promotions['evaluations']} evaluations)",
        )
    console.print(summary)
    for w in report.get("warnings", []):
        console.print(f"[yellow]warning:[/] {w}")
    if promotions and promotions["steps"]:
        steps = Table(title="promotions (most sensitive nodes first)")
        steps.add_column("node", overflow="fold", ratio=1)
        for col in ("from", "to", "figure after"):
            steps.add_column(col, no_wrap=True)
        for step in promotions["steps"]:
            after = "-" if step["figure_after"] is None else _figure_text(step["figure_after"], promotions["target"]["metric"])
            steps.add_row(step["node"], step["from"], step["to"], after)
        console.print(steps)
    if analysis and report.get("analysis"):
        rows = sorted(report["analysis"], key=lambda n: math.inf if n["sensitivity_db"] is None else n["sensitivity_db"])
        table = Table(title="sensitivity: output SQNR with only this node quantized (dB), lowest first")
        table.add_column("node", overflow="fold", ratio=1)
        for col in ("alone dB", "weight dB", "activation dB"):
            table.add_column(col, no_wrap=True, justify="right")
        for n in rows:
            activation = "-" if n["activation_sqnr_db"] is None else _db(n["activation_sqnr_db"])  # None: activations left float
            table.add_row(n["name"], _db(n["sensitivity_db"]), _db(n["weight_sqnr_db"]), activation)
        console.print(table)
    nodes = sorted(report["nodes"], key=lambda n: math.inf if n["output_sqnr_db"] is None else n["output_sqnr_db"])
    if not nodes:
        return
    title = f"most degraded nodes ({min(len(nodes), MOST_DEGRADED)} of {len(nodes)}; SQNR of weight and output in dB)"
    table = Table(title=title)
    # The node's name keeps a share of a narrow terminal: the other text columns wrap, the figures do not.
    table.add_column("node", overflow="fold", ratio=1, min_width=min(NODE_MIN_WIDTH, max(len(n["name"]) for n in nodes)))
    table.add_column("op")
    table.add_column("types")
    table.add_column("weight", no_wrap=True, justify="right")
    table.add_column("output", no_wrap=True, justify="right")
    table.add_column("ORT runs as")
    for n in nodes[:MOST_DEGRADED]:
        types = f"{n['weight_type'] or '-'}/{n['activation_type'] or '-'}"
        table.add_row(n["name"], n["op_type"], types, _db(n["weight_sqnr_db"]), _db(n["output_sqnr_db"]), n["runs_as"] or "-")
    console.print(table)
