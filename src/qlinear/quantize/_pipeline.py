"""``quantize_model``: the passes in order, from a float model to a saved QDQ model and its report.

load -> prepare -> plan -> calibrate (or saved statistics) -> choose ->
convert -> analyse each node -> promote to the target -> check fusion ->
evaluate -> report -> save. Each pass is a module of this package with its
own tests; this one only wires them.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import save
from qlinear.quantize._awq import scale_for_weights
from qlinear.quantize._bias_correction import input_channel_axes
from qlinear.quantize._build import ModelBuilder
from qlinear.quantize._calibrate import CalibrationRun, CalibrationState, Observed, calibrate
from qlinear.quantize._checked import check_quantized
from qlinear.quantize._data import Dataset, input_specs, load_dataset, random_dataset, samples_in
from qlinear.quantize._equalize import equalize
from qlinear.quantize._evaluate import Reference, evaluate, latency_ms, output_figures
from qlinear.quantize._finetune import finetune
from qlinear.quantize._fusion import check_fusion
from qlinear.quantize._gathered_table import gather_tables
from qlinear.quantize._gptq import gram_inputs
from qlinear.quantize._mixed import Target, promotion_steps
from qlinear.quantize._mixed import search as meet_target
from qlinear.quantize._model import load_float_model
from qlinear.quantize._options import DEFAULT_AGREEMENT, DEFAULT_SQNR_DB, QuantizeOptions
from qlinear.quantize._plan import left_float_text, plan
from qlinear.quantize._prepare import prepare
from qlinear.quantize._report import PassResults, build_report
from qlinear.quantize._sensitivity import analyze, most_sensitive_first
from qlinear.quantize._signed_layout import lay_out_signed
from qlinear.quantize._smoothquant import smooth
from qlinear.quantize._stats import load_calibration, save_stats

__all__ = ["HELD_OUT", "QuantizeResult", "quantize_model"]

HELD_OUT = 0.2  # share of the calibration data held out for evaluation when no eval data is given
ANALYSIS_SAMPLES = 64  # eval samples the per-node analysis runs on (each node's model runs on them once)


@dataclass
class QuantizeResult:
    """The quantized model, where it was written, the report (a JSON-able dict), and whether the target held."""

    model: onnx.ModelProto
    path: Path | None
    report: dict[str, Any]
    target_met: bool = True  # False: no promotion reached the accuracy target (the best model found is returned)
    # A model of 2 GB or more keeps its big weights beside the graph (qlinear.onnx.save writes them): their holder.
    weights: Any = None


def quantize_model(
    model: onnx.ModelProto | str | PathLike[str],
    output: str | PathLike[str] | None,
    calibration: Any = None,
    *,
    eval: Any = None,
    labels: str | None = None,
    calibrate_random: int | None = None,
    stats: str | PathLike[str] | None = None,
    save_stats_to: str | PathLike[str] | None = None,
    resume: str | PathLike[str] | None = None,
    workers: int = 1,
    ray: str | None = None,
    options: QuantizeOptions | None = None,
    console: Console | None = None,
    progress: bool = False,
    **option_values: Any,
) -> QuantizeResult:
    """Quantize a float ONNX model into a standard QDQ model, calibrated on ``calibration``.

    Args:
        model: the float model (a path or a ModelProto; never modified).
        output: where to write the quantized model (None: not written).
            Written to a temporary file beside it first, then renamed, so a
            failed run leaves nothing behind.
        calibration: an ``.npz`` path, a dict of arrays (one per input,
            samples along axis 0) or an iterable of ``{input: array}`` batches.
        eval: held-out data in the same forms (with labels if ``labels``
            names an array in it); default: the last 20% of ``calibration``.
        labels: the name of the label array in ``eval``.
        calibrate_random: calibrate on this many uniform random samples
            instead (a smoke test; the report says so).
        stats: calibrate from statistics saved by an earlier run.
        save_stats_to: write the calibration statistics here, as batches
            complete (a stopped run can be continued from the file).
        resume: continue the calibration saved in this file: its batches
            are skipped (the data must come in the same order), and the
            model is the one an uninterrupted run gives.
        workers: processes that run the calibration batches (the same
            statistics, bit for bit, as one process).
        ray: run the calibration batches as tasks on a Ray cluster:
            ``"auto"``, ``"local"`` or an address (``pip install
            'qlinear[ray]'``); the same statistics as one process.
        options: a :class:`QuantizeOptions`, or its fields as keywords.
        console: where progress bars go (nothing is printed without one).
        progress: show progress bars on ``console`` (only if it is a terminal).

    Returns:
        A :class:`QuantizeResult`.

    Raises:
        QuantizationError: an unreadable or invalid model, data that does
            not fit its inputs, unknown options, an output path that cannot
            be written or that names the input.
    """
    options = options or QuantizeOptions(**option_values)
    if not (isinstance(workers, int) and workers >= 1):
        raise QuantizationError(f"quantize: workers must be an int >= 1, got {workers!r}")
    if resume is not None and stats is not None:
        raise QuantizationError("quantize: give stats (finished statistics) or resume (a calibration to continue), not both")
    out_path = _check_output(model, output)
    fm = load_float_model(model)
    size_before = fm.size_bytes()  # the model as given: the prepare pass rewrites some weights
    weight_only = options.activations is None
    prepare(fm, weight_only=weight_only)
    planned = plan(fm, options)
    if not planned.nodes:
        if not planned.left_float:
            raise QuantizationError(
                "quantize: the model has nothing to quantize: no Conv, ConvTranspose, Gemm, MatMul or Gather on constant weights"
            )
        reasons = left_float_text(planned.left_float, 5)
        raise QuantizationError(f"quantize: the model has nothing to quantize: every node stays float: {reasons}")
    fixed = _fixed_batch(fm)
    if fixed is not None and fixed != options.batch_size:
        options = replace(options, batch_size=fixed)  # ONNX Runtime runs the model at no other batch size
    cal_data, eval_data = _datasets(fm, calibration, eval, labels, calibrate_random, stats, weight_only, fixed or 1)
    if fixed is not None and fixed > 1:
        for what, ds in (("calibration", cal_data), ("eval", eval_data)):
            if ds.samples is not None and ds.samples % fixed:
                raise QuantizationError(
                    f"quantize: the model's inputs have a fixed batch of {fixed}, and the {what} data holds {ds.samples} "
                    f"samples, not a multiple of it"
                )
    bars = _Bars(console if progress else None)
    # Bias correction and GPTQ read the calibration inputs themselves (means, Gram matrices): on where there are some.
    has_inputs = calibration is not None or calibrate_random is not None
    if options.bias_correction is None:
        options = replace(options, bias_correction=has_inputs)
    low_bits = options.weight_type.is_integer and options.weight_type.bits <= 4
    if options.gptq is None:
        options = replace(options, gptq=has_inputs and low_bits and options.granularity != "per-tensor")
    if options.smoothquant is None:
        eight_bit = options.activations in ("uint8", "int8")
        options = replace(options, smoothquant=has_inputs and eight_bit and cal_data.arrays is not None)
    if options.awq is None:
        options = replace(options, awq=has_inputs and low_bits and weight_only and cal_data.arrays is not None)
    equalized = equalize(fm, set(options.exclude)) if options.equalize else []
    smoothed, awq = [], []
    if options.awq:
        if not weight_only:
            raise QuantizationError("quantize: awq scales weight-only layers; with quantized activations use smoothquant")
        if cal_data.arrays is None or not has_inputs:
            raise QuantizationError(
                "quantize: awq reads the calibration data twice; give arrays or an .npz (not a stream or stats)"
            )
        with bars.task("scaling weights (AWQ)", 1) as step:
            awq = scale_for_weights(
                fm, cal_data, batch_size=options.batch_size, excluded=set(options.exclude), weights=options.weights,
                block_size=options.block_size, weights_per_tensor=options.granularity == "per-tensor",
            )  # fmt: skip
            step(1)
    if options.smoothquant:
        if options.activations is None:
            raise QuantizationError(
                "quantize: smoothquant moves activation outliers into weights; it needs quantized activations"
            )
        if not has_inputs:
            raise QuantizationError("quantize: smoothquant needs calibration data (not saved statistics)")
        if cal_data.arrays is None and calibration is not None:
            raise QuantizationError(
                "quantize: smoothquant reads the calibration data twice; give arrays or an .npz, not a stream"
            )
        with bars.task("smoothing", cal_data.batch_count(options.batch_size)) as step:
            smoothed = smooth(
                fm, cal_data, batch_size=options.batch_size, excluded=set(options.exclude),
                weights=options.weights, activations=options.activations, symmetric=options.symmetric,
                weights_per_tensor=options.granularity == "per-tensor",
            )  # fmt: skip
            step(cal_data.batch_count(options.batch_size) or 1)
    # The analysis and the search walk the eval data several times.
    eval_data = eval_data.replayable(options.batch_size)
    run = _calibration(fm, options, cal_data, stats, save_stats_to, bars, workers=workers, ray=ray, resume=resume)
    if run is not None and 0 < run.batch_size < options.batch_size:
        # The analysis and the evaluation hold as many tensors a batch as the calibration: the same cut.
        options = replace(options, batch_size=run.batch_size)
    builder = ModelBuilder(fm, options, run)
    with bars.task("converting weights", 1) as step:
        requested = builder.build()
        step(1)
    check_quantized(requested.model)
    reference = Reference(fm.model, eval_data, batch_size=options.batch_size)
    analysis_ref = reference.head(ANALYSIS_SAMPLES)  # the float model is not run twice on them
    with bars.task("analysing nodes", len(requested.plan.nodes)) as step:
        figures = analyze(builder, requested, analysis_ref, progress=step)
    start_sqnr, start_agreement = output_figures(requested.model, reference)
    target = _target(options, reference)
    built, search = requested, None
    if target is not None:
        # A node widens only the sides it quantizes: an embedding its table, an activation x activation MatMul its inputs.
        start = {p.name: p.precision for p in requested.plan.nodes}
        steps = promotion_steps(
            most_sensitive_first(figures),
            start,
            figures,
            max_float=math.ceil(options.max_float * len(start)),
            allows=builder.allows,
        )
        pick = 0 if target.metric == "sqnr" else 1
        with bars.task("promoting to the target", None) as step:

            def measure(precision):
                step(1)
                return output_figures(builder.build(precision).model, reference)[pick]

            search = meet_target(steps, (start_sqnr, start_agreement)[pick], target, measure)
        if search.promotions:
            built = builder.build(search.precision)
            check_quantized(built.model)
    qmodel, planned = built.model, built.plan
    tuned = None
    if options.finetune:
        if cal_data.arrays is None and calibration is None:
            raise QuantizationError("quantize: finetune trains on the calibration data; give calibration data, not stats alone")
        with bars.task("fine-tuning", options.finetune) as step:
            qmodel, tuned = finetune(
                fm, qmodel, cal_data, reference, steps=options.finetune, batch_size=options.batch_size,
                train_weights=options.finetune_weights, progress=step,
            )  # fmt: skip
        if tuned.kept:
            check_quantized(qmodel)
    gather_tables(qmodel)  # the same values, without dequantizing whole tables every run
    lay_out_signed(qmodel)  # the same values, int8 activations where ONNX Runtime's x86 kernels take them
    fusion = check_fusion(qmodel, [p.name for p in planned.nodes])
    node_outputs = {p.name: fm.producer_output(p.name) for p in planned.nodes}
    with bars.task("evaluating", eval_data.batch_count(options.batch_size)) as step:
        evaluation = evaluate(
            fm.model, qmodel, node_outputs, eval_data, batch_size=options.batch_size, progress=step, known=reference
        )
    first_batch = evaluation.first_batch
    latency = latency_ms(fm.model, qmodel, first_batch)
    report = build_report(
        PassResults(
            model_name=str(model) if isinstance(model, (str, PathLike)) else "<ModelProto>",
            output=out_path,
            options=options,
            opset=built.opset,
            size_before=size_before,
            size_after=large.byte_size(qmodel),
            plan=planned,
            converted=built.converted,
            calibration=run,
            calibration_data=cal_data,
            stats_path=str(stats) if stats is not None else None,
            eval_data=eval_data,
            evaluation=evaluation,
            fusion=fusion,
            latency=latency,
            latency_batch=samples_in(first_batch),
            sensitivity=figures,
            requested_figures=(start_sqnr, start_agreement),
            search=search,
            smoothed=smoothed,
            awq=awq,
            equalized=equalized,
            finetuned=tuned,
            gates=built.gates,
        )
    )
    if out_path is not None:
        _write(qmodel, out_path)
    if not large.is_large(qmodel):
        qmodel = large.inline(qmodel)
    return QuantizeResult(qmodel, out_path, report, target_met=search is None or search.met, weights=fm.store)


def _calibration(fm, options, cal_data, stats, save_stats_to, bars, *, workers=1, ray=None, resume=None) -> CalibrationRun | None:
    """Statistics of every tensor any precision of any node may quantize, and the input means and Gram matrices.

    None: nothing to calibrate (weight-only without bias correction or GPTQ).
    """
    # With 8-bit integer weights every node pairs with integer activations: the widest set of tensors.
    widest = plan(fm, replace(options, weights="int8", activations=options.activations or "uint8"))
    tensors = widest.activations if options.activations is not None else []
    nodes = [fm.node(p.name) for p in widest.nodes]
    axes = input_channel_axes(fm, nodes) if options.bias_correction else {}
    grams = gram_inputs(fm, nodes) if options.gptq else []
    if not tensors and not axes and not grams:
        return None
    observed = Observed(tuple(tensors), axes, tuple(grams))
    if stats is not None:
        saved, extras, _ = load_calibration(str(stats), model_digest=fm.digest)
        missing = [t for t in tensors if t not in saved]
        if missing:
            raise QuantizationError(f"quantize: stats {stats} hold no statistics for {missing[:3]}; calibrate again")
        state = CalibrationState.resumed(observed, saved, extras, 0)
        if any(t not in state.sums for t in axes):
            raise QuantizationError(
                "quantize: bias correction needs the calibration data's input means, which these stats do not hold; "
                "give calibration data, or stats saved with bias correction on"
            )
        if any(t not in state.grams for t in grams):
            raise QuantizationError(
                "quantize: GPTQ needs the Gram matrices of the calibration inputs, which these stats do not hold; "
                "give calibration data, or stats saved with GPTQ on"
            )
        means = {t: state.sums[t] / state.counts[t] for t in axes}
        run = CalibrationRun(state.stats, 0, 0, 0.0, 0, means, {t: state.grams[t] for t in grams})
        if save_stats_to is not None:
            save_stats(run.stats, str(save_stats_to), model_digest=fm.digest, extras=state.extras())
        return run
    with bars.task("calibrating (samples)", cal_data.samples) as step:  # batches may be cut (HELD_BYTES)
        return calibrate(
            fm, tensors, cal_data, batch_size=options.batch_size, progress=step, channel_axes=axes, gram_tensors=grams,
            workers=workers, ray_address=ray, state_path=str(save_stats_to) if save_stats_to is not None else None,
            resume=str(resume) if resume is not None else None, fixed_batch=_fixed_batch(fm) is not None,
        )  # fmt: skip


def _target(options: QuantizeOptions, reference: Reference) -> Target | None:
    """The target the search reaches, or None (no search)."""
    if options.target_agreement is not None:
        if not reference.classifies:
            raise QuantizationError(
                f"quantize: target_agreement needs an output with classes along its last axis; "
                f"output {reference.output!r} has shape {reference.batches[0][1][reference.output].shape} a batch: give target_sqnr_db"
            )
        return Target("agreement", float(options.target_agreement))
    if options.target_sqnr_db is not None:
        return Target("sqnr", float(options.target_sqnr_db))
    if not options.promote:
        return None
    return Target("agreement", DEFAULT_AGREEMENT) if reference.classifies else Target("sqnr", DEFAULT_SQNR_DB)


def _check_output(model: Any, output: Any) -> Path | None:
    if output is None:
        return None
    out = Path(output)
    if isinstance(model, (str, PathLike)) and Path(model).resolve() == out.resolve():
        raise QuantizationError(f"quantize: output {out} is the input model; choose another path (the input is never modified)")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise QuantizationError(f"quantize: output {out} cannot be written: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise QuantizationError(f"quantize: output {out} cannot be written: permission denied")
    if out.is_dir():
        raise QuantizationError(f"quantize: output {out} is a directory, expected a file path")
    return out


def _fixed_batch(fm) -> int | None:
    """The batch size the model's inputs fix (the batch axis of each, a number), or None where one is symbolic."""
    firsts = {s.shape[s.batch_axis] if s.shape else None for s in input_specs(fm) if s.batch_axis is not None}
    if len(firsts) != 1:
        return None
    (first,) = firsts
    return first if isinstance(first, int) and first > 0 else None


def _datasets(fm, calibration, eval_data, labels, calibrate_random, stats, weight_only, batch: int) -> tuple[Dataset, Dataset]:
    if calibrate_random is not None and calibration is not None:
        raise QuantizationError("quantize: give calibration data or calibrate_random, not both")
    if calibrate_random is not None:
        if not (isinstance(calibrate_random, int) and calibrate_random >= 2):
            raise QuantizationError(f"quantize: calibrate_random must be an int >= 2, got {calibrate_random!r}")
        cal = random_dataset(fm, calibrate_random)
    elif calibration is not None:
        cal = load_dataset(calibration, fm, what="calibration")
    elif stats is not None and eval_data is not None:
        cal = None
    elif weight_only and eval_data is not None:
        cal = None
    else:
        raise QuantizationError(
            "quantize: calibration data is needed (an .npz with one array per model input), or calibrate_random for a smoke test"
        )
    if eval_data is not None:
        ev = load_dataset(eval_data, fm, what="eval data", labels=labels)
    else:
        if labels is not None:
            raise QuantizationError("quantize: labels name an array of the eval data; give eval data too")
        cal, ev = cal.split(HELD_OUT, batch)
    return cal if cal is not None else ev, ev


def _write(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` (and its external data file, if any) to a temporary folder beside ``path``, then move it in place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.resolve().parent))
    try:
        save(model, tmp / path.name)
        if large.is_large(model) or large.has_markers(model):  # the full check of the weights, by path
            check_quantized(tmp / path.name)
        for f in sorted(tmp.iterdir()):
            os.replace(f, path.resolve().parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Bars:
    """Progress bars on a console, or nothing."""

    def __init__(self, console: Console | None) -> None:
        # Bars only on a terminal: piped, they would leave blank lines behind.
        self.console = console if console is not None and console.is_terminal else None

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        if self.console is None:
            yield lambda n: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
