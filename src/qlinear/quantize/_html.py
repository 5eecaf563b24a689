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
import json
import math
from typing import Any

from qlinear._errors import QuantizationError
from qlinear.quantize._html_assets import SORT_SCRIPT, STYLE
from qlinear.quantize._option_fields import command_words
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._placement import PROMOTED_TO_FLOAT
from qlinear.quantize._report_text import latencies_of, target_text

__all__ = ["render_html", "report_from_json"]


def render_html(report: dict[str, Any]) -> str:
    """The report (``QuantizeResult.report``, or its JSON read back) as a self-contained HTML page.

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
    title = f"qlinear quantize: {report['model']['input']}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _decision(report),
        _summary(report),
        *(f'<p class="warning">{_e(w)}</p>' for w in report.get("warnings", [])),
        "<h2>Every node along the graph</h2>",
        "<p>Sensitivity: the model's output SQNR with only that node quantized. Output: the node's own output in the "
        "quantized model against the float model (the error of everything up to it). Promoted nodes are marked; "
        "nodes promoted to float have no output figure.</p>",
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


def _node_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row a node the requested types quantize, in graph order, with its final state."""
    final = {n["name"]: n for n in report["nodes"]}
    promoted = {}
    for step in (report.get("promotions") or {}).get("steps", []):
        promoted[step["node"]] = step["to"]
    floated = {n["name"] for n in report.get("left_float", []) if n["reason"] == PROMOTED_TO_FLOAT}
    rows = []
    seen = set()
    for a in report.get("analysis") or [{"name": n["name"]} for n in report["nodes"]]:
        name = a["name"]
        seen.add(name)
        n = final.get(name, {})
        status = "float (promoted)" if name in floated else ("promoted" if name in promoted else "as requested")
        rows.append(
            {
                "name": name,
                "op_type": n.get("op_type") or _op_of(report, name),
                "weight_type": n.get("weight_type"),
                "activation_type": n.get("activation_type"),
                "sensitivity_db": a.get("sensitivity_db"),
                "weight_sqnr_db": n.get("weight_sqnr_db", a.get("weight_sqnr_db")),
                "activation_sqnr_db": a.get("activation_sqnr_db"),
                "output_sqnr_db": n.get("output_sqnr_db"),
                "runs_as": n.get("runs_as"),
                "fused": n.get("fused"),
                "status": status,
                "promoted_to": promoted.get(name),
            }
        )
    for n in report["nodes"]:  # nodes the analysis did not cover (none today; kept so the table never drops one)
        if n["name"] not in seen:
            rows.append({**n, "sensitivity_db": None, "activation_sqnr_db": None, "status": "as requested", "promoted_to": None})
    return rows


def _op_of(report: dict[str, Any], name: str) -> str:
    return next((n["op_type"] for n in report.get("left_float", []) if n["name"] == name), "")


def _chart(go, nodes: list[dict[str, Any]]):
    names = [n["name"] for n in nodes]
    hover = [
        f"{n['name']} ({n['op_type']})<br>weights {n['weight_type'] or 'float'}, activations {n['activation_type'] or 'float'}"
        f"<br>{n['status']}" + (f": {n['promoted_to']}" if n["promoted_to"] else "")
        for n in nodes
    ]
    colors = ["#e69500" if n["status"] != "as requested" else "#4c78a8" for n in nodes]
    figure = go.Figure()
    figure.add_bar(
        x=names, y=[_num(n["sensitivity_db"]) for n in nodes], name="sensitivity (only this node quantized)",
        marker_color=colors, customdata=hover, hovertemplate="%{customdata}<br>sensitivity %{y:.1f} dB<extra></extra>",
    )  # fmt: skip
    for key, label, symbol in (
        ("output_sqnr_db", "output of the node", "circle"),
        ("weight_sqnr_db", "weight", "diamond"),
        ("activation_sqnr_db", "input activation", "triangle-up"),
    ):
        figure.add_scatter(
            x=names, y=[_num(n[key]) for n in nodes], name=label, mode="lines+markers" if key == "output_sqnr_db" else "markers",
            marker_symbol=symbol, customdata=hover, hovertemplate="%{customdata}<br>" + label + " %{y:.1f} dB<extra></extra>",
        )  # fmt: skip
    floated = [n["name"] for n in nodes if n["status"] == "float (promoted)"]
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


def _summary(report: dict[str, Any]) -> str:
    size, out = report["size_bytes"], report["output"]
    rows = [
        ("model", f"{report['model']['input']} → {report['model']['output'] or '(not written)'}"),
        ("size", f"{_bytes(size['before'])} → {_bytes(size['after'])} ({size['after'] / size['before']:.2f}x)"),
    ]
    for lat in latencies_of(report):
        rows.append(
            (
                "latency (ONNX Runtime)",
                f"{lat['before']:.3f} ms → {lat['after']:.3f} ms a batch of {lat['batch']} ({lat['ratio']:.2f}x, pairs' median)",
            )
        )
    requested = report.get("requested") or {}
    rows.append(
        ("top-1 agreement", f"{_share(requested.get('top1_agreement'))} at the requested types → {_share(out['top1_agreement'])}")
    )
    rows.append(("output SQNR", f"{_db(requested.get('sqnr_db'))} dB at the requested types → {_db(out['sqnr_db'])} dB"))
    if out.get("accuracy"):
        rows.append(("accuracy", f"{_share(out['accuracy']['before'])} float → {_share(out['accuracy']['after'])} quantized"))
    promotions = report.get("promotions")
    if promotions:
        t = promotions["target"]
        target = target_text(t).replace(">=", "≥")
        state = '<span class="good">met</span>' if promotions["met"] else '<span class="bad">not met</span>'
        rows.append(("target", f"{_e(target)}: {state}, {len(promotions['steps'])} promotion(s)"))
    widened = report.get("widened") or []
    if widened:
        tables = ", ".join(f"{n['name']} {n['asked']} → {n['stored']}" for n in widened)
        rows.append(("tables widened", f"{tables} ({widened[0]['reason']})"))
    tuned = report.get("finetune")
    if tuned:
        state = "kept" if tuned["kept"] else f"not kept: {tuned['note']}"
        rows.append(
            (
                "fine-tuned",
                f"{tuned['steps']} steps, {tuned['seconds']:.1f} s: top-1 agreement {_share(tuned['agreement_before'])} → "
                f"{_share(tuned['agreement_after'])}, output SQNR {_db(tuned['sqnr_db_before'])} → {_db(tuned['sqnr_db_after'])} dB "
                f"on the held-out data; {state}",
            )
        )
    rows.append(("settings", f"<code>{_e(_command(report))}</code>"))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v if k in ('target', 'settings') else _e(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _command(report: dict[str, Any]) -> str:
    """The command line that repeats the run's settings."""
    s = report["settings"]
    parts = ["qlinear quantize", report["model"]["input"], "-o", str(report["model"]["output"] or "OUT.onnx")]
    parts += command_words(s, QuantizeOptions)
    if "data_flags" in report:  # the data too, as given (placeholders for arrays given in Python)
        return " ".join([*parts, *report["data_flags"]])
    cal = report.get("calibration", {})
    if cal.get("from_stats"):
        parts += ["--stats", cal["from_stats"]]
    return " ".join(parts)


def _decision(report: dict[str, Any]) -> str:
    decision = report.get("decision")
    if not decision:
        return ""
    good = decision["faster"] is not False and decision["target_met"] is not False
    return f'<p class="{"decision" if good else "warning"}"><strong>{_e(decision["line"])}</strong></p>'


def _tradeoff(report: dict[str, Any]) -> str:
    rows = report.get("tradeoff") or []
    if not rows:
        return ""
    metric = (report.get("promotions") or {}).get("target", {}).get("metric", "sqnr")

    def latency(c: dict[str, Any]) -> str:
        return "-" if c["latency"] is None else f"{c['latency']['ratio']:.2f}x at {c['latency']['batch']}"

    body = "".join(
        f"<tr><td>{c['promotions']}{' (written)' if c['chosen'] else ''}</td>"
        f'<td class="num">{_figure(c["figure"], metric)}</td><td class="num">{latency(c)}</td>'
        f'<td class="num">{_bytes(c["size_bytes"])}</td><td><code>{_e(c["flags"])}</code></td></tr>'
        for c in rows
    )
    return (
        "<h2>The trade-off measured</h2><p>Models the search built, timed against the float model in alternating pairs "
        "at the batch the users run (latency over the float model's, below 1 is faster).</p>"
        "<table><thead><tr><th>promotions</th><th>accuracy</th><th>latency</th><th>size</th><th>flags</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _promotions(report: dict[str, Any]) -> str:
    promotions = report.get("promotions")
    if not promotions or not promotions["steps"]:
        return ""
    metric = promotions["target"]["metric"]
    rows = "".join(
        f"<tr><td>{k + 1}</td><td>{_e(s['node'])}</td><td>{_e(s['from'])}</td><td>{_e(s['to'])}</td>"
        f'<td class="num">{_figure(s["figure_after"], metric)}</td></tr>'
        for k, s in enumerate(promotions["steps"])
    )
    return (
        "<h2>Promotions, most sensitive node first</h2>"
        "<table><thead><tr><th>#</th><th>node</th><th>from</th><th>to</th><th>figure after</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _left_float(report: dict[str, Any]) -> str:
    """The nodes of quantizable type the plan left in float, and why (promotions have their own table)."""
    kept = [n for n in report.get("left_float", []) if n["reason"] != PROMOTED_TO_FLOAT]
    if not kept:
        return ""
    rows = "".join(f"<tr><td>{_e(n['name'])}</td><td>{_e(n['op_type'])}</td><td>{_e(n['reason'])}</td></tr>" for n in kept)
    return f"<h2>Left float</h2><table><thead><tr><th>node</th><th>op</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>"


def _fusion(report: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    fusion = report.get("fusion") or {}
    if not fusion.get("checked"):
        return "<h2>On ONNX Runtime</h2><p>Not checked: ONNX Runtime cannot load the model's types.</p>"
    by_design = fusion.get("float_by_design") or {}

    def group(n: dict[str, Any]) -> str:
        if n["fused"]:
            return "<span class=good>fused</span>"
        if n["name"] in by_design:
            return f"float between Q/DQ, by design: {_e(by_design[n['name']])}"
        return "<span class=bad>float between Q/DQ</span>"

    rows = "".join(
        f"<tr><td>{_e(n['name'])}</td><td>{_e(n['runs_as'] or '-')}</td><td>{group(n)}</td></tr>"
        for n in nodes
        if n["runs_as"] is not None
    )
    gates = fusion.get("integer_gates") or []
    gates_text = (
        f" {len(gates)} gates (HardSwish, SiLU and like products) written so that they run as QLinearAdd, QLinearSigmoid"
        f" and QLinearMul: {_e(', '.join(gates))}."
        if gates
        else ""
    )
    return (
        "<h2>On ONNX Runtime</h2>"
        f"<p>Each quantized node as ONNX Runtime's optimizer left it; {fusion.get('qdq_nodes_left')} Q/DQ nodes left."
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


def _node_table(nodes: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{_e(label)}</th>" for label, _, _ in _COLUMNS)
    body = []
    for n in nodes:
        cells = []
        for _, key, kind in _COLUMNS:
            v = n.get(key)
            if kind == "db":
                # No figure: a node now float has no output; an activation left float has no error ("-"), unlike an exact one.
                none_means_absent = key == "activation_sqnr_db" or (key == "output_sqnr_db" and n["status"] == "float (promoted)")
                text = "-" if v is None and none_means_absent else _db(v)
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


def _db(v: float | None) -> str:
    return "exact" if v is None else f"{v:.1f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _figure(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    if metric == "metric":
        return f"{v:.4g}"
    return _share(v) if metric in ("agreement", "decisions") else f"{v:.1f} dB"


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def report_from_json(text: str) -> dict[str, Any]:
    """A report read back from its JSON; raises QuantizationError where it is not one."""
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise QuantizationError(f"the report is not JSON: {e}") from None
    missing = [
        k for k in ("model", "settings", "size_bytes", "output", "nodes") if not isinstance(report, dict) or k not in report
    ]
    if missing:
        raise QuantizationError(f"not a qlinear quantize report: it lacks {', '.join(missing)}")
    return report
