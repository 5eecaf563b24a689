"""Time qlinear's cpu kernels against ONNX Runtime, onnx.reference and the bandwidth floor.

For QuantizeLinear and DequantizeLinear over element types and
granularities, on the same float32 inputs in one process: qlinear (cpu
backend; 2/4-bit types in ONNX's packed layout), ONNX Runtime on the same
node with the same number of intra-op threads (a Q+DQ pair where it cannot
pass the type to numpy, marked *), onnx.reference, and the bandwidth floor:
bytes read and written divided by the bandwidth of a parallel copy on the
same threads. qlinear is timed as users call it (a fresh result each
call) and into a reused ``out=`` buffer; the floor is held against the
latter. Ratios are times: qlinear/ORT below 1 means qlinear is faster.
With ``--startup``, start-up and compile times in fresh processes instead;
with ``--stores``, qlinear's streaming stores against its ordinary ones, in
pairs (for judging a change to the kernels on a noisy machine); with
``--ort-pairs``, qlinear against ONNX Runtime in pairs.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import Progress

from qlinear._table import Table
from qlinear.bench import (
    GRANULARITIES,
    MORE_TYPES,
    TYPES,
    X_DTYPES,
    run_after_ort,
    run_benchmark,
    run_load,
    run_ort_pairs,
    run_startup,
    run_store_pairs,
    startup_table,
)
from qlinear.bench._machine import machine, machine_line
from qlinear.bench._measure import SETTLE_S
from qlinear.cli._args import add_json, cpu_count, int_in, json_on_stdout, name_in, write_json

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size", type=int_in(1, what="a size"), default=1 << 24, help="float32 elements of x (default 16M: 16384 x 1024)"
    )
    parser.add_argument(
        "--threads",
        type=int_in(1, cpu_count, what="a thread count"),
        default=min(2, cpu_count()),
        help="threads for qlinear and ONNX Runtime (default 2)",
    )
    parser.add_argument(
        "--repeats",
        type=int_in(1, what="a repeat count"),
        default=5,
        help=(
            "timed calls per case, best kept; with --startup, fresh processes per step, median kept; "
            "with --stores or --ort-pairs, pairs per case, 20 or more for a few percent (default 5)"
        ),
    )
    parser.add_argument(
        "--x-dtype",
        default="float32",
        choices=list(X_DTYPES),
        help="x's type, and the scale's and DequantizeLinear's result's (default float32)",
    )
    parser.add_argument("--reference", action="store_true", help="also time onnx.reference (slow: seconds per case at 16M)")
    parser.add_argument(
        "--types",
        nargs="+",
        default=list(TYPES),
        choices=TYPES + MORE_TYPES,
        metavar="TYPE",
        help=f"element types (default: {' '.join(TYPES)}; also {' '.join(MORE_TYPES)})",
    )
    parser.add_argument(
        "--granularities",
        nargs="+",
        default=list(GRANULARITIES),
        type=name_in(GRANULARITIES),
        metavar="G",
        help=f"granularities among: {', '.join(g.replace(' ', '-') for g in GRANULARITIES)}",
    )
    parser.add_argument(
        "--startup",
        action="store_true",
        help="instead, time import, first calls and cold compiles in fresh processes (--repeats of each)",
    )
    parser.add_argument(
        "--stores",
        action="store_true",
        help="instead, time qlinear with streaming stores against ordinary ones, in pairs (--repeats pairs a case)",
    )
    parser.add_argument(
        "--ort-pairs",
        action="store_true",
        help="instead, time qlinear against ONNX Runtime in pairs, back to back (--repeats pairs a case)",
    )
    parser.add_argument(
        "--load",
        type=int_in(1, what="a count of busy cores"),
        metavar="N",
        help="instead, keep N cores busy with other processes and time qlinear (on --threads and on 1 thread) and ONNX Runtime, --repeats rounds a case",
    )
    parser.add_argument(
        "--after-ort",
        action="store_true",
        help="instead, time qlinear right after an ONNX Runtime run, no pause, against after a pause (--repeats rounds a case)",
    )
    add_json(parser, "the measurements", path_after_json=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def _write_json(report: dict, args: argparse.Namespace) -> None:
    if args.json or args.json_file:
        report = {"machine": machine(), **report}
        write_json(json.dumps(report, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v), args)


def _run_startup(args: argparse.Namespace, console: Console) -> int:
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("start-up", total=None)
        startup = run_startup(
            repeats=args.repeats, progress=lambda done, total: progress.update(task, completed=done, total=total)
        )
    console.print(startup_table(startup))
    _write_json({"startup": startup}, args)
    return 0


def _with_progress(console: Console, label: str, measure: Callable[..., dict], **kwargs: Any) -> dict:
    """``measure(**kwargs, progress=...)`` under a transient progress bar."""
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)
        return measure(**kwargs, progress=lambda done, total: progress.update(task, completed=done, total=total))


def _pairs_table(title: str, columns: tuple[str, str, str], rows: list[dict], keys: tuple[str, str]) -> Table:
    """A table of paired timings: the case, both medians, and the median ratio with its quartiles."""
    table = Table(title=title)
    for column in ("op", "type", "granularity", *columns, "quartiles"):
        table.add_column(column, justify="left" if column in ("op", "type", "granularity") else "right")
    for row in rows:
        case = (row["op"], row["type"] + (" (packed)" if row["packed"] else ""), row["granularity"])
        if row["ratio"] is None:
            table.add_row(*case, "-", row.get("ort_mode", "-"), "-", "-")
            continue
        table.add_row(
            *case,
            _ms(row[keys[0]]),
            _ms(row[keys[1]]),
            f"{row['ratio']:.3f}",
            f"{row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}",
        )
    return table


def _run_stores(args: argparse.Namespace, console: Console) -> int:
    cases = dict(types=tuple(args.types), granularities=tuple(args.granularities))
    report = _with_progress(
        console, "store pairs", run_store_pairs, size=args.size, threads=args.threads, pairs=args.repeats, **cases
    )
    title = (
        f"streaming stores over ordinary ones, {report['size']:,} elements, {report['threads']} threads, "
        f"{report['pairs']} pairs a case"
    )
    console.print(_pairs_table(title, ("streamed ms", "plain ms", "streamed/plain"), report["rows"], ("streamed_s", "plain_s")))
    console.print(
        "Times: medians over the pairs; streamed/plain: the median of each pair's own ratio (below 1: streaming is faster)."
    )
    _write_json(report, args)
    return 0


def _run_ort_pairs(args: argparse.Namespace, console: Console) -> int:
    cases = dict(types=tuple(args.types), granularities=tuple(args.granularities))
    report = _with_progress(
        console, "ONNX Runtime pairs", run_ort_pairs, size=args.size, threads=args.threads, pairs=args.repeats, **cases
    )
    title = f"qlinear over ONNX Runtime, {report['size']:,} elements, {report['threads']} threads, {report['pairs']} pairs a case"
    console.print(_pairs_table(title, ("qlinear ms", "ORT ms", "qlinear/ORT"), report["rows"], ("qlinear_s", "ort_s")))
    console.print(
        "Times: medians over the pairs; qlinear/ORT: the median of each pair's own ratio (below 1: qlinear is faster). "
        "Q+DQ: ONNX Runtime runs the pair (it cannot hand the type to numpy); qlinear runs Q then DQ."
    )
    _write_json(report, args)
    return 0


def _case_cells(row: dict) -> tuple[str, str, str]:
    return row["op"], row["type"] + (" (packed)" if row["packed"] else ""), row["granularity"]


def _run_load(args: argparse.Namespace, console: Console) -> int:
    cases = dict(types=tuple(args.types), granularities=tuple(args.granularities))
    report = _with_progress(
        console, "under load", run_load, size=args.size, threads=args.threads, rounds=args.repeats, load=args.load, **cases
    )
    n = report["threads"]
    title = (
        f"{report['size']:,} elements with {report['load']} core(s) kept busy by other processes: qlinear on {n} threads and on 1, "
        f"ONNX Runtime on {n}; medians of {report['rounds']} rounds"
    )
    table = Table(title=title)
    for column in ("op", "type", "granularity", f"qlinear {n}T ms", "qlinear 1T ms", "ORT ms", f"{n}T/ORT", f"{n}T/1T"):
        table.add_column(column, justify="left" if column in ("op", "type", "granularity") else "right")
    for row in report["rows"]:
        ort = _ms(row["ort_s"]) + ("*" if row["ort_mode"] == "Q+DQ pair" else "") if row["ort_s"] is not None else row["ort_mode"]
        table.add_row(
            *_case_cells(row),
            _ms(row["qlinear_s"]),
            _ms(row["qlinear_1_s"]),
            ort,
            _ratio(row["qlinear_s"], row["ort_s"]),
            _ratio(row["qlinear_s"], row["qlinear_1_s"]),
        )
    console.print(table)
    console.print("*: ONNX Runtime runs a Q+DQ pair (it cannot hand the type to numpy); qlinear runs Q then DQ.")
    _write_json(report, args)
    return 0


def _run_after_ort(args: argparse.Namespace, console: Console) -> int:
    cases = dict(types=tuple(args.types), granularities=tuple(args.granularities))
    report = _with_progress(
        console, "after ONNX Runtime", run_after_ort, size=args.size, threads=args.threads, rounds=args.repeats, **cases
    )
    title = (
        f"qlinear right after an ONNX Runtime run and after a {SETTLE_S * 1e3:.0f} ms pause, {report['size']:,} elements, "
        f"{report['threads']} threads, medians of {report['rounds']} rounds"
    )
    table = Table(title=title)
    for column in ("op", "type", "granularity", "after ORT ms", "after pause ms", "ratio"):
        table.add_column(column, justify="left" if column in ("op", "type", "granularity") else "right")
    for row in report["rows"]:
        table.add_row(
            *_case_cells(row), _ms(row["after_ort_s"]), _ms(row["settled_s"]), _ratio(row["after_ort_s"], row["settled_s"])
        )
    console.print(table)
    _write_json(report, args)
    return 0


def run(args: argparse.Namespace) -> int:
    # The table is wide; a narrower terminal wraps lines rather than cells. With --json, tables go to stderr.
    console = Console(width=150, stderr=json_on_stdout(args))
    if args.load is not None and args.load < 0:
        Console(stderr=True).print(f"qlinear bench: --load must be >= 0, got {args.load}", highlight=False)
        return 2
    # Figures from different processors differ by more than most changes: every table says which it came from.
    console.print(machine_line(), highlight=False)
    if args.load is not None:
        return _run_load(args, console)
    if args.after_ort:
        return _run_after_ort(args, console)
    if args.startup:
        return _run_startup(args, console)
    if args.stores:
        return _run_stores(args, console)
    if args.ort_pairs:
        return _run_ort_pairs(args, console)
    cases = dict(types=tuple(args.types), granularities=tuple(args.granularities))
    report = _with_progress(
        console,
        "benchmark",
        run_benchmark,
        size=args.size,
        threads=args.threads,
        repeats=args.repeats,
        reference=args.reference,
        x_dtype=args.x_dtype,
        **cases,
    )
    low, high = report["copy_bandwidth_range"]
    title = (
        f"qlinear cpu kernels, {report['size']:,} {report['x_dtype']} elements, {report['threads']} threads; "
        f"floor at {report['copy_bandwidth'] / 1e9:.1f} GB/s, the median of copies timed before each type and "
        f"granularity ({low / 1e9:.1f}-{high / 1e9:.1f})"
    )
    table = Table(title=title)
    for column in (
        "op",
        "type",
        "granularity",
        "qlinear ms",
        "out= ms",
        "ORT ms",
        "ref ms",
        "floor ms",
        "qlinear/ORT",
        "out=/floor",
        "mem/out",
    ):
        table.add_column(column, justify="left" if column in ("op", "type", "granularity") else "right")
    for row in report["rows"]:
        pair = row["ort_mode"] == "Q+DQ pair"
        ort = _ms(row["ort_s"]) + ("*" if pair else "") if row["ort_s"] is not None else row["ort_mode"]
        mine = row["qlinear_plain_pair_s"] if pair else row["qlinear_plain_s"]
        memory = row["peak_extra_bytes"] / (row["output_bytes"] + row["scale_bytes"])
        table.add_row(
            row["op"],
            row["type"] + (" (packed)" if row["packed"] else ""),
            row["granularity"],
            _ms(row["qlinear_plain_s"]),
            _ms(row["qlinear_s"]),
            ort,
            _ms(row["reference_s"]),
            _ms(row["floor_s"]),
            _ratio(mine, row["ort_s"]),
            _ratio(row["qlinear_s"], row["floor_s"]),
            f"{memory:.2f}",
        )
    console.print(table)
    console.print("* ONNX Runtime timed as a QuantizeLinear+DequantizeLinear pair; qlinear/ORT then compares qlinear's Q+DQ.")
    console.print("qlinear ms: the plain call (a fresh result each call); out= ms: into a reused buffer.")
    console.print("mem/out: peak memory a qlinear call allocates, over its output plus scales and zero points.")
    _write_json(report, args)
    return 0
