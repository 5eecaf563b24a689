"""Check qlinear, onnx.reference and ONNX Runtime against the ONNX spec.

Runs ONNX's backend test cases for QuantizeLinear, DequantizeLinear and
DynamicQuantizeLinear and a generated matrix of edge cases (every version x
type x granularity, extreme values, NaN, ragged blocks) and prints how many
cases each implementation gets right. Exit status 0 when qlinear agrees with
the spec on every case.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from qlinear._table import Table
from qlinear.cli._args import add_json, json_on_stdout, write_json
from qlinear.cli._warmup import warm_up
from qlinear.conformance._run import run_conformance


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json(parser, "the full report", path_after_json=True)
    parser.add_argument("--no-onnxruntime", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--no-reference", action="store_true", help="leave onnx.reference out")
    parser.add_argument("--backend-only", action="store_true", help="run only ONNX's backend cases")
    parser.add_argument("--all", action="store_true", help="list every disagreeing case, not one line per kind")


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=json_on_stdout(args))
    # The cpu backend's kernels first, under a line that says so: in a fresh
    # environment they compile (minutes), which a progress bar would hide.
    warm_up(console, verbose=False)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=None)
        report = run_conformance(
            onnxruntime=not args.no_onnxruntime,
            reference=not args.no_reference,
            generated=not args.backend_only,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    table = Table(title="Agreement with the ONNX specification")
    for column in ("implementation", "suite", "agree", "disagree", "unsupported", "error"):
        table.add_column(column, justify="left" if column in ("implementation", "suite") else "right")
    for impl in report.implementations():
        for suite in ("backend", "generated"):
            c = report.counts(impl, suite)
            if sum(c.values()):
                table.add_row(escape(impl), suite, str(c["agree"]), str(c["disagree"]), str(c["unsupported"]), str(c["error"]))
    console.print(table)
    for impl in report.implementations():
        if args.all:
            for o in report.outcomes:
                if o.implementation == impl and o.status in ("disagree", "error"):
                    console.print(f"  {escape(impl)} {o.status} on {o.case}: {escape(o.detail)}", highlight=False)
            continue
        kinds = report.disagreement_kinds(impl)
        if kinds:
            console.print(f"[bold]{escape(impl)}[/] disagrees with the spec on {len(kinds)} kinds of case:")
        for key, count, example in kinds:
            console.print(f"  {escape(key)} ({count} cases), e.g. {example.case}: {escape(example.detail)}", highlight=False)
    verdict = report.qlinear_conforms()
    console.print(
        "qlinear agrees with the specification on every case." if verdict else "qlinear DISAGREES with the specification."
    )
    if args.json or args.json_file:
        write_json(json.dumps(report.to_json(), indent=2, default=str), args)
    return 0 if verdict else 1
