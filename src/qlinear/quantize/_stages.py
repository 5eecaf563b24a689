"""The quantizer's stages, each a typed function that :func:`~qlinear.quantize.quantize_model` calls in order.

load and resolve the configuration -> prepare (the target's rewrites) ->
float rewrites (algorithms) -> calibrate -> build -> meet the accuracy
target -> refine (algorithms) -> finalize for the target -> evaluate ->
report -> write. Graph rewrites are passes (:mod:`qlinear.onnx._passes`)
that the target and the algorithms own; the stages here produce data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.quantize._build import Built, ModelBuilder
from qlinear.quantize._calibrate import CalibrationRun, calibrate
from qlinear.quantize._cheaper_search import FAST_ENOUGH, cheapest_first, search_cheaper
from qlinear.quantize._checked import check_quantized
from qlinear.quantize._data import Dataset, input_specs, load_dataset, random_dataset
from qlinear.quantize._evaluate import Evaluation, Reference, evaluate, evaluation_batches, output_figures
from qlinear.quantize._execution import Bars, Execution
from qlinear.quantize._latency import Latency, UserBatchTimer, worst_ratio
from qlinear.quantize._measures import default_target, judge, measures
from qlinear.quantize._metric import metric_name
from qlinear.quantize._model import FloatModel
from qlinear.quantize._node_cost import alternate, float_costs, node_seconds, node_shares
from qlinear.quantize._observed import CalibrationState, Observed
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._placement import plan
from qlinear.quantize._precision import FLOAT, NodePrecision, reachable
from qlinear.quantize._promotion import AccuracyTarget, Promotion, Search, promotion_steps, search, search_within
from qlinear.quantize._refusals import check_without_data, no_classes
from qlinear.quantize._run_settings import RunSetting, settings_where_faster
from qlinear.quantize._sensitivity import SCREEN_SAMPLES, NodeSensitivity, analysis_runs, analyze, most_sensitive_first
from qlinear.quantize._speed import Floated, float_where_faster
from qlinear.quantize._stats import load_calibration, save_stats
from qlinear.quantize._tradeoff import Candidate, tradeoff
from qlinear.quantize.algorithms import Facts, at_stage
from qlinear.quantize.targets import target
from qlinear.quantize.targets._target import Target as Runtime

__all__ = [
    "ANALYSIS_SAMPLES", "HELD_OUT", "NODE_SAMPLES", "RunData", "TargetResult", "build", "calibration", "datasets", "evaluation",
    "float_rewrites", "meet_target", "refine",
]  # fmt: skip

HELD_OUT = 0.2  # share of the calibration data held out for evaluation when no eval data is given
ANALYSIS_SAMPLES = 64  # eval samples the per-node analysis runs on at most
# Eval samples the evaluation's nodes' own SQNRs run on at most: a figure to read, not to decide by, from two runs with
# every node's output watched (no fusion across them), the analysis' screening count.
NODE_SAMPLES = SCREEN_SAMPLES


@dataclass
class RunData:
    """The data of a run: calibration and eval datasets, the batch the model fixes, and the facts algorithms read."""

    calibration: Dataset
    eval: Dataset
    fixed_batch: int | None
    facts: Facts
    fixed_by: str | None = None  # the input whose fixed batch dimension sets the batch


@dataclass
class TargetResult:
    """What meeting the accuracy target gave: the model chosen, and what the analysis and the search found."""

    built: Built
    requested_figures: tuple[float | None, float | None]  # output SQNR, agreement at the requested types
    sensitivity: dict[str, NodeSensitivity]
    search: Search | None  # None: no target
    tradeoff: list[Candidate] = field(default_factory=list)  # the models the search built, timed
    floated: list[Floated] = field(default_factory=list)  # the kinds of node tried in float for speed
    settings: list[RunSetting] = field(default_factory=list)  # the runtime's settings tried for speed


def datasets(fm: FloatModel, options: QuantizeOptions, calibration: Any, eval_data: Any, labels: str | None,
             calibrate_random: int | None, stats: Any) -> RunData | None:  # fmt: skip
    """The calibration and eval datasets (the eval data defaults to the calibration data's last fifth).

    None: a weight-only run given no data at all, which rounds the weights
    and judges nothing (:func:`check_without_data` says what it refuses).
    """
    fixed, fixed_by = _fixed_batch(fm)
    weight_only = options.activations is None
    if weight_only and calibration is None and eval_data is None and stats is None and calibrate_random is None:
        if labels is not None:
            raise QuantizationError("quantize: labels name an array of the eval data; give eval data too")
        check_without_data(options)
        return None
    if calibrate_random is not None and calibration is not None:
        raise QuantizationError("quantize: give calibration data or calibrate_random, not both")
    if calibrate_random is not None:
        if not (isinstance(calibrate_random, int) and calibrate_random >= 2):
            raise QuantizationError(f"quantize: calibrate_random must be an int >= 2, got {calibrate_random!r}")
        cal = random_dataset(fm, calibrate_random)
    elif calibration is not None:
        cal = load_dataset(calibration, fm, what="calibration")
    elif (stats is not None or weight_only) and eval_data is not None:
        cal = None
    else:
        raise QuantizationError(
            "quantize: calibration data is needed (an .npz with one array per model input), or calibrate_random for a "
            "smoke test; weight-only quantization (activations none) needs none"
        )
    if eval_data is not None:
        ev = load_dataset(eval_data, fm, what="eval data", labels=labels)
    else:
        if labels is not None:
            raise QuantizationError("quantize: labels name an array of the eval data; give eval data too")
        cal, ev = cal.split(HELD_OUT, fixed or 1)
    cal = cal if cal is not None else ev
    if fixed is not None and fixed > 1:
        for what, ds in (("calibration", cal), ("eval", ev)):
            if ds.samples is not None and ds.samples % fixed:
                raise QuantizationError(
                    f"quantize: the model's inputs have a fixed batch of {fixed}, and the {what} data holds {ds.samples} "
                    f"samples, not a multiple of it"
                )
    has_inputs = calibration is not None or calibrate_random is not None
    return RunData(cal, ev, fixed, Facts(calibration is not None, has_inputs, cal.arrays is not None), fixed_by)


# The options that judge the model on data: a run given none refuses them.
def float_rewrites(fm: FloatModel, options: QuantizeOptions, data: Dataset, bars: Bars) -> dict[str, Any]:
    """The float model rewritten by each algorithm of stage ``float`` that is on; what each did, by name."""
    return {a.name: a.apply(fm, options, data, bars) for a in at_stage("float", options)}


def calibration(
    fm: FloatModel, options: QuantizeOptions, data: Dataset, execution: Execution, bars: Bars
) -> CalibrationRun | None:
    """Statistics of every tensor any precision of any node may quantize, and what the algorithms need calibrated.

    None: nothing to calibrate (weight-only with no algorithm that reads the data).
    """
    # The search may move any node to any precision on the target's ladder, and each places its own tensors (blocked
    # 4-bit weights run beside float activations where 8-bit ones do not): the union over every one of them.
    asked = NodePrecision(options.weights, options.activations)
    plans = [plan(fm, replace(options, weights=p.weights, activations=p.activations))
             for p in reachable(asked, target(options.target).ladder)]  # fmt: skip
    tensors = list(dict.fromkeys(t for p in plans for t in p.activations))
    nodes = [fm.node(name) for name in dict.fromkeys(n.name for p in plans for n in p.nodes)]
    needs = [a.calibrates(fm, nodes, options) for a in at_stage("calibration", options) if a.calibrates is not None]
    axes = {t: axis for need in needs for t, axis in need.channel_axes.items()}
    grams = list(dict.fromkeys(t for need in needs for t in need.gram_tensors))
    patches = list(dict.fromkeys(p for need in needs for p in need.gram_patches))
    if not tensors and not axes and not grams and not patches:
        return None
    if execution.stats is not None:
        return _saved(fm, Observed(tuple(tensors), axes, tuple(grams), tuple(patches)), execution)
    with bars.task("calibrating (samples)", data.samples) as step:  # batches may be cut (HELD_BYTES)
        return calibrate(
            fm, tensors, data, batch_size=options.batch_size, progress=step, channel_axes=axes, gram_tensors=grams,
            gram_patches=patches, workers=execution.workers, ray_address=execution.ray, resume=_str(execution.resume),
            state_path=_str(execution.save_stats_to), fixed_batch=_fixed_batch(fm)[0] is not None,
            runtime=target(options.target),
        )  # fmt: skip


def build(fm: FloatModel, options: QuantizeOptions, run: CalibrationRun | None, bars: Bars) -> tuple[ModelBuilder, Built]:
    """The model builder and the model at the requested types."""
    builder = ModelBuilder(fm, options, run)
    with bars.task("converting weights", 1) as step:
        requested = builder.build()
        step(1)
    check_quantized(requested.model)
    return builder, requested


def meet_target(builder: ModelBuilder, requested: Built, reference: Reference, options: QuantizeOptions, runtime: Runtime,
                timer: UserBatchTimer, bars: Bars) -> TargetResult:  # fmt: skip
    """Where the target is missed at the types asked for, each node's sensitivity, then the most sensitive nodes promoted up the ``runtime``'s ladder until it holds.

    The sensitivity is measured only where the search takes a step, or
    where ``options.analyze`` asks for it (empty otherwise). With a latency budget, the most accurate model within it instead
    (``timer`` times each candidate against the float model at the batches
    the users run; the budget holds at each). The models built on the way are the trade-off the
    report shows.
    """
    goal = _goal(options, reference, builder.fm.model)  # a target the outputs cannot meet is refused before any work
    start = output_figures(requested.model, reference)

    def analysis() -> dict[str, NodeSensitivity]:
        analysed = reference.head(ANALYSIS_SAMPLES)
        with bars.task("analysing nodes", analysis_runs(len(requested.plan.nodes), analysed)) as step:
            return analyze(builder, requested, analysed, progress=step)

    if goal is None:
        return TargetResult(requested, start, analysis() if options.analyze else {}, None)
    figure_of = judge(goal, options, builder.fm.model, reference)
    # The start's SQNR and agreement are already measured (output_figures); any other figure is measured here.
    measured = {"sqnr": start[0], "agreement": start[1]}
    start_figure = measured[goal.metric] if goal.metric in measured else figure_of(requested.model)
    # The promotions' order is the analysis' (a part of the model run a node): measured only where the search takes
    # a step, a target missed at the types asked for or a latency budget to fill, or where the user asks for it.
    searched = options.promote and (options.latency_budget is not None or not goal.met(start_figure))
    figures = analysis() if searched or options.analyze else {}
    # A node widens only the sides it quantizes: an embedding its table, an activation x activation MatMul its inputs.
    precisions = {p.name: p.precision for p in requested.plan.nodes}

    def steps_in(ranking: list[str]) -> list[Promotion]:
        return promotion_steps(
            ranking, precisions, figures, max_float=math.ceil(options.max_float * len(precisions)),
            allows=builder.allows, ladder=runtime.ladder,
        )  # fmt: skip

    def written(built_model: onnx.ModelProto) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(built_model)
        runtime.as_written(model, options.format)  # timed as it will be written
        return model

    def as_written(precision: dict[str, NodePrecision]) -> onnx.ModelProto:
        return written(builder.build(precision).model)

    def timed(precision: dict[str, NodePrecision], again: bool = False, give_up_above: float | None = None,
              glance: bool = False) -> tuple[tuple[Latency, ...] | None, int]:  # fmt: skip
        model = as_written(precision)
        return timer.time(model, again=again, give_up_above=give_up_above, glance=glance), large.byte_size(model)

    def shares(precision: dict[str, NodePrecision]) -> list[dict[str, float]] | None:
        return node_shares(as_written(precision), timer.feeds, runtime)

    def float_shares() -> list[dict[str, float]] | None:
        return node_shares(builder.fm.model, timer.feeds, runtime)

    ranking = most_sensitive_first(figures) if searched else []
    steps = steps_in(ranking) if searched else []  # no promotion asked for: a target given is judged at the types asked

    def cheap_steps() -> tuple[list[Promotion], dict[str, float]]:
        """The steps cheapest for the noise they remove first, and each node's predicted cost in float (none: ``steps``)."""
        # The runtime's profiles of the model as asked and of two with every other node float, each node timed among
        # quantized neighbours (the Q/DQ a float node adds at its edges counted).
        in_graph = [p.name for p in requested.plan.nodes if p.name in figures]
        costs = float_costs(
            node_seconds(written(requested.model), timer.feeds, runtime),  # built already: not again
            [(node_seconds(as_written(dict.fromkeys(half, FLOAT)), timer.feeds, runtime), half) for half in alternate(in_graph)],
        )  # fmt: skip
        return (steps, {}) if costs is None else (steps_in(cheapest_first(ranking, figures, costs)), costs)

    with bars.task("promoting to the target", None) as step:

        def measure(precision):
            step(1)
            return figure_of(builder.build(precision).model)

        def ratio(precision):
            step(1)
            latency = timed(precision)[0]
            return None if latency is None else worst_ratio(latency)

        costs: dict[str, float] = {}
        if options.latency_budget is None:
            found = search(steps, start_figure, goal, measure)
            if steps and (not found.met or (found.promotions and _slower_than(FAST_ENOUGH, timed(found.precision)[0]))):
                cheap, costs = cheap_steps()  # where a cheaper set of promotions could matter to the users
                found, steps = search_cheaper(found, cheap, steps, goal, measure, costs)
        else:
            binding = any(v is not None for v in (options.target_agreement, options.target_sqnr_db, options.target_metric))
            cheap, costs = cheap_steps() if steps else (steps, {})  # a budget to fill: always (three profiles)
            order = "cost" if cheap != steps else "sensitivity"
            steps = cheap  # the most accuracy for the latency: the cheapest steps first
            found = search_within(steps, start_figure, goal, float(options.latency_budget), ratio, measure, binding=binding)
            found = replace(found, order=order)
        if costs:
            found = replace(found, costs={p.node: costs.get(p.node, 0.0) for p in found.promotions})
        precision, floated = found.precision, []
        if options.float_where_faster and options.promote:
            quantized = {p.name: p.precision for p in requested.plan.nodes}
            precision, floated = float_where_faster(builder.fm, quantized, precision, timed, shares, float_shares)
            if precision != found.precision and found.met and not goal.met(figure_of(builder.build(precision).model)):
                precision, floated = found.precision, [replace(f, kept=False) for f in floated]  # the target first
        candidates = tradeoff(found, steps, timed, precision, lambda p: timed(p, glance=True))
    built = requested
    if precision:
        built = builder.build(precision)
        check_quantized(built.model)
    settings: list[RunSetting] = []
    trials = runtime.setting_trials(built.model) if options.promote else []
    if trials:
        chosen = written(built.model)  # the chosen model as it will be written, from the build above
        with bars.task("trying the runtime's settings", None):
            # The target first; where it was not met, no setting may lower the figure the search reached.
            # The search's figure where the speed trials changed nothing: the same model, already judged.
            floor = None if found.met else found.figure if precision == found.precision else figure_of(chosen)

            def meets(model: onnx.ModelProto) -> bool:
                figure = figure_of(model)
                return goal.met(figure) if floor is None else figure is not None and figure >= floor

            writes, settings = settings_where_faster(chosen, trials, lambda m, again: timer.time(m, again=again), meets)
        if writes:
            model = onnx.ModelProto()
            model.CopyFrom(built.model)
            for write in writes:
                write(model)
            built = replace(built, model=model)
    return TargetResult(built, start, figures, found, candidates, floated, settings)


def _slower_than(ratio: float, latency: tuple[Latency, ...] | None) -> bool:
    """Whether ``latency`` passes ``ratio`` of the float model's at some batch (a model the runtime cannot load does)."""
    return latency is None or worst_ratio(latency) > ratio


def refine(fm: FloatModel, qmodel: onnx.ModelProto, data: Dataset, reference: Reference, options: QuantizeOptions,
           bars: Bars) -> tuple[onnx.ModelProto, dict[str, Any]]:  # fmt: skip
    """``qmodel`` improved by each algorithm of stage ``refine`` that is on; what each did, by name."""
    done = {}
    for algorithm in at_stage("refine", options):
        refined, done[algorithm.name] = algorithm.apply(fm, qmodel, data, reference, options, bars)
        if refined is not qmodel:
            check_quantized(refined)
            qmodel = refined
    return qmodel, done


def evaluation(fm: FloatModel, qmodel: onnx.ModelProto, met: TargetResult, reference: Reference, options: QuantizeOptions,
               timer: UserBatchTimer, bars: Bars) -> tuple[Evaluation, list[Latency], dict[str, Any]]:  # fmt: skip
    """The written model against the float one: its figures on the eval data (``reference``'s), its latency at each batch, its measures."""
    quantized = [p.name for p in met.built.plan.nodes]
    nodes = {name: fm.producer_output(name) for name in quantized}
    with bars.task("evaluating", evaluation_batches(reference, NODE_SAMPLES)) as step:
        # The nodes' own SQNRs on the first samples: each model run with every node's output as an output.
        found = evaluate(fm.model, qmodel, nodes, reference, node_samples=NODE_SAMPLES, progress=step)
    return found, list(timer.time(qmodel) or ()), measures(fm, qmodel, reference, options)


def _goal(options: QuantizeOptions, reference: Reference, float_model: onnx.ModelProto) -> AccuracyTarget | None:
    """The accuracy target the search reaches, or None (no search)."""
    if options.target_agreement is not None:
        if not reference.classifies:
            raise no_classes(reference.output, reference.batches[0][1][reference.output].shape)
        return AccuracyTarget("agreement", float(options.target_agreement))
    if options.target_sqnr_db is not None:
        return AccuracyTarget("sqnr", float(options.target_sqnr_db))
    if not options.promote:
        return None
    if options.metric is not None:  # with a latency budget and no value, the budget alone decides
        value = -math.inf if options.target_metric is None else float(options.target_metric)
        return AccuracyTarget("metric", value, metric_name(options.metric))
    return default_target(float_model, reference)


def _saved(fm: FloatModel, observed: Observed, execution: Execution) -> CalibrationRun:
    """The calibration read back from ``execution.stats`` (and written again to ``save_stats_to``)."""
    stats = execution.stats
    saved, extras, _ = load_calibration(str(stats), model_digest=fm.digest)
    missing = [t for t in observed.tensors if t not in saved]
    if missing:
        raise QuantizationError(f"quantize: stats {stats} hold no statistics for {missing[:3]}; calibrate again")
    state = CalibrationState.resumed(observed, saved, extras, 0)
    if any(t not in state.sums for t in observed.channel_axes):
        raise QuantizationError(
            "quantize: bias correction needs the calibration data's input means, which these stats do not hold; "
            "give calibration data, or stats saved with bias correction on"
        )
    if any(t not in state.grams for t in observed.gram_keys):
        raise QuantizationError(
            "quantize: GPTQ needs the Gram matrices of the calibration inputs, which these stats do not hold; "
            "give calibration data, or stats saved with GPTQ on"
        )
    means = {t: state.sums[t] / state.counts[t] for t in observed.channel_axes}
    grams = {t: state.grams[t] for t in observed.gram_keys}
    run = CalibrationRun(state.stats, 0, 0, 0.0, 0, means, grams, gram_rows=dict(state.gram_rows))
    if execution.save_stats_to is not None:
        save_stats(run.stats, str(execution.save_stats_to), model_digest=fm.digest, extras=state.extras())
    return run


def _fixed_batch(fm: FloatModel) -> tuple[int | None, str | None]:
    """The batch the model's inputs fix, and the input that fixes it; ``(None, None)`` where every batch axis is open.

    The smallest fixed batch axis wins: a stateful streaming model reads its audio at an open batch beside
    recurrent states fixed at 1, and ONNX Runtime runs it at a batch of 1 only.
    """
    fixed = [(s.shape[s.batch_axis], s.name) for s in input_specs(fm) if s.batch_axis is not None and s.shape]
    fixed = [(n, name) for n, name in fixed if isinstance(n, int) and n > 0]
    return min(fixed) if fixed else (None, None)


def _str(path: Any) -> str | None:
    return None if path is None else str(path)
