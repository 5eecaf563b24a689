"""Show an ONNX model's opsets and Q/DQ nodes: types, granularity, scales, sizes, problems.

Lists every QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear node
with its quantized type, granularity, axis, block size, scale range and zero
points, the bytes its constant quantized tensor takes against its float size,
and every node the model's opset does not allow. Exit status 0 when the model
has no problems, 1 when it has some, 2 when it cannot be read.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape

from qlinear._errors import QuantizationError
from qlinear._table import Table
from qlinear.cli._args import add_json, write_json
from qlinear.onnx._inspect import ModelReport, inspect_model
from qlinear.onnx._io import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL.onnx", help="the model file (external data is read from beside it)")
    add_json(parser, "the report")


def run(args: argparse.Namespace) -> int:
    try:
        report = inspect_model(load(args.model))
    except QuantizationError as e:
        Console(stderr=True).print(f"qlinear inspect: {escape(str(e))}", highlight=False)
        return 2
    if args.json or args.json_file:
        write_json(json.dumps(report.to_json(), indent=2), args)
    if not args.json:
        _print(Console(), report)
    return 1 if report.problems or report.warnings else 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _print(console: Console, report: ModelReport) -> None:
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(report.opsets.items()))
    console.print(
        f"IR version {report.ir_version}; opsets: {escape(opsets)}; "
        f"{report.node_count} nodes in domains {escape(', '.join(report.node_domains))}",
        highlight=False,
    )
    table = Table(title=f"{len(report.qdq_nodes)} Q/DQ nodes")
    for column in ("node", "op", "type", "granularity", "axis", "block", "scale range", "zero points", "stored / float"):
        table.add_column(column, justify="right" if column in ("axis", "block") else "left")
    for n in report.qdq_nodes:
        op = n.op if not n.domain else f"{n.op} ({n.domain})"
        scales = (
            "" if n.scale_min is None else f"{n.scale_min:.4g}" + ("" if n.scale_min == n.scale_max else f" .. {n.scale_max:.4g}")
        )
        zps = (
            "" if n.zero_points is None else ((" .. " if n.zero_points_are_range else ", ").join(f"{z:g}" for z in n.zero_points))
        )
        sizes = f"{_size(n.quantized_bytes)} / {_size(n.float_bytes)}" if n.float_bytes else ""
        if n.subgraph:
            op = f"{op} in {n.subgraph}"
        if n.problem:
            table.add_row(escape(n.name), escape(op), "[red]invalid[/]", "", "", "", "", "", "")
        else:
            table.add_row(
                escape(n.name),
                escape(op),
                n.quantized_type,
                n.granularity,
                "" if n.axis is None else str(n.axis),
                str(n.block_size or ""),
                scales,
                escape(zps),
                sizes,
            )
    console.print(table)
    for t in report.gathered_tables:
        console.print(
            f"Table gathered as codes: {escape(t.name)} reads {escape(t.table)} ({t.quantized_type}, {t.rows} x {t.columns}; "
            f"{_size(t.quantized_bytes)} / {_size(t.float_bytes)}), dequantizing only the rows it gathers.",
            highlight=False,
        )
    if report.float_bytes:
        ratio = report.float_bytes / report.quantized_bytes
        kept = f"; {_size(report.float_kept_bytes)} of float constants stored as they are" if report.float_kept_bytes else ""
        console.print(
            f"Quantized constants: {_size(report.quantized_bytes)} stored for {_size(report.float_bytes)} "
            f"of floats ({ratio:.2f}x smaller){kept}.",
            highlight=False,
        )
    for problem in report.problems:
        console.print(f"[red]problem:[/] {escape(problem)}", highlight=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
