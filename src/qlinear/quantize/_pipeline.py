"""``quantize_model``: the quantizer's stages in order, from a float model to a saved QDQ model and its report.

Each stage is a typed function of :mod:`._stages` (or a pass the target
or an algorithm owns); this module only lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console

from qlinear.onnx import _large as large
from qlinear.quantize import _refusals as refusals
from qlinear.quantize import _stages as stage
from qlinear.quantize._data import Dataset
from qlinear.quantize._evaluate import Evaluation, Reference
from qlinear.quantize._execution import Bars, Execution, checked_output, write_atomically
from qlinear.quantize._latency import UserBatchTimer, user_batches
from qlinear.quantize._model import FloatModel, load_float_model
from qlinear.quantize._option_fields import data_words
from qlinear.quantize._options import QuantizeOptions, given, resolve
from qlinear.quantize._report import ReportInputs, build_report
from qlinear.quantize._report_schema import Report
from qlinear.quantize._session import load_error
from qlinear.quantize.algorithms import Facts
from qlinear.quantize.targets import ORT_CPU, Target, target

__all__ = ["HELD_OUT", "QuantizeResult", "quantize_model"]

HELD_OUT = stage.HELD_OUT


@dataclass
class QuantizeResult:
    """The quantized model, where it was written, the report (a :class:`Report`), and whether the target held."""

    model: onnx.ModelProto
    path: Path | None
    report: Report
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
        options: a :class:`QuantizeOptions`; its fields given as keywords
            are set over it (or make one alone).
        console: where progress bars go (nothing is printed without one).
        progress: show progress bars on ``console`` (only if it is a terminal).

    Returns:
        A :class:`QuantizeResult`.

    Raises:
        QuantizationError: an unreadable or invalid model, data that does
            not fit its inputs, unknown options, an output path that cannot
            be written or that names the input.
    """
    options, execution = given(options, option_values), Execution(workers, ray, stats, save_stats_to, resume)
    out_path = checked_output(model, output)
    bars = Bars(console if progress else None)  # and each stage's time and peak memory, for the report's profile
    with bars.stage("load"):  # the model and the data, and the configuration resolved from them
        fm = load_float_model(model)
        size_before = fm.size_bytes()  # the model as given: the target's rewrites change some weights
        runtime = target(options.target)
        runtime.prepare(options.activations is None)(fm)
        refusals.check_plannable(fm, options)
        data = stage.datasets(fm, options, calibration, eval, labels, calibrate_random, stats)
        if data is not None:
            options = resolve(options, data.facts, batch_size=data.fixed_batch)
            batches = user_batches(data.fixed_batch, options.batch_size)  # timed at the batch asked, not a memory cut
            eval_data = data.eval.replayable(options.batch_size)  # the analysis and the search walk it several times
            refusals.check_goal(fm, options, eval_data, runtime)
    if data is None:  # weight-only with no data at all
        return _without_data(model, fm, out_path, options, size_before, bars)
    with bars.stage("float rewrites"):
        rewritten = stage.float_rewrites(fm, options, data.calibration, bars)
    with bars.stage("calibrate"):
        run = stage.calibration(fm, options, data.calibration, execution, bars)
    if run is not None and 0 < run.batch_size < options.batch_size:
        # The analysis and the evaluation hold as many tensors a batch as the calibration: the same cut.
        options = replace(options, batch_size=run.batch_size)
    with bars.stage("build"):
        builder, requested = stage.build(fm, options, run, bars)
    with bars.stage("float reference"):  # the float model's outputs on the eval data, and its latency
        reference = Reference(fm.model, eval_data, batch_size=options.batch_size, runtime=runtime)
        timer = UserBatchTimer(fm.model, eval_data, batches, runtime)
    with bars.stage("meet the target"):
        met = stage.meet_target(builder, requested, reference, options, runtime, timer, bars)
    with bars.stage("refine"):
        qmodel, refined = stage.refine(fm, met.built.model, data.calibration, reference, options, bars)
    with bars.stage("finalize"):
        runtime.as_written(qmodel, options.format)
        fusion = runtime.check_fusion(qmodel, [p.name for p in met.built.plan.nodes])
        unloadable = _unloadable(qmodel, runtime, fusion is not None)
    with bars.stage("evaluate"):
        evaluation, latency, measures = stage.evaluation(fm, qmodel, met, reference, options, timer, bars)
    with bars.stage("report"):
        report = build_report(
            ReportInputs.of(
                model, out_path, options, met, fm_size=size_before, qmodel=qmodel, run=run, data=data, eval_data=eval_data,
                stats=stats, evaluation=evaluation, fusion=fusion, latency=latency, algorithms={**rewritten, **refined},
                onnxruntime_error=unloadable, measures=measures,
                data_flags=data_words(calibration, eval, labels, calibrate_random, stats), untimed=timer.untimed,
            )
        )  # fmt: skip
    qmodel, report = _written(qmodel, out_path, report, bars)
    return QuantizeResult(qmodel, out_path, report, target_met=met.search is None or met.search.met, weights=fm.store)


def _without_data(model: Any, fm: FloatModel, out_path: Path | None, options: QuantizeOptions, size_before: int,
                  bars: Bars) -> QuantizeResult:  # fmt: skip
    """A weight-only run given no data: the weights rounded and laid out for the target; nothing calibrated, judged or timed."""
    facts = Facts(calibration_given=False, has_inputs=False, arrays=False)
    options = resolve(options, facts)
    runtime, none = target(options.target), Dataset({}, None, "no data given")
    with bars.stage("float rewrites"):
        rewritten = stage.float_rewrites(fm, options, none, bars)
    with bars.stage("build"):
        _, built = stage.build(fm, options, None, bars)
    qmodel = built.model
    with bars.stage("finalize"):
        runtime.as_written(qmodel, options.format)
        fusion = runtime.check_fusion(qmodel, [p.name for p in built.plan.nodes])
        unloadable = _unloadable(qmodel, runtime, fusion is not None)
    with bars.stage("report"):
        met = stage.TargetResult(built, (None, None), {}, None)
        report = build_report(
            ReportInputs.of(
                model, out_path, options, met, fm_size=size_before, qmodel=qmodel, run=None, data=stage.RunData(
                none, none, None, facts), eval_data=none, stats=None, evaluation=Evaluation(),
                fusion=fusion, latency=[], algorithms=rewritten, onnxruntime_error=unloadable, judged=False,
            )
        )  # fmt: skip
    qmodel, report = _written(qmodel, out_path, report, bars)
    return QuantizeResult(qmodel, out_path, report, weights=fm.store)


def _written(qmodel: onnx.ModelProto, out_path: Path | None, report: Report, bars: Bars) -> tuple[onnx.ModelProto, Report]:
    """The model written (where asked) and held in memory as it is returned; the report with the run's profile."""
    with bars.stage("write"):
        if out_path is not None:
            write_atomically(qmodel, out_path)
        if not large.is_large(qmodel):
            qmodel = large.inline(qmodel)
    return qmodel, replace(report, profile=list(bars.stages))


def _unloadable(qmodel: onnx.ModelProto, runtime: Target, fusion_checked: bool) -> str | None:
    """Why ONNX Runtime cannot load the model as written, or None.

    Whatever the target: the model is standard ONNX, which a user may check
    anywhere, and what ONNX Runtime cannot load is said, not written
    silently. Placed for ONNX Runtime, its fusion check has loaded it as
    written already where it gave one.
    """
    if runtime.backend == ORT_CPU.backend and fusion_checked:
        return None
    return load_error(qmodel, ORT_CPU)
