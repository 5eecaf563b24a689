"""The report's printed form: a summary table, the warnings and the most degraded nodes, with rich."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from qlinear._table import Table
from qlinear.quantize._placement import PROMOTED_TO_FLOAT, left_float_text, listed
from qlinear.quantize._report_schema import Report
from qlinear.quantize._report_text import cost_text, db_text, figure_text, measure_rows, order_text, runtime_name, share_text
from qlinear.quantize._tradeoff import latency_text
from qlinear.quantize.targets import QDQ_FORM

__all__ = ["MOST_DEGRADED", "print_profile", "print_report"]

MOST_DEGRADED = 15
NODE_MIN_WIDTH = 12  # characters of a node's name the degraded-nodes table keeps on one line at 80 columns


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


_LEFT_FLOAT_SHOWN = 4  # nodes named in the summary's "left float" row; the JSON report has them all


def _types_text(report: Report) -> str:
    """The types asked for, and the types the model holds where promotions (or the runtime's rules) changed them."""
    settings = report.settings
    promoted = sum(n.reason == PROMOTED_TO_FLOAT for n in report.left_float)

    def side(asked: str | None, key: str) -> str:
        held = Counter(getattr(n, key) for n in report.nodes if getattr(n, key))
        if not (set(held) - {asked} or (promoted and asked)):
            return ""
        parts = [f"{t} x{k}" for t, k in held.most_common()] + ([f"float x{promoted}"] if promoted else [])
        return f" asked, held as {', '.join(parts)}"

    weights = f"weights {settings.weights} {settings.granularity}" + side(settings.weights, "weight_type")
    acts = settings.activations
    activations = f"activations {acts}" + side(acts, "activation_type") if acts else "activations float (weight-only)"
    form = f", form {settings.format}" if settings.format != QDQ_FORM else ""  # a runtime's own op, not standard QDQ
    return f"{weights}, {activations}, opset {settings.opset}{form}"


def _print_tradeoff(report: Report, console: Console) -> None:
    """The models the search built, timed, where the result is slower than float or misses its target."""
    decision, rows = report.decision, report.tradeoff
    if not rows or decision is None or (decision.faster is not False and decision.target_met is not False):
        return
    metric = _metric(report)
    table = Table(title="the trade-off measured (latency over the float model's, in pairs)")
    for col in ("promotions", "accuracy", "latency", "size", "flags"):
        table.add_column(col, no_wrap=col not in ("latency", "flags"))
    for row in rows:
        latency = latency_text(row.latency)
        mark = " (written)" if row.chosen else ""
        table.add_row(f"{row.promotions}{mark}", figure_text(row.figure, metric), latency, _bytes(row.size_bytes), row.flags)
    console.print(table)


def _metric(report: Report) -> str:
    """The metric the report's figures are of: its target's, else output SQNR."""
    return "sqnr" if report.promotions is None else report.promotions.target.metric


def print_report(
    report: Report, console: Console, *, analysis: bool = False, options_named: Callable[[str], str] | None = None
) -> None:
    """A summary table, the promotions, and the most degraded nodes (at most :data:`MOST_DEGRADED`).

    ``analysis``: also every node's sensitivity, weight and activation SQNR.
    ``options_named``: a warning's text with the options it names as the
    caller's user wrote them (the command line's flags); by default as is.
    """
    decision = report.decision
    if decision is not None:  # the first line: what a user decides on
        slower_or_missed = decision.faster is False or decision.target_met is False
        console.print(f"[{'bold yellow' if slower_or_missed else 'bold green'}]{decision.line}[/]", highlight=False)
    summary = Table(title="qlinear quantize", show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    size = report.size_bytes
    summary.add_row("model", f"{report.model.input} -> {report.model.output}")
    summary.add_row("types", _types_text(report))
    summary.add_row("size", f"{_bytes(size.before)} -> {_bytes(size.after)} ({size.after / size.before:.2f}x)")
    for lat in report.latency_ms:
        summary.add_row(
            f"latency ({runtime_name(report)})",
            f"{lat.before:.3f} ms -> {lat.after:.3f} ms a batch of {lat.batch} ({lat.ratio:.2f}x, pairs' median)",
        )
    out = report.output
    parts, outputs = out.sqnr_db_parts, out.sqnr_db_outputs
    worst = ""
    if outputs:  # the first output is the first key
        noisy = {name: db for name, db in outputs.items() if db is not None}
        name = min(noisy, key=noisy.get) if noisy else next(iter(outputs))
        worst = f" (the worst of {len(outputs)} outputs: {name})"
        parts = parts if name == next(iter(outputs)) else None  # the parts are the first output's
    if parts:
        worst += f" (the worst of {len(parts)} concatenated parts: {', '.join(db_text(p) for p in parts)} dB)"
    judged = report.eval.samples > 0  # no data: nothing measured, and None is not "exact"
    summary.add_row("output SQNR", f"{db_text(out.sqnr_db)} dB{worst}" if judged else "not measured (no data)")
    interval = out.top1_agreement_interval
    if out.top1_agreement is not None:  # an output without classes (boxes, a map, an embedding) has no such row
        summary.add_row(
            "top-1 agreement",
            share_text(out.top1_agreement)
            + (
                f" (95% interval {share_text(interval.low)} to {share_text(interval.high)}, {interval.decisions} decisions)"
                if interval
                else ""
            ),
        )
    for row in measure_rows(out):
        summary.add_row(*row)
    if out.metric:
        summary.add_row("metric", f"{out.metric.name}: {out.metric.value:.6g}")
    if out.accuracy:
        summary.add_row("accuracy", f"{share_text(out.accuracy.before)} -> {share_text(out.accuracy.after)}")
    cal = report.calibration
    if cal.method is None:
        summary.add_row("calibration", "none (weight-only)")
    elif cal.from_stats:
        summary.add_row("calibration", f"from saved statistics {cal.from_stats} ({cal.method})")
    else:
        summary.add_row(
            "calibration",
            f"{cal.method} on {cal.source}: {cal.samples} samples in {cal.batches} batches "
            f"of {cal.batch_size or report.settings.batch_size}"
            + (f" (input {cal.batch_fixed_by} fixes the batch)" if cal.batch_fixed_by else "")
            + f", {cal.seconds:.2f} s, peak RSS {_bytes(cal.peak_rss_bytes)}",
        )
    if judged:
        summary.add_row("evaluation", f"{report.eval.source} ({report.eval.samples} samples, {report.eval.backend})")
    tuned = report.finetune
    if tuned is not None:
        held = tuned.held_out
        figures = (
            f"output SQNR {db_text(held.sqnr_db_before)} -> {db_text(held.sqnr_db_after)} dB"
            if held.agreement_before is None
            else f"top-1 agreement {share_text(held.agreement_before)} -> {share_text(held.agreement_after)}, "
            f"output SQNR {db_text(held.sqnr_db_before)} -> {db_text(held.sqnr_db_after)} dB"
        )
        kept = "kept" if tuned.kept else "[red]not kept[/]"
        summary.add_row("fine-tuned", f"{tuned.steps} steps, {tuned.seconds:.1f} s: {figures} on the held-out data; {kept}")
    fusion = report.fusion
    if fusion.checked:
        unfused, by_design = fusion.unfused, fusion.float_by_design
        text = f"{len(report.nodes) - len(unfused)} of {len(report.nodes)} quantized nodes"
        if by_design:
            reasons = Counter(why.split(":", 1)[0] for why in by_design.values())
            text += "; in float by design: " + ", ".join(f"{count} ({what})" for what, count in reasons.most_common())
        if fusion.integer_gates:
            text += f"; {len(fusion.integer_gates)} gates (HardSwish, SiLU, ...) as integer Add/Mul/Sigmoid"
        summary.add_row(f"fused by {runtime_name(report)}", f"{text}; {fusion.qdq_nodes_left} Q/DQ nodes left")
    else:
        summary.add_row(
            f"fused by {runtime_name(report)}", f"not checked ({runtime_name(report, full=True)} cannot load the model's types)"
        )
    kept_float = [(n.name, n.op_type, n.reason) for n in report.left_float if n.reason != PROMOTED_TO_FLOAT]
    if kept_float:  # the promoted ones have their own table below
        summary.add_row("left float", left_float_text(kept_float, _LEFT_FLOAT_SHOWN))
    widened = report.widened
    if widened:
        shown = listed([f"{n.name} {n.asked} -> {n.stored}" for n in widened], _LEFT_FLOAT_SHOWN)
        summary.add_row("weights widened", f"{shown} ({'; '.join(dict.fromkeys(n.reason for n in widened))})")
    promotions = report.promotions
    if promotions:
        metric = promotions.target.metric
        state = "met" if promotions.met else "[red]not met[/]"
        summary.add_row(
            "target",
            f"{promotions.target.describe()}: {state}; {figure_text(promotions.before, metric)} at the requested types, "
            f"{figure_text(promotions.after, metric)} after {len(promotions.steps)} promotion(s) "
            f"({promotions.evaluations} evaluations)",
        )
    kept = [f for f in report.float_where_faster if f.kept]
    if kept:
        summary.add_row(
            "float for speed",
            "; ".join(f"{f.kind} x{len(f.nodes)} ({f.before:.2f}x -> {f.after:.2f}x)" for f in kept)
            + " (--no-float-where-faster keeps them quantized)",
        )
    settings = [f"{t.setting} ({t.before:.2f}x -> {t.after:.2f}x)" for t in report.run_settings if t.kept]
    if settings:
        summary.add_row("runtime setting", "; ".join(settings) + " (the model's metadata says so; figures measured with it)")
    if report.profile:
        summary.add_row("time", _time_text(report))
    console.print(summary)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(options_named(w) if options_named else w)}")
    if promotions and promotions.steps:
        steps = Table(title=f"promotions ({order_text(promotions.order)})")
        steps.add_column("node", overflow="fold", ratio=1)
        for col in ("from", "to", "figure after", "predicted cost"):
            steps.add_column(col, no_wrap=True)
        for step in promotions.steps:
            after = "-" if step.figure_after is None else figure_text(step.figure_after, promotions.target.metric)
            steps.add_row(step.node, step.from_, step.to, after, cost_text(step.predicted_cost))
        console.print(steps)
    _print_tradeoff(report, console)
    if analysis and report.analysis:
        rows = sorted(report.analysis, key=lambda n: math.inf if n.sensitivity_db is None else n.sensitivity_db)
        table = Table(title="sensitivity: output SQNR with only this node quantized (dB), lowest first")
        table.add_column("node", overflow="fold", ratio=1)
        for col in ("alone dB", "weight dB", "activation dB"):
            table.add_column(col, no_wrap=True, justify="right")
        for n in rows:
            activation = "-" if n.activation_sqnr_db is None else db_text(n.activation_sqnr_db)  # None: activations left float
            table.add_row(n.name, db_text(n.sensitivity_db), db_text(n.weight_sqnr_db), activation)
        console.print(table)
    # Without data, the weights' own figures rank them.
    figure = (lambda n: n.output_sqnr_db) if judged else (lambda n: n.weight_sqnr_db)
    nodes = sorted(report.nodes, key=lambda n: math.inf if figure(n) is None else figure(n))
    if not nodes:
        return
    title = f"most degraded nodes ({min(len(nodes), MOST_DEGRADED)} of {len(nodes)}; SQNR of weight and output in dB)"
    table = Table(title=title)
    # The node's name keeps a share of a narrow terminal: the other text columns wrap, the figures do not.
    table.add_column("node", overflow="fold", ratio=1, min_width=min(NODE_MIN_WIDTH, max(len(n.name) for n in nodes)))
    table.add_column("op")
    table.add_column("types")
    table.add_column("weight", no_wrap=True, justify="right")
    table.add_column("output", no_wrap=True, justify="right")
    table.add_column(f"{runtime_name(report)} runs as")
    for n in nodes[:MOST_DEGRADED]:
        types = f"{n.weight_type or '-'}/{n.activation_type or '-'}"
        output = db_text(n.output_sqnr_db) if judged else "-"
        table.add_row(n.name, n.op_type, types, db_text(n.weight_sqnr_db), output, n.runs_as or "-")
    console.print(table)


_STAGES_NAMED = 3  # the costliest stages the summary's time row names


def _time_text(report: Report) -> str:
    """The run's wall time and where most of it went."""
    total = sum(t.seconds for t in report.profile)
    costliest = sorted(report.profile, key=lambda t: -t.seconds)[:_STAGES_NAMED]
    return f"{total:.1f} s: " + ", ".join(f"{t.stage} {t.seconds:.1f} s" for t in costliest) + " (--profile: every stage)"


def print_profile(report: Report, console: Console) -> None:
    """Each stage's wall time, its share of the run, and the peak memory while it ran; its parts below it."""
    total = sum(t.seconds for t in report.profile) or 1.0
    table = Table(title=f"where the run's {total:.1f} s went")
    table.add_column("stage", overflow="fold")
    for col in ("seconds", "share", "peak RSS"):
        table.add_column(col, no_wrap=True, justify="right")
    for t in report.profile:
        peak = _bytes(t.peak_rss_bytes) + ("" if t.peak_since == "stage" else " (run)")
        table.add_row(t.stage, f"{t.seconds:.2f}", f"{t.seconds / total:.0%}", peak)
        for part in t.parts:
            table.add_row(f"  {part.name}", f"{part.seconds:.2f}", f"{part.seconds / total:.0%}", "")
    console.print(table)
