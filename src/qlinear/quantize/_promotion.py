"""Mixed precision to a target: promote the most sensitive nodes until the model's output is good enough.

The target is top-1 agreement with the float model on the eval data, or
the output's SQNR. The promotions form one ordered list: first one step for
every node, most sensitive first (:mod:`._sensitivity`), then a second step
for each, and so on; a node goes float only while fewer than
``max_float`` of the nodes have (so "quantized" keeps its meaning). The
search finds the shortest prefix of that list whose model meets the target:
it doubles the prefix until the target holds, then halves the gap, so a
model of N steps takes about 2 log2(N) evaluations, each on ONNX Runtime
from the saved statistics. Then it drops each promoted node's steps that
the target holds without (up to :data:`PRUNE_TRIALS` nodes, least sensitive
first): a round promotes every node once, not only the ones that matter. Where even the whole list misses the target,
the best model evaluated is kept and the caller says so.
A second order, by what each step costs, is :mod:`._cheaper_search`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from qlinear.dtypes import element_type
from qlinear.quantize._detections import RULE as DETECTIONS_RULE
from qlinear.quantize._precision import FLOAT, FULL_LADDER, Ladder, NodePrecision, candidate_steps
from qlinear.quantize._sensitivity import NodeSensitivity

__all__ = [
    "PRUNE_TRIALS",
    "as_number",
    "assignment_key",
    "TARGET_METRICS",
    "Promotion",
    "Search",
    "AccuracyTarget",
    "TargetMetric",
    "promotion_steps",
    "search",
    "search_within",
]

# Nodes the search tries to do without once the target holds (one evaluation each), least sensitive first.
PRUNE_TRIALS = 16
# SQNR gained by each bit a side widens by: 6.02 dB (20 log10 2), to guess which side of a promoted node to widen next.
_DB_PER_BIT = 6.02


@dataclass(frozen=True)
class TargetMetric:
    """How a target metric reads: its figure's name, its form ("share", "cosine", "db" or the user's "number"), its rule."""

    name: str
    form: str
    rule: str = ""  # what the figure is, where its name does not say it


# Every target metric (AccuracyTarget.metric), the one place the report, the warnings and the targets' texts read.
TARGET_METRICS = {
    "agreement": TargetMetric("top-1 agreement", "share"),
    "decisions": TargetMetric("decisions kept", "share", "F1 of the scores above 0.5"),
    "detections": TargetMetric("detections kept", "share", DETECTIONS_RULE),
    "cosine": TargetMetric("mean cosine similarity", "cosine", "an embedding: one centred vector a sample"),
    "sqnr": TargetMetric("output SQNR", "db"),
    "metric": TargetMetric("metric", "number"),  # the user's: its own name in a target's text
}


@dataclass(frozen=True)
class AccuracyTarget:
    """What the output must reach, at least ``value``.

    ``metric``: "agreement" (top-1 share), "decisions" (the F1 of the scores
    above 0.5, for probabilities), "detections" (the F1 of a detector's
    detections, boxes matched), "cosine" (the mean cosine similarity of
    an embedding's vectors), "sqnr" (dB) or "metric" (the user's, ``name``).
    """

    metric: str
    value: float
    name: str = ""

    def met(self, figure: float | None) -> bool:
        return as_number(figure, self.metric) >= self.value

    def describe(self) -> str:
        kind = TARGET_METRICS[self.metric]
        name = self.name if self.metric == "metric" else kind.name
        bound = {"share": f"{100 * self.value:.2f}%", "db": f"{self.value:g} dB"}.get(kind.form, f"{self.value:g}")
        return f"{name} >= {bound}" + (f" ({kind.rule})" if kind.rule else "")


@dataclass(frozen=True)
class Promotion:
    """One step: ``node`` from ``before`` to ``after``; ``figure``: the target's figure with every step up to this one."""

    node: str
    before: NodePrecision
    after: NodePrecision
    figure: float | None = None
    measured: bool = False


@dataclass
class Search:
    """The search's outcome: the promotions kept, the figure before and after, whether the target holds."""

    target: AccuracyTarget
    start_figure: float | None
    figure: float | None
    met: bool
    promotions: list[Promotion] = field(default_factory=list)
    evaluations: int = 0
    tried: dict[int, float | None] = field(default_factory=dict)  # each prefix length evaluated -> its figure
    budget: float | None = None  # the latency budget the search kept to (the result's over the float model's)
    order: str = "sensitivity"  # the promotion list's order: "sensitivity" or "cost" (cheapest_first)
    costs: dict[str, float] = field(default_factory=dict)  # each node's predicted cost in float, where the profile gave it
    # Every assignment the search evaluated (prefixes and prune trials, by assignment_key) -> its figure: a later search reads it.
    judged: dict[frozenset, float | None] = field(default_factory=dict, repr=False)

    @property
    def precision(self) -> dict[str, NodePrecision]:
        return {p.node: p.after for p in self.promotions}


def promotion_steps(
    ranking: list[str],
    start: dict[str, NodePrecision],
    figures: dict[str, NodeSensitivity],
    *,
    max_float: int,
    allows: Callable[[str], bool] = lambda t: True,
    ladder: Ladder = FULL_LADDER,
) -> list[Promotion]:
    """Every step the search may take on ``ladder`` (the target's), in the order it takes them (see the module's text)."""
    current = dict(start)
    weight_db = {n: figures[n].weight_db for n in ranking}
    act_db = {n: figures[n].activation_db for n in ranking}
    steps: list[Promotion] = []
    floats = 0
    while True:
        added = False
        for n in ranking:
            p = current[n]
            if not p.quantized:
                continue
            q = _allowed_step(p, weight_db[n], act_db[n], allows, ladder)
            if not q.quantized:
                if floats >= max_float:
                    continue
                floats += 1
            steps.append(Promotion(n, p, q))
            current[n] = q
            weight_db[n] = _gained(weight_db[n], p.weights, q.weights)
            act_db[n] = _gained(act_db[n], p.activations, q.activations)
            added = True
        if not added:
            return steps


def search(
    steps: list[Promotion],
    start_figure: float | None,
    target: AccuracyTarget,
    measure: Callable[[dict[str, NodePrecision]], float | None],
) -> Search:
    """The shortest prefix of ``steps`` whose model meets ``target``; ``measure`` gives a precision assignment's figure."""
    figures: dict[int, float | None] = {0: start_figure}

    def at(k: int) -> float | None:
        if k not in figures:
            figures[k] = measure({s.node: s.after for s in steps[:k]})
        return figures[k]

    found = None
    if target.met(start_figure):
        found = 0
    else:
        low, k = 0, 1
        while found is None and low < len(steps):
            k = min(k, len(steps))
            if target.met(at(k)):
                found = k
            else:
                low, k = k, 2 * k
        if found is not None:
            while found - low > 1:  # the target holds at ``found`` and not at ``low``
                mid = (low + found) // 2
                if target.met(at(mid)):
                    found = mid
                else:
                    low = mid
    met = found is not None
    if found is None:  # the best evaluated
        found = max(figures, key=lambda k: (as_number(figures[k], target.metric), -k))
    kept = [Promotion(s.node, s.before, s.after, figures.get(k + 1), k + 1 in figures) for k, s in enumerate(steps[:found])]
    figure, pruned = figures[found], 0
    judged = {assignment_key({s.node: s.after for s in steps[:k]}): f for k, f in figures.items()}
    if met:
        kept, figure, pruned = _prune(kept, figure, target, measure, judged)
    return Search(target, start_figure, figure, met, kept, len(figures) - 1 + pruned, dict(figures), judged=judged)


def search_within(
    steps: list[Promotion],
    start_figure: float | None,
    target: AccuracyTarget,
    budget: float,
    ratio: Callable[[dict[str, NodePrecision]], float | None],
    measure: Callable[[dict[str, NodePrecision]], float | None],
    *,
    binding: bool,
) -> Search:
    """The longest prefix of ``steps`` whose model's latency ``ratio`` (over the float model's) stays within ``budget``.

    Each step keeps or adds accuracy and adds latency, so the longest prefix
    within the budget is the most accurate model in it: the doubling and
    halving of :func:`search`, on the timed ratio instead of the figure.
    ``met``: the result is within the budget and, where the target is
    ``binding`` (the user asked for one), meets it. Where even the types
    asked for run over the budget, they are the result.
    """
    ratios: dict[int, float | None] = {}

    def within(k: int) -> bool:
        if k not in ratios:
            ratios[k] = ratio({s.node: s.after for s in steps[:k]})
        got = ratios[k]
        return got is not None and got <= budget

    found = 0
    if within(0) and steps:
        low, k = 0, 1
        while True:
            k = min(k, len(steps))
            if not within(k):
                break
            low = k
            if k == len(steps):
                break
            k *= 2
        high = k if low < k else low
        while high - low > 1:  # within at ``low``, over at ``high``
            mid = (low + high) // 2
            low, high = (mid, high) if within(mid) else (low, mid)
        found = low
    figure = start_figure if found == 0 else measure({s.node: s.after for s in steps[:found]})
    met = within(0) and (not binding or target.met(figure))
    kept = [Promotion(s.node, s.before, s.after) for s in steps[:found]]
    if kept:
        kept[-1] = Promotion(kept[-1].node, kept[-1].before, kept[-1].after, figure, True)
    return Search(target, start_figure, figure, met, kept, len(ratios) + (found > 0), {0: start_figure, found: figure}, budget)


def _prune(
    kept: list[Promotion],
    figure: float | None,
    target: AccuracyTarget,
    measure: Callable[[dict[str, NodePrecision]], float | None],
    judged: dict[frozenset, float | None],
) -> tuple[list[Promotion], float | None, int]:
    """Drop every node's promotions that the target holds without, least sensitive node first.

    The prefix promotes nodes in rounds, so a node promoted early in the
    last round may not be needed once a more sensitive one went further.
    A step's figure is kept only while no earlier step was dropped; the
    last step's is the final figure. At most :data:`PRUNE_TRIALS` nodes are
    tried. ``judged``: the figures of the assignments the search already
    evaluated (by :func:`assignment_key`), read instead of evaluated again (the
    prefix one step short of the result is one, and dropping a node
    promoted only by the last step gives it), and each trial's figure
    added to it. Returns the steps kept, the figure and the evaluations
    made.
    """
    evaluations = tries = 0
    nodes = list(dict.fromkeys(p.node for p in kept))
    for node in reversed(nodes):
        if len(nodes) == 1 or tries == PRUNE_TRIALS:
            break
        trial = [p for p in kept if p.node != node]
        tries += 1
        precision = {p.node: p.after for p in trial}
        if assignment_key(precision) in judged:
            got = judged[assignment_key(precision)]
        else:
            evaluations += 1
            got = judged[assignment_key(precision)] = measure(precision)
        if target.met(got):
            first = next(k for k, p in enumerate(kept) if p.node == node)
            kept = [p if k < first else Promotion(p.node, p.before, p.after) for k, p in enumerate(trial)]
            kept[-1] = Promotion(kept[-1].node, kept[-1].before, kept[-1].after, got, True)
            figure = got
            nodes.remove(node)
    return kept, figure, evaluations


def assignment_key(precision: dict[str, NodePrecision]) -> frozenset:
    """A precision assignment as a key: the same nodes at the same types, in any order."""
    return frozenset(precision.items())


def _allowed_step(
    p: NodePrecision, weight_db: float | None, act_db: float | None, allows: Callable[[str], bool], ladder: Ladder
) -> NodePrecision:
    """The first step up ``ladder`` whose types the opset holds (float holds always)."""
    for q in candidate_steps(p, weight_db, act_db, ladder):
        if not q.quantized or all(allows(t) for t in (q.weights, q.activations) if t):
            return q
    return FLOAT


def _gained(db: float | None, before: str | None, after: str | None) -> float | None:
    if db is None or before is None or after is None or before == after:
        return db
    return db + _DB_PER_BIT * (element_type(after).bits - element_type(before).bits)


def as_number(figure: float | None, metric: str) -> float:
    """A figure for comparison: an exact output (None SQNR) is infinitely good; no agreement is the worst."""
    if figure is None:
        return math.inf if metric == "sqnr" else -math.inf
    return figure
