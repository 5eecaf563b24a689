"""Quantize a float ONNX model into a smaller, faster standard QDQ model, and report what it kept.

Calibrates activation ranges on your data (an .npz holding one array per
model input, samples along the first axis), stores Conv, ConvTranspose,
Gemm, MatMul and embedding weights quantized, places Q/DQ where ONNX
Runtime fuses them into integer kernels, checks that it did, and compares
the result with the float model on held-out data. Nodes whose quantization
costs the most accuracy are promoted (wider types, then float) until an
accuracy target holds. `qlinear quantize --demo` runs it on a digits CNN
that ships with qlinear. Exit status 0 on success, 1 when the accuracy
target was not met (the best model found is written), 2 on bad input (one
line on stderr, no file written).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from qlinear._errors import QuantizationError
from qlinear.cli._args import add_json, write_json
from qlinear.quantize import DEFAULT_AGREEMENT, DEFAULT_SQNR_DB, QuantizeOptions, print_report, quantize_model
from qlinear.quantize._execution import unwritable
from qlinear.quantize._html import render_html
from qlinear.quantize._option_fields import add_arguments as add_option_arguments
from qlinear.quantize._option_fields import in_flags, values_from_args
from qlinear.quantize._refusals import check_without_data
from qlinear.quantize._report import UNLOADABLE
from qlinear.quantize._report_print import print_profile
from qlinear.quantize._stream import quantize_weights_streaming, streaming_choice

_DEMO = "digits_resized_cnn"  # the demo's model, in the package's _demo folder with its data (.onnx, .qdq.onnx written)
# quantize_model's arguments that are flags of the command (their names in flag form) but not options.
_ARGUMENTS = ("calibrate_random", "workers", "labels", "stats", "resume")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL.onnx", nargs="?", help="the float model (external data is read from beside it)")
    parser.add_argument("-o", "--output", metavar="OUT.onnx", help="where to write the quantized model")
    parser.add_argument(
        "--demo", action="store_true", help="quantize the digits CNN that ships with qlinear, evaluated on its held-out digits"
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--calibration",
        metavar="DATA.npz",
        help="calibration inputs: one array per model input, samples along axis 0 (or the axis the model names its batch; a scalar for a scalar input)",
    )
    data.add_argument("--calibrate-random", metavar="N", type=int, help="calibrate on N uniform random samples (a smoke test)")
    data.add_argument(
        "--eval",
        metavar="DATA.npz",
        help="held-out inputs for the report's figures (default: the last 20%% of the calibration data)",
    )
    data.add_argument("--labels", metavar="ARRAY", help="the array of --eval holding labels, for accuracy")
    data.add_argument(
        "--save-stats", metavar="STATS.npz", help="write the calibration statistics, as batches complete (see --resume)"
    )
    data.add_argument(
        "--resume",
        metavar="STATS.npz",
        help="continue a calibration stopped while writing --save-stats: its batches are skipped (same data, same order)",
    )
    data.add_argument(
        "--workers", type=int, default=1, metavar="N", help="calibrate in N processes (the same model, bit for bit; default 1)"
    )
    data.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="calibrate as tasks on a Ray cluster: auto, local, or its address (the same model; pip install 'qlinear[ray]')",
    )
    data.add_argument("--stats", metavar="STATS.npz", help="quantize from saved statistics instead of calibrating")
    types = parser.add_argument_group("types")
    algorithms = parser.add_argument_group(
        "algorithms", "each on by default where it helps the types and data given (docs/reference/options.md)"
    )
    target = parser.add_argument_group(
        "accuracy target",
        "qlinear promotes the most sensitive nodes up the target runtime's ladder (wider weights, then float; 16-bit "
        "activations only where the runtime has kernels for them) until the target holds; "
        f"default: {DEFAULT_AGREEMENT:.0%} top-1 agreement with the float model, or {DEFAULT_SQNR_DB:g} dB output SQNR for an "
        "output that does not classify",
    )
    runtime = parser.add_argument_group("target runtime")
    groups = {"data": data, "types": types, "algorithms": algorithms, "accuracy target": target, "target runtime": runtime}
    add_option_arguments(groups, QuantizeOptions)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--report",
        metavar="REPORT.json|.html",
        help="write the report: JSON, or a self-contained HTML page with charts when the name ends in .html "
        "(needs pip install 'qlinear[report]')",
    )
    out.add_argument(
        "--stream-weights",
        action="store_true",
        help="weight-only, one weight at a time from the external data to the output's: for models larger than memory "
        "(int8/uint8/int4/uint4; chosen by itself for --activations none given no data when holding the model in memory, "
        "six times its bytes, would pass half the memory); no calibration or evaluation",
    )
    add_json(out, "the report")
    out.add_argument("--quiet", action="store_true", help="no progress bars and no printed report")
    out.add_argument("--profile", action="store_true", help="print each stage's wall time and peak memory (the report's profile)")


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        _check_report_paths(args)
        why = _streaming(args)
        if why is not None:
            return _stream(args, why)
        result = _quantize(args, err)
        if args.report:
            if args.report.lower().endswith((".html", ".htm")):
                _write_text(args.report, render_html(result.report))
            else:
                _write_text(args.report, result.report.to_json() + "\n")
    except QuantizationError as e:
        message = str(e).removeprefix("quantize: ")  # the library's own prefix, said once by the command's
        message = _in_flags(message)
        err.print(f"qlinear quantize: {escape(message)}", highlight=False, soft_wrap=True)
        return 2
    if args.json or args.json_file:
        write_json(result.report.to_json(), args)
    if not args.json and not args.quiet:
        print_report(result.report, Console(), analysis=args.analyze, options_named=_in_flags)
    else:  # a model the target runtime cannot load is never written silently
        for unloadable in (w for w in result.report.warnings if w.startswith(UNLOADABLE)):
            err.print(f"qlinear quantize: warning: {escape(unloadable)}", highlight=False, soft_wrap=True)
    if args.profile:  # on stderr beside --json, whose stdout is the report alone
        print_profile(result.report, Console(stderr=args.json))
    if not result.target_met:
        # The model is written all the same (the best found); the status says the target was missed.
        missed = next(w for w in result.report.warnings if w.startswith("target not met"))
        err.print(f"qlinear quantize: {escape(_in_flags(missed))}", highlight=False, soft_wrap=True)
        return 1
    return 0


def _demo_output() -> Path:
    """Where the demo writes without ``-o``: a folder of the system's temporary one, not the folder it was run from."""
    folder = Path(tempfile.gettempdir()) / "qlinear-demo"
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        raise QuantizationError(f"--demo writes into {folder}, which cannot be made ({e.strerror}); give -o OUT.onnx") from None
    return folder / f"{_DEMO}.qdq.onnx"


def _in_flags(message: str) -> str:
    """A message of the Python API with the options it names as the flags the user typed."""
    return in_flags(message, QuantizeOptions, _ARGUMENTS)


def _quantize(args: argparse.Namespace, err: Console):
    model, calibration, eval_data, labels, output = args.model, args.calibration, args.eval, args.labels, args.output
    if args.demo:
        if model is not None:
            raise QuantizationError("--demo quantizes the model that ships with qlinear; give no MODEL.onnx with it")
        demo = resources.files("qlinear.quantize") / "_demo"
        model = str(demo / f"{_DEMO}.onnx")
        if calibration is None and args.calibrate_random is None and args.stats is None:
            calibration = str(demo / "digits_calibration.npz")
        if eval_data is None:
            eval_data, labels = str(demo / "digits_eval.npz"), labels or "label"
        output = output or str(_demo_output())
    elif model is None:
        raise QuantizationError("give MODEL.onnx, or --demo")
    if output is None:
        raise QuantizationError("give the output path with -o OUT.onnx")
    options = QuantizeOptions(**values_from_args(args, QuantizeOptions))
    return quantize_model(
        model,
        output,
        calibration,
        eval=eval_data,
        labels=labels,
        calibrate_random=args.calibrate_random,
        stats=args.stats,
        save_stats_to=args.save_stats,
        resume=args.resume,
        workers=args.workers,
        ray=args.ray,
        options=options,
        console=err,
        progress=not args.quiet,
    )


def _streaming(args: argparse.Namespace) -> str | None:
    """Why the weights are quantized one at a time (asked, or a weight-only run given no data too large for memory)."""
    if args.stream_weights:
        return "--stream-weights asked for it"
    if args.activations != "none" or args.model is None or args.output is None or args.demo:
        return None  # (no -o: the in-memory path says what is missing)
    if args.calibration or args.eval or args.stats or args.calibrate_random:
        return None
    return streaming_choice(args.model, QuantizeOptions(**values_from_args(args, QuantizeOptions)))


def _stream(args: argparse.Namespace, why: str) -> int:
    if args.activations != "none":
        raise QuantizationError("--stream-weights quantizes weights only: add --activations none")
    if args.model is None or args.output is None:
        raise QuantizationError("--stream-weights needs MODEL.onnx and -o OUT.onnx")
    for flag in ("calibration", "eval", "stats", "calibrate_random"):
        if getattr(args, flag):
            raise QuantizationError(f"--stream-weights reads no data: leave out --{flag.replace('_', '-')}")
    for flag in ("report", "analyze"):  # what a run one weight at a time does not make: refused, not dropped
        if getattr(args, flag):
            raise QuantizationError(f"weights quantized one at a time ({why}) make no report and no analysis: leave out --{flag}")
    options = QuantizeOptions(**values_from_args(args, QuantizeOptions))
    check_without_data(options)  # a target, a budget, an algorithm that reads data: refused, naming its flag
    r = quantize_weights_streaming(args.model, args.output, options)
    summary = {
        "model": {"input": args.model, "output": str(r.path)},
        "streamed": True,
        "streamed_because": why,
        "judged": False,  # no data: no accuracy target checked, nothing timed
        "weights": r.weights,
        "weight_bytes": {"before": r.bytes_before, "after": r.bytes_after},
        "seconds": r.seconds,
        "peak_rss_bytes": r.peak_rss_bytes,
        "widened": [{"weight": name, "asked": args.weights, "stored": stored, "reason": why} for name, stored, why in r.widened],
    }
    if args.json or args.json_file:
        write_json(json.dumps(summary, indent=2), args)
    if not args.json and not args.quiet:
        Console().print(
            f"qlinear quantize: {r.weights} weights, {r.bytes_before / 2**20:.1f} MiB -> {r.bytes_after / 2**20:.1f} MiB, "
            f"one at a time ({why}), in {r.seconds:.1f} s, peak RSS {r.peak_rss_bytes / 2**20:.0f} MiB -> {r.path} "
            "(no data given: no accuracy target checked and nothing timed; run the model on your runtime to check it)"
            + (
                "; stored wider than asked: "
                + ", ".join(f"{name} at {stored}" for name, stored, _ in r.widened)
                + f" ({'; '.join(dict.fromkeys(why for _, _, why in r.widened))})"
                if r.widened
                else ""
            ),
            highlight=False,
            soft_wrap=True,
        )
    return 0


def _check_report_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, a report that cannot be written or drawn."""
    for flag, path in (("--report", args.report), ("--json-file", args.json_file)):
        why = None if path is None else unwritable(Path(path))
        if why is not None:
            raise QuantizationError(f"{flag} {path} {why}")
    path = args.report
    if path is not None and path.lower().endswith((".html", ".htm")) and importlib.util.find_spec("plotly") is None:
        raise QuantizationError(
            f"--report {path}: the HTML report draws its charts with plotly, which is not installed: "
            "pip install 'qlinear[report]', or write the report as JSON (--report REPORT.json)"
        )


def _write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise QuantizationError(f"cannot write the report to {path}: {e.strerror}") from None
