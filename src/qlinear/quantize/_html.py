"""The report as one self-contained HTML page: summary, a chart of every node along the graph, the fusion and node tables.

The chart is drawn by plotly (the ``report`` extra), whose JavaScript is
inlined, so the page opens offline and fetches nothing. plotly over
Vega-Lite (altair needs vl-convert, a 30 MB native wheel, to inline its
JavaScript) and bokeh (a smaller page, 1.3 MB against 4.8, but Jinja2,
pillow, tornado, PyYAML and contourpy to install): plotly's wheel is pure
Python and needs only narwhals and packaging. The node table sorts on a
click on its header, by a few lines of script written here.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from qlinear._errors import QuantizationError
from qlinear.quantize._html_assets import SORT_SCRIPT, STYLE
from qlinear.quantize._option_fields import command_words
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._placement import PROMOTED_TO_FLOAT
from qlinear.quantize._records import plain
from qlinear.quantize._report_schema import NodeAnalysis, NodeRow, Report
from qlinear.quantize._report_text import cost_text, db_text, figure_value, measure_rows, order_text, runtime_name, share_text
from qlinear.quantize._speed import FASTER_IN_FLOAT
from qlinear.quantize._tradeoff import latency_text

__all__ = ["render_html"]


def render_html(report: Report) -> str:
    """The report (``QuantizeResult.report``, or ``Report.from_json`` of its JSON) as a self-contained HTML page.

    Raises:
        QuantizationError: plotly is not installed (the ``report`` extra).
    """
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise QuantizationError("the HTML report draws its chart with plotly: pip install 'qlinear[report]'") from None
    nodes = _node_rows(report)
    figure = _chart(go, nodes)
    chart = figure.to_html(full_html=False, include_plotlyjs=True, config={"displaylogo": False, "responsive": True})
    title = f"qlinear quantize: {report.model.input}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _decision(report),
        _summary(report),
        *(f'<p class="warning">{_e(w)}</p>' for w in report.warnings),
        "<h2>Every node along the graph</h2>",
        "<p>Sensitivity: the model's output SQNR with only that node quantized. Output: the node's own output in the "
        "quantized model against the float model (the error of everything up to it). Promoted nodes are marked; "
        "nodes promoted to float have no output figure."
        + (
            ""
            if report.analysis
            else " The sensitivity was not measured: the search took no step (analyze=True, --analyze, measures it)."
        )
        + "</p>",
        f'<div id="chart">{chart}</div>',
        _tradeoff(report),
        _promotions(report),
        _left_float(report),
        _fusion(report, nodes),
        _node_table(nodes),
        f"<script>{SORT_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


@dataclass(frozen=True)
class _Row:
    """A node as the chart and the tables show it: its figures and its final state."""

    name: str
    op_type: str
    weight_type: str | None
    activation_type: str | None
    sensitivity_db: float | None
    weight_sqnr_db: float | None
    activation_sqnr_db: float | None
    output_sqnr_db: float | None
    runs_as: str | None
    fused: bool | None
    status: str  # as requested, promoted, float (promoted), float (faster)
    promoted_to: str | None


def _node_rows(report: Report) -> list[_Row]:
    """One row a node the requested types quantize, in graph order, with its final state."""
    final = {n.name: n for n in report.nodes}
    promoted = {step.node: step.to for step in (report.promotions.steps if report.promotions else [])}
    floated = {n.name for n in report.left_float if n.reason == PROMOTED_TO_FLOAT}
    faster = {n.name for n in report.left_float if n.reason == FASTER_IN_FLOAT.why}
    ops = {n.name: n.op_type for n in report.left_float}
    analysed = {a.name: a for a in report.analysis}
    # Without an analysis (the search took no step), the quantized nodes in graph order, then those now float.
    names = list(analysed) or [
        *(n.name for n in report.nodes),
        *(n.name for n in report.left_float if n.name in floated | faster),
    ]
    rows = []
    for name in names:
        n, a = final.get(name), analysed.get(name)
        status = "float (promoted)" if name in floated else "float (faster)" if name in faster else (
            "promoted" if name in promoted else "as requested"
        )  # fmt: skip
        rows.append(_row(name, ops.get(name, ""), n, a, status, promoted.get(name)))
    for n in report.nodes:  # nodes the analysis did not cover (none today; kept so the table never drops one)
        if analysed and n.name not in analysed:
            rows.append(_row(n.name, n.op_type, n, None, "as requested", None))
    return rows


def _row(name: str, op_type: str, n: NodeRow | None, a: NodeAnalysis | None, status: str, promoted_to: str | None) -> _Row:
    """A node's row from its final state ``n`` (None: now float) and its analysis ``a`` (None: not analysed)."""
    return _Row(
        name=name,
        op_type=n.op_type if n else op_type,
        weight_type=n.weight_type if n else None,
        activation_type=n.activation_type if n else None,
        sensitivity_db=a.sensitivity_db if a else None,
        weight_sqnr_db=n.weight_sqnr_db if n else (a.weight_sqnr_db if a else None),
        activation_sqnr_db=a.activation_sqnr_db if a else None,
        output_sqnr_db=n.output_sqnr_db if n else None,
        runs_as=n.runs_as if n else None,
        fused=n.fused if n else None,
        status=status,
        promoted_to=promoted_to,
    )


def _chart(go, nodes: list[_Row]):
    names = [n.name for n in nodes]
    hover = [
        f"{n.name} ({n.op_type})<br>weights {n.weight_type or 'float'}, activations {n.activation_type or 'float'}"
        f"<br>{n.status}" + (f": {n.promoted_to}" if n.promoted_to else "")
        for n in nodes
    ]
    colors = ["#e69500" if n.status != "as requested" else "#4c78a8" for n in nodes]
    figure = go.Figure()
    figure.add_bar(
        x=names, y=[_num(n.sensitivity_db) for n in nodes], name="sensitivity (only this node quantized)",
        marker_color=colors, customdata=hover, hovertemplate="%{customdata}<br>sensitivity %{y:.1f} dB<extra></extra>",
    )  # fmt: skip
    for key, label, symbol in (
        ("output_sqnr_db", "output of the node", "circle"),
        ("weight_sqnr_db", "weight", "diamond"),
        ("activation_sqnr_db", "input activation", "triangle-up"),
    ):
        figure.add_scatter(
            x=names, y=[_num(getattr(n, key)) for n in nodes], name=label, mode="lines+markers" if key == "output_sqnr_db" else "markers",
            marker_symbol=symbol, customdata=hover, hovertemplate="%{customdata}<br>" + label + " %{y:.1f} dB<extra></extra>",
        )  # fmt: skip
    floated = [n.name for n in nodes if n.status == "float (promoted)"]
    if floated:
        figure.add_scatter(
            x=floated, y=[0] * len(floated), name="promoted to float", mode="markers+text", text=["float"] * len(floated),
            textposition="top center", marker_symbol="x", marker_color="#b00020", hoverinfo="x+name",
        )  # fmt: skip
    # Exporters' node names run to 80 characters: the axis shows their ends, the hover the whole name.
    figure.update_xaxes(tickvals=names, ticktext=[_tick(n) for n in names])
    figure.update_layout(
        yaxis_title="SQNR (dB, higher is better)", xaxis_title="node, in graph order", height=480,
        legend={"orientation": "h", "y": 1.12}, margin={"l": 60, "r": 20, "t": 40, "b": 120}, template="plotly_white",
    )  # fmt: skip
    return figure


def _summary(report: Report) -> str:
    size, out, requested = report.size_bytes, report.output, report.requested
    rows = [
        ("model", f"{report.model.input} → {report.model.output or '(not written)'}"),
        ("size", f"{_bytes(size.before)} → {_bytes(size.after)} ({size.after / size.before:.2f}x)"),
    ]
    for lat in report.latency_ms:
        rows.append(
            (
                f"latency ({_e(runtime_name(report, full=True))})",
                f"{lat.before:.3f} ms → {lat.after:.3f} ms a batch of {lat.batch} ({lat.ratio:.2f}x, pairs' median)",
            )
        )
    figures = []
    if out.top1_agreement is not None:  # an output without classes (boxes, a map, an embedding) has no such row
        figures.append(
            (
                "top-1 agreement",
                f"{share_text(requested.top1_agreement)} at the requested types → {share_text(out.top1_agreement)}",
            )
        )
    figures.append(("output SQNR", f"{db_text(requested.sqnr_db)} dB at the requested types → {db_text(out.sqnr_db)} dB"))
    figures += measure_rows(out)
    if report.eval.samples == 0:  # no data: nothing was measured, and no figure is "exact"
        figures = [("output SQNR", "not measured (no data)")]
    rows += figures
    if out.accuracy:
        rows.append(("accuracy", f"{share_text(out.accuracy.before)} float → {share_text(out.accuracy.after)} quantized"))
    promotions = report.promotions
    if promotions:
        target = promotions.target.describe().replace(">=", "≥")
        state = '<span class="good">met</span>' if promotions.met else '<span class="bad">not met</span>'
        rows.append(("target", f"{_e(target)}: {state}, {len(promotions.steps)} promotion(s)"))
    if report.widened:
        tables = ", ".join(f"{n.name} {n.asked} → {n.stored}" for n in report.widened)
        rows.append(("weights widened", f"{tables} ({'; '.join(dict.fromkeys(n.reason for n in report.widened))})"))
    tuned = report.finetune
    if tuned:
        state = "kept" if tuned.kept else f"not kept: {tuned.note}"
        held = tuned.held_out
        rows.append(
            (
                "fine-tuned",
                f"{tuned.steps} steps, {tuned.seconds:.1f} s: top-1 agreement {share_text(held.agreement_before)} → "
                f"{share_text(held.agreement_after)}, output SQNR {db_text(held.sqnr_db_before)} → {db_text(held.sqnr_db_after)} dB "
                f"on the held-out data; {state}",
            )
        )
    rows.append(("settings", f"<code>{_e(_command(report))}</code>"))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v if k in ('target', 'settings') else _e(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _command(report: Report) -> str:
    """The command line that repeats the run's settings."""
    parts = ["qlinear quantize", report.model.input, "-o", str(report.model.output or "OUT.onnx")]
    parts += command_words(plain(report.settings), QuantizeOptions)
    if report.data_flags is not None:  # the data too, as given (placeholders for arrays given in Python)
        return " ".join([*parts, *report.data_flags])
    if report.calibration.from_stats:
        parts += ["--stats", report.calibration.from_stats]
    return " ".join(parts)


def _decision(report: Report) -> str:
    decision = report.decision
    if decision is None:
        return ""
    good = decision.faster is not False and decision.target_met is not False
    return f'<p class="{"decision" if good else "warning"}"><strong>{_e(decision.line)}</strong></p>'


def _tradeoff(report: Report) -> str:
    if not report.tradeoff:
        return ""
    metric = "sqnr" if report.promotions is None else report.promotions.target.metric

    body = "".join(
        f"<tr><td>{c.promotions}{' (written)' if c.chosen else ''}</td>"
        f'<td class="num">{_figure(c.figure, metric)}</td><td class="num">{latency_text(c.latency)}</td>'
        f'<td class="num">{_bytes(c.size_bytes)}</td><td><code>{_e(c.flags)}</code></td></tr>'
        for c in report.tradeoff
    )
    return (
        "<h2>The trade-off measured</h2><p>Models the search built, timed against the float model in alternating pairs "
        "at each batch the users run (latency over the float model's, below 1 is faster).</p>"
        "<table><thead><tr><th>promotions</th><th>accuracy</th><th>latency</th><th>size</th><th>flags</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _promotions(report: Report) -> str:
    promotions = report.promotions
    if not promotions or not promotions.steps:
        return ""
    metric = promotions.target.metric
    rows = "".join(
        f"<tr><td>{k + 1}</td><td>{_e(s.node)}</td><td>{_e(s.from_)}</td><td>{_e(s.to)}</td>"
        f'<td class="num">{_figure(s.figure_after, metric)}</td><td class="num">{cost_text(s.predicted_cost)}</td></tr>'
        for k, s in enumerate(promotions.steps)
    )
    return (
        f"<h2>Promotions, {order_text(promotions.order)}</h2>"
        "<table><thead><tr><th>#</th><th>node</th><th>from</th><th>to</th><th>figure after</th>"
        f"<th>predicted cost</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _left_float(report: Report) -> str:
    """The nodes of quantizable type the plan left in float, and why (promotions have their own table)."""
    kept = [n for n in report.left_float if n.reason != PROMOTED_TO_FLOAT]
    if not kept:
        return ""
    rows = "".join(f"<tr><td>{_e(n.name)}</td><td>{_e(n.op_type)}</td><td>{_e(n.reason)}</td></tr>" for n in kept)
    return f"<h2>Left float</h2><table><thead><tr><th>node</th><th>op</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>"


def _fusion(report: Report, nodes: list[_Row]) -> str:
    fusion = report.fusion
    if not fusion.checked:
        name = _e(runtime_name(report, full=True))
        return f"<h2>On {name}</h2><p>Not checked: {name} cannot load the model's types.</p>"
    by_design = fusion.float_by_design

    def group(n: _Row) -> str:
        if n.fused:
            return "<span class=good>fused</span>"
        if n.name in by_design:
            return f"float between Q/DQ, by design: {_e(by_design[n.name])}"
        return "<span class=bad>float between Q/DQ</span>"

    rows = "".join(
        f"<tr><td>{_e(n.name)}</td><td>{_e(n.runs_as or '-')}</td><td>{group(n)}</td></tr>"
        for n in nodes
        if n.runs_as is not None
    )
    gates = fusion.integer_gates
    gates_text = (
        f" {len(gates)} gates (HardSwish, SiLU and like products) written so that they run as QLinearAdd, QLinearSigmoid"
        f" and QLinearMul: {_e(', '.join(gates))}."
        if gates
        else ""
    )
    name = _e(runtime_name(report, full=True))
    return (
        f"<h2>On {name}</h2>"
        f"<p>Each quantized node as {name} compiled it; {fusion.qdq_nodes_left} Q/DQ nodes left."
        f"{gates_text}</p>"
        f"<table><thead><tr><th>node</th><th>runs as</th><th>group</th></tr></thead><tbody>{rows}</tbody></table>"
    )


_COLUMNS = (
    ("node", "name", "text"),
    ("op", "op_type", "text"),
    ("status", "status", "text"),
    ("weights", "weight_type", "text"),
    ("activations", "activation_type", "text"),
    ("sensitivity dB", "sensitivity_db", "db"),
    ("weight dB", "weight_sqnr_db", "db"),
    ("activation dB", "activation_sqnr_db", "db"),
    ("output dB", "output_sqnr_db", "db"),
    ("runs as", "runs_as", "text"),
)


def _node_table(nodes: list[_Row]) -> str:
    head = "".join(f"<th>{_e(label)}</th>" for label, _, _ in _COLUMNS)
    body = []
    for n in nodes:
        cells = []
        for _, key, kind in _COLUMNS:
            v = getattr(n, key)
            if kind == "db":
                # No figure: a node now float has no output; an activation left float has no error ("-"), unlike an exact one.
                none_means_absent = key == "activation_sqnr_db" or (key == "output_sqnr_db" and n.status.startswith("float"))
                text = "-" if v is None and none_means_absent else db_text(v)
                cells.append(f'<td class="num">{text}</td>')
            else:
                cells.append(f"<td>{_e(v if v is not None else '-')}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        "<h2>Every node (click a column to sort)</h2>"
        f'<table id="node-table" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def _tick(name: str, most: int = 24) -> str:
    """A node's name as the chart's axis shows it: its end (the part that tells ``.../conv_bank.17/Conv`` apart)."""
    return name if len(name) <= most else "…" + name[-(most - 1) :]


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v


def _figure(v: float | None, metric: str) -> str:
    """A trade-off or promotion row's figure; None: not measured."""
    return "-" if v is None else figure_value(v, metric)


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
