"""The trade-off a run measured: each model the search built, its accuracy figure, latency and size, and the flags that give it.

The search evaluates a few prefixes of its promotion list on the way to
the target. Where the result runs slower than the float model, or misses
the target, a user needs to see what else was on offer: the types asked
for (the fastest), the result, and the prefixes between, each timed
against the float model in pairs at each batch the users run, with the
command-line flags that write it. Where the result meets its target
faster than float, only the result is timed. The rows other than the
model written are a first look (a few pairs a batch: the machine's
noise moves them by a few hundredths), what a user picks a flag by; the
model written is timed in full, what the run's verdict rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qlinear.quantize._latency import Latency, worst_ratio
from qlinear.quantize._precision import NodePrecision
from qlinear.quantize._promotion import Search

__all__ = ["Candidate", "latency_text", "tradeoff"]

# Rows between the types asked for and the result, at most (each costs a build and a timing).
_BETWEEN = 3


@dataclass(frozen=True)
class Candidate:
    """One model the search built: ``promotions`` steps of its list, and what it measured."""

    promotions: int
    figure: float | None
    latency: tuple[Latency, ...] | None  # at each batch the users run; None where the runtime cannot load it
    size_bytes: int
    flags: str
    chosen: bool = False


def tradeoff(
    search: Search,
    steps: list[Any],
    time: Callable[[dict[str, NodePrecision]], tuple[tuple[Latency, ...] | None, int]],
    chosen: dict[str, NodePrecision],
    glance: Callable[[dict[str, NodePrecision]], tuple[tuple[Latency, ...] | None, int]] | None = None,
) -> list[Candidate]:
    """The types asked for, the evaluated prefixes between (at most a few) and the model written, by their promotions.

    ``steps``: the search's promotion list; ``time``: a precision
    assignment's latency at each batch the users run and its size, as
    the target runtime runs it; ``chosen``: the model written (the
    search's, with any nodes kept float for speed); ``glance``: the same
    as ``time`` in a first look of a few pairs, for the other rows
    (``time`` where not given). Where the model
    written meets its target and runs faster than float at every batch,
    there is nothing to trade and no other row is timed (each costs a
    build and a timing): the model written alone.
    """
    latency, size = time(chosen)
    written = Candidate(len(search.promotions), search.figure, latency, size, "(this run's)", chosen=True)
    if search.met and latency and worst_ratio(latency) <= 1.0:
        return [written]
    result_is_a_prefix = _same_prefix(search, steps)
    between = sorted(k for k in search.tried if k > 0 and not (result_is_a_prefix and k == len(search.promotions)))
    if len(between) > _BETWEEN:
        between = [between[round(i * (len(between) - 1) / (_BETWEEN - 1))] for i in range(_BETWEEN)]
    rows = []
    for k in [0, *between] if search.promotions else []:
        precision = {s.node: s.after for s in steps[:k]}
        latency, size = (glance or time)(precision)
        rows.append(Candidate(k, search.tried.get(k), latency, size, _flags(k, latency)))
    return [*rows, written]


def _same_prefix(search: Search, steps: list[Any]) -> bool:
    """Whether the result is the plain prefix of its length (no promotion pruned from it)."""
    n = len(search.promotions)
    return [(p.node, p.after) for p in search.promotions] == [(s.node, s.after) for s in steps[:n]]


def _flags(k: int, latency: tuple[Latency, ...] | None) -> str:
    """The flags that write a model like the ``k``-step one: no promotion, or its slowest batch's latency as the budget."""
    if k == 0:
        return "--no-promote"
    if not latency:
        return "-"
    return f"--latency-budget {math.ceil(100 * worst_ratio(latency) - 1e-9) / 100:.2f}"  # up to the next hundredth


def latency_text(latency: tuple[Latency, ...] | None) -> str:
    """A candidate's latency as the reports show it: its ratio at each batch (``0.93x at 1, 1.17x at 16``)."""
    return ", ".join(f"{t.ratio:.2f}x at {t.batch}" for t in latency) if latency else "-"
