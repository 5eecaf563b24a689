"""Each node's share of a quantized model's run on its target runtime, from the runtime's own profile.

The speed trials (:mod:`._speed`) time a kind of node in float only where
it could pay: a kind saves at most what its kernels and the Q/DQ next to
them take, so a kind whose share of the run is under the least saving a
trial must show is not timed. A Q/DQ node the runtime left unfused counts
in full for every node it quantizes for or dequantizes to, since floating
any of them could remove it: the share is an upper bound, as the rule
needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

__all__ = ["node_shares"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def node_shares(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], runtime: Any) -> list[dict[str, float]] | None:
    """For each batch of ``feeds``, each compute node's share of a run of ``model`` (0 to 1), its Q/DQ's included.

    None where the runtime cannot tell (no profile, or it cannot load the model).
    """
    if runtime.node_times is None:
        return None
    neighbours = _qdq_neighbours(model.graph)
    shares = []
    for batch in feeds:
        timed = runtime.node_times(model, batch)
        if timed is None:
            return None
        times, run = timed
        share = {}
        for node in model.graph.node:
            if node.op_type in _QDQ:
                continue
            own = times.get(node.name, 0.0) + sum(times.get(q, 0.0) for q in neighbours.get(node.name, ()))
            share[node.name] = own / run if run > 0 else 0.0
        shares.append(share)
    return shares


def _qdq_neighbours(graph: onnx.GraphProto) -> dict[str, set[str]]:
    """For each compute node, the Q and DQ nodes on the tensors it reads and writes (through a Q -> DQ pair)."""
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    qdq = {n.name for n in graph.node if n.op_type in _QDQ}
    out: dict[str, set[str]] = {}

    def chain(tensor: str, seen: set[str]) -> set[str]:
        """The Q/DQ nodes a tensor passes through, both ways, and the compute nodes at its ends."""
        found: set[str] = set()
        for n in [producer.get(tensor), *readers.get(tensor, ())]:
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
