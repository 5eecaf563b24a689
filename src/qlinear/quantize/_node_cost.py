"""Each node's share of a quantized model's run on its target runtime, from the runtime's own profile.

The speed trials (:mod:`._speed`) time a kind of node in float only where
it could pay: a kind saves at most what its kernels and the Q/DQ next to
them take, so a kind whose share of the run is under the least saving a
trial must show is not timed. A Q/DQ node the runtime left unfused counts
in full for every node it quantizes for or dequantizes to, since floating
any of them could remove it; so does the time of the kernels the runtime
adds (layout reorders, Transposes around an NHWC region), which floating a
kind can also remove, once for each kind. The share is an upper bound, as the rule needs, up
to the profile's own noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from qlinear.onnx._graph import producers, readers

__all__ = ["ADDED", "alternate", "float_costs", "node_seconds", "node_shares"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")
# The key of the share of the kernels the runtime added, which name no node of the model.
ADDED = ""


def node_shares(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], runtime: Any) -> list[dict[str, float]] | None:
    """For each batch of ``feeds``, each compute node's share of a run of ``model`` (0 to 1), its Q/DQ's included.

    The kernels the runtime added are under :data:`ADDED`, once: a kind of
    node's bound is its nodes' shares and that. None where the runtime
    cannot tell (no profile, or it cannot load or run the model).
    """
    timed = node_seconds(model, feeds, runtime)
    if timed is None:
        return None
    return [{name: t / run for name, t in times.items()} for times, run in timed]


def float_costs(
    asked: list[tuple[dict[str, float], float]] | None,
    floated: list[tuple[list[tuple[dict[str, float], float]] | None, set[str]]],
) -> dict[str, float] | None:
    """Each node's predicted cost of running in float, as a share of a run of the model at the types asked for.

    ``asked``: :func:`node_seconds` of the model at the types asked for;
    ``floated``: the same of models with a set of nodes in float, and
    that set. A node's cost, at each batch, is its seconds (its Q/DQ's
    included) in the model that has it in float less those in the model
    as asked, over the run as asked; the mean over the batches. Timed
    where it runs among quantized neighbours, it pays for the Q and DQ a
    float node adds at its edges, which its time in the float model does
    not show. Negative: the node runs faster in float. None where the
    runtime gave no profile of one of the models.
    """
    if asked is None or any(times is None or len(times) != len(asked) for times, _ in floated):
        return None
    costs: dict[str, float] = {}
    for times, nodes in floated:
        for (as_asked, run), (in_float, _) in zip(asked, times, strict=True):
            if run <= 0:
                return None
            for name in nodes:
                change = (in_float.get(name, 0.0) - as_asked.get(name, 0.0)) / run / len(asked)
                costs[name] = costs.get(name, 0.0) + change
    return costs


def alternate(nodes: Sequence[str]) -> list[set[str]]:
    """``nodes`` (in graph order) in two sets, every other one: along a chain, a node's neighbours are in the other.

    An empty set is left out (one node: one set), so that no model is profiled for nothing.
    """
    return [half for half in (set(nodes[0::2]), set(nodes[1::2])) if half]


def node_seconds(
    model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], runtime: Any
) -> list[tuple[dict[str, float], float]] | None:
    """For each batch of ``feeds``, each compute node's seconds in a run of ``model`` with its Q/DQ's, and a run's.

    The kernels the runtime added are under :data:`ADDED`. None where the
    runtime cannot tell (no profile, or it cannot load or run the model).
    """
    if runtime.node_times is None or not feeds:  # no feeds: a model not timed (one run in parts)
        return None
    timed = runtime.node_times(model, feeds)
    if timed is None:
        return None
    neighbours = _qdq_neighbours(model.graph)
    names = {n.name for n in model.graph.node}
    out = []
    for times, run in timed:
        if run <= 0:
            return None
        seconds = {ADDED: sum(t for name, t in times.items() if name not in names)}  # kernels of no model node
        for node in model.graph.node:
            if node.op_type not in _QDQ:
                seconds[node.name] = times.get(node.name, 0.0) + sum(times.get(q, 0.0) for q in neighbours.get(node.name, ()))
        out.append((seconds, run))
    return out


def _qdq_neighbours(graph: onnx.GraphProto) -> dict[str, set[str]]:
    """For each compute node, the Q and DQ nodes on the tensors it reads and writes (through a Q -> DQ pair)."""
    producer, reading = producers(graph), readers(graph)
    qdq = {n.name for n in graph.node if n.op_type in _QDQ}
    out: dict[str, set[str]] = {}

    def chain(tensor: str, seen: set[str]) -> set[str]:
        """The Q/DQ nodes a tensor passes through, both ways, and the compute nodes at its ends."""
        found: set[str] = set()
        for n in [producer.get(tensor), *reading.get(tensor, ())]:
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            found.add(n.name)
            if n.op_type in _QDQ:
                for t in (*n.input[:1], *n.output):
                    found |= chain(t, seen)
        return found

    for n in graph.node:
        if n.op_type in _QDQ:
            continue
        near: set[str] = set()
        for t in (*n.input, *n.output):
            near |= chain(t, {n.name})
        out[n.name] = near & qdq
    return out
