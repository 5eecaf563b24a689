"""Per-node precision: the types one node is quantized with, and the ladder a promotion climbs.

A node starts at the types the user asked for. A promotion moves it one
step up its ladder: the weights to the next wider type (2-bit -> 4-bit ->
8-bit, float4 -> float8 -> int8), or the activations from 8 to 16 bits
(uint8 -> uint16, int8 and float8 -> int16), whichever adds more error on
its own; once neither can widen, the node goes to float. A tensor read or
written by several nodes takes the widest activation type among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from qlinear.dtypes import element_type

__all__ = [
    "FLOAT",
    "FULL_LADDER",
    "Ladder",
    "NodePrecision",
    "candidate_steps",
    "next_step",
    "reachable",
    "wider_activation",
]

WEIGHT_PROMOTION = {
    "int2": "int4", "uint2": "uint4", "int4": "int8", "uint4": "uint8",
    "float4e2m1": "float8e4m3fn", "float8e5m2": "float8e4m3fn", "float8e4m3fn": "int8",
}  # fmt: skip
ACTIVATION_PROMOTION = {"uint8": "uint16", "int8": "int16", "float8e4m3fn": "int16"}


@dataclass(frozen=True)
class Ladder:
    """The steps a promotion may take: each weight type's next wider type, each activation type's.

    A target keeps the steps that pay on its runtime; a type with no step
    here goes straight to float when its side must widen.
    """

    weights: Mapping[str, str]
    activations: Mapping[str, str]


# Every step the types allow.
FULL_LADDER = Ladder(WEIGHT_PROMOTION, ACTIVATION_PROMOTION)


@dataclass(frozen=True)
class NodePrecision:
    """A node's weight and activation types; ``quantized`` False: the node stays float (``why``: the reason the report gives)."""

    weights: str | None
    activations: str | None
    quantized: bool = True
    why: str = field(default="", compare=False)

    def describe(self) -> str:
        if not self.quantized:
            return "float"
        if self.weights is None and self.activations:  # a node with no weight (activation x activation MatMul)
            return f"a {self.activations}"
        return f"w {self.weights or 'float'} / a {self.activations or 'float'}"


FLOAT = NodePrecision(None, None, quantized=False)


def next_step(
    p: NodePrecision, weight_db: float | None, activation_db: float | None, ladder: Ladder = FULL_LADDER
) -> NodePrecision:
    """``p`` one step up: the side with the lower SQNR widens if it can, else the other, else the node goes float.

    ``weight_db``/``activation_db``: that side's SQNR (None: exact or not
    quantized, so never the side to widen first).
    """
    return candidate_steps(p, weight_db, activation_db, ladder)[0]


def candidate_steps(
    p: NodePrecision, weight_db: float | None, activation_db: float | None, ladder: Ladder = FULL_LADDER
) -> list[NodePrecision]:
    """The steps up from ``p`` on ``ladder`` in the order :func:`next_step` prefers them, float last."""
    if not p.quantized:
        return [p]
    sides = []
    if p.weights in ladder.weights:
        sides.append((_error(weight_db), NodePrecision(ladder.weights[p.weights], p.activations)))
    if p.activations in ladder.activations:
        sides.append((_error(activation_db), NodePrecision(p.weights, ladder.activations[p.activations])))
    sides.sort(key=lambda side: -side[0])  # stable: weights first on a tie
    return [q for _, q in sides] + [FLOAT]


def reachable(p: NodePrecision, ladder: Ladder) -> list[NodePrecision]:
    """Every quantized precision the promotions on ``ladder`` can take ``p`` to, the widest first and ``p`` last.

    Each side climbs its own steps, so the precisions are every pair of a
    weight type and an activation type on the two climbs.
    """
    return [NodePrecision(w, a) for w in _climb(p.weights, ladder.weights) for a in _climb(p.activations, ladder.activations)]


def _climb(t: str | None, steps: Mapping[str, str]) -> list[str | None]:
    """``t`` and the types its steps widen it to, the widest first."""
    climbed = [t]
    while climbed[-1] in steps:
        climbed.append(steps[climbed[-1]])
    return climbed[::-1]


def _error(db: float | None) -> float:
    """The error a side's SQNR stands for: None (exact) none, NaN (the output broke) the most."""
    if db is None:
        return -float("inf")
    return float("inf") if db != db else -db


def wider_activation(a: str, b: str) -> str:
    """The wider of two activation types (the first on a tie)."""
    return b if element_type(b).bits > element_type(a).bits else a
