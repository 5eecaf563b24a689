"""Float where the runtime is faster in float: the kinds of node whose integer kernels lose at the users' batch.

An integer kernel is not always the faster one. At a batch of one, ONNX
Runtime's float depthwise convolution (NCHWc, fused with its activation)
beats QLinearConv with its QuantizeLinear and DequantizeLinear; small
convolutions and thin Gemms lose the same way. Such a node quantized is
dominated: slower, and less accurate. So after the accuracy search, each
kind of quantized node (op, depthwise or grouped, kernel size) that takes
enough of a run to pay (its kernels' and Q/DQ's share, from the runtime's
own profile, less what its kernels take in the float model's profile: at
least the margin a trial must save) is timed
in float against the model as it stands, in alternating pairs with the
float model at each batch the users run, and kept float where the model
runs faster (the geometric mean of the batches' ratios: a share of time
saved at one batch counts as much as at another) by more than the
timing's noise and by a larger share than the file grows (its float
weights), confirmed by a second timing; a kind whose first look (a few pairs a
batch) is already slower than the model as it stands is timed no
further. The batches can disagree: ONNX
Runtime's int8 5x5 depthwise convolution is on par with its float one at
one sample and several times slower at 16. The kinds are few (a model's
hundreds of nodes are a handful of kinds), so this costs a few timings.

It trades size for speed: a node kept float keeps its float weights. So
it tries only the nodes quantized for speed, those with integer
activations; a weight-only node is quantized for its size. Off
(``float_where_faster=False``), every node the types allow stays quantized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qlinear.dtypes import element_type
from qlinear.quantize._latency import Latency, mean_ratio
from qlinear.quantize._model import FloatModel
from qlinear.quantize._node_cost import ADDED
from qlinear.quantize._precision import NodePrecision

__all__ = ["FASTER_IN_FLOAT", "FloatShares", "Floated", "Shares", "float_where_faster", "node_kind"]

FASTER_IN_FLOAT = NodePrecision(None, None, quantized=False, why="faster in float on the runtime at the users' batch (timed)")
# A precision assignment's nodes' shares of a run at each batch the users run, their Q/DQ's included, and the kernels
# the runtime added under ADDED (the runtime's profile); None where the runtime gives none.
Shares = Callable[[dict[str, NodePrecision]], list[dict[str, float]] | None]
# The float model's nodes' shares of its run at each batch the users run (the runtime's profile, read once).
FloatShares = Callable[[], list[dict[str, float]] | None]
# A precision assignment's latency at each batch the users run (None: the runtime cannot load it) and its size in bytes;
# its second argument true: timed anew, not an earlier timing of the same model given back; its third: a ratio past
# which a first look of a few pairs is the answer (the UserBatchTimer's give_up_above).
Timed = Callable[[dict[str, NodePrecision], bool, float | None], tuple[Sequence[Latency] | None, int]]
# The least latency a kind must save, as a share of the model's, twice in a row, to be kept float: the pairs' noise.
MARGIN = 0.03
# A trial whose first look (a few pairs a batch) runs this much slower than the model as it stands is timed no
# further: it would have to come out MARGIN faster. Most kinds are not faster in float, so most trials end there.
GIVE_UP = 0.05


@dataclass(frozen=True)
class Floated:
    """One kind of node tried in float: its nodes, the model's latency ratio before and with them float, and whether kept.

    The ratios are the geometric means over the batches the users run.
    ``after`` is NaN where the kind was not timed: the runtime could not
    load the model, or the kind's share of a run was under the least a
    trial must save.
    """

    kind: str
    nodes: tuple[str, ...]
    before: float
    after: float
    kept: bool
    # The most floating it could save of a run at a batch: its nodes' and their Q/DQ's share, less their float kernels'
    # (both profiled); None: not read.
    share: float | None = None


def node_kind(fm: FloatModel, name: str) -> str:
    """A node's kind as its kernels see it: op, grouping and kernel size (``Conv depthwise 3x3``)."""
    node = fm.node(name)
    if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
        return node.op_type
    shape = fm.shapes.get(node.input[1]) or ()
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    grouping = "" if group == 1 else " depthwise" if shape and shape[1] == 1 else " grouped"
    kernel = "x".join(str(d) for d in shape[2:]) if len(shape) > 2 else "?"
    return f"{node.op_type}{grouping} {kernel}"


def float_where_faster(
    fm: FloatModel,
    quantized: dict[str, NodePrecision],
    precision: dict[str, NodePrecision],
    timed: Timed,
    shares: Shares | None = None,
    float_shares: FloatShares | None = None,
) -> tuple[dict[str, NodePrecision], list[Floated]]:
    """``precision`` with every kind of node in ``quantized`` that runs faster in float set float, and each kind's trial.

    ``quantized``: the nodes at the types asked for; only those with integer
    activations are tried, the ones quantized for speed (a weight-only
    node is quantized for its size, which float would give back).
    ``timed``: a precision assignment's latency as the runtime runs it,
    beside the float model's at each batch the users run, and its size
    in bytes; given ``again`` true, timed anew (a decision's confirmation),
    else possibly an earlier timing of the same model; given a ratio, the
    timing may stop at a first look past it.
    ``shares``: the nodes' shares of a run as the model stands (the
    runtime's profile); a kind whose nodes take less than :data:`MARGIN`
    of a run at every batch cannot save that much, and is not timed.
    ``float_shares``: the float model's (read where a kind passes that
    bound): a kind's float kernels take their time in the trial too, so
    the bound is its share less theirs (YOLOv8n's 3x3 Convs take 21% of
    its quantized run at one sample and 60% of its float run).
    """
    kinds: dict[str, list[str]] = {}
    for name, asked in quantized.items():
        p = precision.get(name, asked)
        if p.quantized and p.activations is not None and element_type(p.activations).is_integer:
            kinds.setdefault(node_kind(fm, name), []).append(name)
    current = dict(precision)
    start, size = timed(current, False, None)
    if start is None:  # the runtime cannot load the model: nothing to time
        return current, []
    ratio, trials = mean_ratio(start), []
    profiled = None if shares is None or not kinds else shares(current)
    profiled_ratio, in_float = ratio, None
    for kind, names in sorted(kinds.items(), key=lambda item: -len(item[1])):
        share = None
        if profiled is not None:
            bounds = [sum(batch.get(n, 0.0) for n in names) + batch.get(ADDED, 0.0) for batch in profiled]
            if float_shares is not None and max(bounds) * profiled_ratio / ratio >= MARGIN:
                if in_float is None:
                    in_float = float_shares() or []
                bounds = _less_float_kernels(bounds, names, in_float, start)
            # Of the model as it stands now: the same seconds, of a run that floating faster kinds has shortened.
            share = max(bounds) * profiled_ratio / ratio
            if share < MARGIN:
                trials.append(Floated(kind, tuple(names), ratio, float("nan"), False, share))
                continue
        trial = {**current, **dict.fromkeys(names, FASTER_IN_FLOAT)}
        first, trial_size = _mean_timed(timed, trial, give_up_above=ratio * (1 + GIVE_UP))
        # The share of latency saved must pass the noise, and the share of size given back.
        needed = max(MARGIN, (trial_size - size) / size)
        faster = first is not None and first < ratio * (1 - needed)
        if faster:  # confirmed by a second timing, and the current model timed again beside it
            again, now = _mean_timed(timed, trial, again=True)[0], _mean_timed(timed, current, again=True)[0]
            faster = again is not None and now is not None and again < now * (1 - needed)
            ratio = now if now is not None else ratio
        trials.append(Floated(kind, tuple(names), ratio, float("nan") if first is None else first, faster, share))
        if faster:
            current, ratio, size = trial, again, trial_size
    return current, trials


def _less_float_kernels(
    bounds: list[float], names: list[str], in_float: list[dict[str, float]], start: Sequence[Latency]
) -> list[float]:
    """Each batch's bound less the kind's float kernels' seconds, as a share of the quantized run profiled.

    That is the float run's share over the quantized model's latency ratio
    at the batch; the bounds as they were where the float profile does not
    cover every batch.
    """
    if not (len(in_float) == len(bounds) == len(start)):
        return bounds
    return [b - sum(f.get(n, 0.0) for n in names) / t.ratio for b, f, t in zip(bounds, in_float, start, strict=True)]


def _mean_timed(timed: Timed, precision: dict[str, NodePrecision], *, again: bool = False,
                give_up_above: float | None = None) -> tuple[float | None, int]:  # fmt: skip
    """A precision assignment's latency ratio (the geometric mean over the batches timed) and its size in bytes.

    ``again``: timed anew, not read from an earlier timing of the same model;
    ``give_up_above``: a first look's ratio past which the timing stops there.
    """
    latencies, size = timed(precision, again, give_up_above)
    return (None if latencies is None else mean_ratio(latencies)), size
