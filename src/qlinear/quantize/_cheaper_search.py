"""The promotion search told what each step costs: a cheaper set of promotions that meets the target.

:func:`~qlinear.quantize._promotion.search` takes the most sensitive nodes
first, whatever they cost on the runtime. Where that model misses the
target or is slow (:data:`FAST_ENOUGH`) and the runtime's profiles say what each node costs in float
(:func:`~qlinear.quantize._node_cost.float_costs`), a second list
orders the steps by what they buy for what they cost
(:func:`cheapest_first`): the output noise a node adds alone over its
cost, so a cheap node that fixes enough comes before a costly one that
fixes more. That greedy answer to a knapsack fails where one costly
node is needed, so it is searched second (:func:`search_cheaper`), as
far as it is predicted to cost less, and kept where it meets the target
at a lower predicted cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from qlinear.quantize._precision import NodePrecision
from qlinear.quantize._promotion import AccuracyTarget, Promotion, Search, as_number, assignment_key, search
from qlinear.quantize._sensitivity import NodeSensitivity

__all__ = ["COST_FLOOR", "FAST_ENOUGH", "cheapest_first", "predicted_cost", "search_cheaper"]

# A model that meets its target at no more than this share of the float model's latency at every batch the users run
# is not searched for a cheaper set of promotions: the runtime's profiles and a second search cost more of the run
# than the little they could save there (ONNX Runtime's integer kernels run these models at 0.5-0.8x).
FAST_ENOUGH = 0.85
# The least cost a node is ranked by (a share of a run of the model as asked): below the profile's resolution, every
# node is as cheap as another and the noise it adds alone ranks it.
COST_FLOOR = 0.005


def cheapest_first(ranking: list[str], figures: dict[str, NodeSensitivity], costs: dict[str, float]) -> list[str]:
    """``ranking`` (most sensitive first) reordered by the output noise each node adds alone over its cost in float.

    The noise is ``10 ** (-sensitivity_db / 10)`` of the output's power (a
    node that broke the output alone: unbounded; an exact one: none);
    the cost is ``costs``' (a share of a run as asked, at least
    :data:`COST_FLOOR`; a node the profile did not see costs the floor).
    Equal ratios keep ``ranking``'s order.
    """
    place = {n: k for k, n in enumerate(ranking)}

    def value(n: str) -> float:
        db = figures[n].sensitivity_db
        if db is None:  # exact alone
            return 0.0
        noise = math.inf if db != db else 10.0 ** (-db / 10.0)  # NaN: the node alone broke the output
        return noise / max(costs.get(n, 0.0), COST_FLOOR)

    return sorted(ranking, key=lambda n: (-value(n), place[n]))


def search_cheaper(
    found: Search,
    cheap: list[Promotion],
    steps: list[Promotion],
    target: AccuracyTarget,
    measure: Callable[[dict[str, NodePrecision]], float | None],
    costs: dict[str, float],
) -> tuple[Search, list[Promotion]]:
    """A search of ``cheap`` for a cheaper set than ``found``, :func:`search`'s result on ``steps`` (most sensitive first).

    ``cheap``: the same steps in :func:`cheapest_first`'s order; ``costs``:
    each node's predicted cost in float. The cheap list is searched only
    as far as its prefixes are predicted to cost less than ``found`` by
    more than :data:`COST_FLOOR` (all of it where ``found`` missed the
    target), and its result is taken where it meets the target at a
    predicted cost that much lower (prefixes whose nodes cost less than
    nothing in float can reach the first result's own nodes), or where
    both miss it and it comes closer. What ``found`` judged (its
    prefixes and prune trials) is not judged again; the evaluations counted are the two searches'
    together. Returns the search and the list it took.
    """
    judged = dict(found.judged)
    added = 0

    def once(precision: dict[str, NodePrecision]) -> float | None:
        nonlocal added
        key = assignment_key(precision)
        if key not in judged:
            added += 1
            judged[key] = measure(precision)
        return judged[key]

    spent = predicted_cost(found.promotions, costs) if found.met else math.inf
    # The longest prefix predicted cheaper: predicted_cost of each prefix, kept running (each node's cost as it stands).
    affordable, held, cost = 0, {}, 0.0
    for k, s in enumerate(cheap, 1):
        now = 0.0 if s.after.quantized else costs.get(s.node, 0.0)
        cost += now - held.get(s.node, 0.0)
        held[s.node] = now
        if cost < spent - COST_FLOOR:
            affordable = k
    other = search(cheap[:affordable], found.start_figure, target, once) if affordable and cheap != steps else None
    if other is not None and (
        predicted_cost(other.promotions, costs) < spent - COST_FLOOR
        if other.met
        else not found.met and as_number(other.figure, target.metric) > as_number(found.figure, target.metric)
    ):  # cheaper at the target, or, both missing it, the better figure
        return replace(other, order="cost", evaluations=found.evaluations + added), cheap
    return replace(found, evaluations=found.evaluations + added), steps


def predicted_cost(promotions: list[Promotion], costs: dict[str, float]) -> float:
    """The predicted cost of ``promotions``: the sum of ``costs`` over the nodes they leave float (0 where not given)."""
    last = {p.node: p.after for p in promotions}
    return sum(costs.get(node, 0.0) for node, p in last.items() if not p.quantized)
