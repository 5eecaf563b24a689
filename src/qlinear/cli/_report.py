"""Render a saved quantizer report (`qlinear quantize --report REPORT.json`) as a self-contained HTML page.

The page opens offline: summary and settings, a chart of every node's
sensitivity and SQNR along the graph, the promotions, what ONNX Runtime
runs each node as, and a sortable table of every node. Needs plotly (pip
install 'qlinear[report]'). Exit status 0, or 2 on bad input (one line on
stderr, nothing written).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from qlinear._errors import QuantizationError
from qlinear.quantize._html import render_html
from qlinear.quantize._report_schema import Report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report", metavar="REPORT.json", help="a report written by qlinear quantize --report REPORT.json")
    parser.add_argument("-o", "--output", metavar="REPORT.html", required=True, help="where to write the HTML page")


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        try:
            text = Path(args.report).read_text(encoding="utf-8")
        except OSError as e:
            raise QuantizationError(f"cannot read {args.report}: {e.strerror}") from None
        except UnicodeDecodeError:  # a binary file: statistics (.npz) or a model
            raise QuantizationError(
                f"{args.report} is not a report: expected the JSON that qlinear quantize --report REPORT.json writes, got a binary file"
            ) from None
        page = render_html(Report.from_json(text))
        write_page(args.output, page)
    except QuantizationError as e:
        err.print(f"qlinear report: {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    return 0


def write_page(path: str, page: str) -> None:
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as e:
        raise QuantizationError(f"cannot write {path}: {e.strerror}") from None
