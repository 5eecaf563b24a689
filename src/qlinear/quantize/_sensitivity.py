"""The analysis pass: how much error each quantized node adds on its own.

For every node the plan quantizes, three figures on a few held-out batches:

- **sensitivity**: the output SQNR of the model with only that node
  quantized (every other node float), the error the node adds on its own
  as the model's output sees it. This is the measure itself, not an
  estimate of it: each node's model is built from the saved calibration
  statistics, and only its part downstream of the node
  (:mod:`._downstream`) runs, on the float model's values of what that
  part reads, computed once a batch for all the nodes (in groups whose
  parts read at most :data:`HELD_BYTES` of them a batch and hold at most
  :data:`PARTS_HELD_BYTES` of weights). Every node on the first
  :data:`SCREEN_SAMPLES` samples, the most sensitive by that on all of
  them: the search's first promotions are ordered as finely as before, at
  a fraction of the parts' runs;
- **weight SQNR**: the stored weight against the float one;
- **activation SQNR**: each input activation against itself quantized with
  its chosen parameters, on the float model's values of the screening
  samples (the lowest among the node's inputs).

The mixed-precision search promotes nodes in the order of their
sensitivity, lowest SQNR first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

import qlinear
from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.quantize._build import Built, ModelBuilder
from qlinear.quantize._data import _count, _take
from qlinear.quantize._downstream import Downstream, Unchanged, downstream, element_types
from qlinear.quantize._evaluate import Reference, Runner, output_power
from qlinear.quantize._output_power import OutputsPower
from qlinear.quantize._precision import FLOAT, NodePrecision
from qlinear.quantize._session import only_outputs
from qlinear.quantize._sqnr import sqnr_db

__all__ = [
    "HELD_BYTES",
    "PARTS_HELD",
    "PARTS_HELD_BYTES",
    "SCREEN_SAMPLES",
    "NodeSensitivity",
    "analysis_runs",
    "analyze",
    "most_sensitive_first",
    "refined_count",
]

# Every node is measured on the first SCREEN_SAMPLES eval samples; the most sensitive of them by that, a share of
# REFINED_SHARE and at least REFINED_FEWEST, on all the analysis' samples. The promotions take the most sensitive
# first, so their order is the best measured; a part's run costs as many samples as it is fed, so screening on a
# quarter of them costs about a quarter.
SCREEN_SAMPLES = 16
REFINED_SHARE = 0.25
REFINED_FEWEST = 8
# The float values the nodes' parts read, held at most (bytes over a batch's samples); past it the nodes go in
# groups, one float run a batch each.
HELD_BYTES = 256 * 2**20
# The weights a group's parts hold at most: their sessions live together while the group runs batch by batch.
PARTS_HELD_BYTES = 256 * 2**20
# The parts' sessions a group holds at most (each has its own threads).
PARTS_HELD = 64


@dataclass(frozen=True)
class NodeSensitivity:
    """One node's figures (dB; None: exact, nothing lost)."""

    name: str
    sensitivity_db: float | None  # output SQNR with only this node quantized
    weight_db: float | None
    activation_db: float | None


def analyze(
    builder: ModelBuilder, full: Built, reference: Reference, *, progress: Callable[[int], None] | None = None
) -> dict[str, NodeSensitivity]:
    """Each node of ``full.plan``'s figures on ``reference``'s batches, in graph order.

    Every node is measured first on the batches of the first
    :data:`SCREEN_SAMPLES` samples; the most sensitive of them by that
    (:func:`refined_count`) go on to the rest of ``reference``'s batches, so
    their figures are all of them (the figures the search's first
    promotions are ordered by). The others keep their screening figures.
    The activation SQNRs are the screening batches'.
    """
    names = [p.name for p in full.plan.nodes]
    requested = {p.name: p.precision for p in full.plan.nodes}
    screen = reference.head(SCREEN_SAMPLES)
    activation_db = _activation_sqnr(builder, full, screen)
    unchanged: dict[int, Unchanged] = {}  # the float model at each opset, serialized once
    # Each part's reads first (the models let go: a part holds its model's weights), then each group's parts again.
    reads = {name: _part(builder, names, requested, name, reference.outputs, unchanged)[0] for name in names}
    power = _powers(builder, names, requested, reads, screen, {}, unchanged, progress)
    rest = reference.batch_range(len(screen.batches), len(reference.batches))
    if rest.batches:  # more samples than the screening's: the most sensitive go on to them
        db = {name: None if p is None else p.db for name, p in power.items()}
        first = most_sensitive_first({n: NodeSensitivity(n, db[n], None, None) for n in names})
        again = set(first[: refined_count(len(names))])
        power.update(_powers(builder, names, requested, {n: r for n, r in reads.items() if n in again}, rest, power,
                             unchanged, progress))  # fmt: skip
    return {
        name: NodeSensitivity(
            name, None if power[name] is None else power[name].db, full.converted[name].weight_sqnr_db, activation_db.get(name)
        )
        for name in names
    }


def analysis_runs(nodes: int, reference: Reference) -> int:
    """How many part runs (a node's part on a batch) :func:`analyze` makes for ``nodes`` nodes on ``reference`` (its progress bar's length)."""
    screened = len(reference.head(SCREEN_SAMPLES).batches)
    return nodes * screened + refined_count(nodes) * (len(reference.batches) - screened)


def refined_count(nodes: int) -> int:
    """How many of ``nodes`` analysed nodes, the most sensitive on the screening samples, are measured on all of them."""
    return min(nodes, max(REFINED_FEWEST, math.ceil(REFINED_SHARE * nodes)))


def _powers(builder: ModelBuilder, names: list[str], requested: dict[str, NodePrecision], reads: dict[str, _Reads],
            reference: Reference, before: dict[str, OutputsPower | None], unchanged: dict[int, Unchanged],
            progress: Callable[[int], None] | None) -> dict[str, OutputsPower | None]:  # fmt: skip
    """The output's signal and noise with each node of ``reads`` alone quantized, on ``reference``'s batches.

    ``reads``: what each node's part reads; ``before``: a node's power on
    earlier batches, continued. None: the node's change reaches no judged
    output. A group's parts run batch by batch: each batch's float values
    are computed once for all of them and let go before the next batch's.
    """
    power: dict[str, OutputsPower | None] = {}
    for opset, group in _groups(builder, reads, reference):
        power.update(_group_powers(builder, names, requested, opset, group, reads, reference, before, unchanged, progress))
    return power


def _group_powers(builder: ModelBuilder, names: list[str], requested: dict[str, NodePrecision], opset: int,
                  group: list[str], reads: dict[str, _Reads], reference: Reference,
                  before: dict[str, OutputsPower | None], unchanged: dict[int, Unchanged],
                  progress: Callable[[int], None] | None) -> dict[str, OutputsPower | None]:  # fmt: skip
    """:func:`_powers` for one group; its sessions go when it returns, before the next group's are made."""
    computed = _float_values(builder.float_at(opset), [t for n in group for t in reads[n].names], reference)
    power: dict[str, OutputsPower | None] = dict.fromkeys(group)
    runners: dict[str, tuple[Runner, tuple[str, ...]] | None] = {}
    for k, (feeds, _) in enumerate(reference.batches):
        values = computed(feeds)
        if k == 0:  # the parts let go once their sessions hold them; the sessions take turns: no arena, no spinning
            runners = {name: _runner(builder, names, requested, name, reference, unchanged, values) for name in group}
        batch = reference.batch_range(k, k + 1)
        for name, runner in runners.items():
            if runner is not None:
                got = runner[0]({t: values[t] for t in runner[1]})
                power[name] = output_power(batch, [got], power[name] or before.get(name))
            if progress:
                progress(1)
        del values  # before the next batch's are computed
    return power


def _runner(builder: ModelBuilder, names: list[str], requested: dict[str, NodePrecision], name: str, reference: Reference,
            unchanged: dict[int, Unchanged], values: dict[str, np.ndarray]) -> tuple[Runner, tuple[str, ...]] | None:  # fmt: skip
    """A session of ``name``'s part and what it reads, or None where the part reaches no judged output."""
    part = _part(builder, names, requested, name, reference.outputs, unchanged)[1]
    if not part.outputs:
        return None
    model = part.model(element_types(values))
    return Runner(model, [], reference.runtime, arena=False, spinning=False), part.reads


@dataclass(frozen=True)
class _Reads:
    """What a node's part reads of the float model (at ``opset``), and the bytes of the weights the part holds."""

    opset: int
    names: tuple[str, ...]
    weight_bytes: int


def _part(
    builder: ModelBuilder,
    names: list[str],
    requested: dict[str, NodePrecision],
    name: str,
    outputs: list[str],
    unchanged: dict[int, Unchanged],
) -> tuple[_Reads, Downstream]:
    """What the downstream part of the model with only ``name`` quantized reads, and the part."""
    alone = {other: FLOAT for other in names if other != name}
    alone[name] = requested[name]
    built = builder.build(alone)
    if built.opset not in unchanged:
        unchanged[built.opset] = Unchanged.of(builder.float_at(built.opset))
    part = downstream(built.model, unchanged[built.opset], outputs)
    if not part.outputs:  # nothing to run: it reads nothing and holds no session
        return _Reads(built.opset, (), 0), part
    return _Reads(built.opset, part.reads, sum(large.tensor_bytes(t) for t in part.initializers)), part


def _groups(builder: ModelBuilder, reads: dict[str, _Reads], reference: Reference) -> list[tuple[int, list[str]]]:
    """The nodes in graph order, in groups of one opset whose parts run together.

    A group's parts read at most :data:`HELD_BYTES` of float values a
    batch (the largest batch), hold at most :data:`PARTS_HELD_BYTES` of
    weights, and are at most :data:`PARTS_HELD`.
    """
    largest = max((_count(feeds, reference.axes) or 1) for feeds, _ in reference.batches)
    sizes: dict[str, int] = {}
    for opset in dict.fromkeys(r.opset for r in reads.values()):
        read = list(dict.fromkeys(t for r in reads.values() if r.opset == opset for t in r.names))
        sizes.update(_sample_bytes(builder.float_at(opset), read, reference))
    groups: list[tuple[int, list[str]]] = []
    held: set[str] = set()
    weights = 0
    for name, r in reads.items():
        more = set(r.names) - held
        fits = largest * sum(sizes[t] for t in held | more) <= HELD_BYTES and weights + r.weight_bytes <= PARTS_HELD_BYTES
        if groups and groups[-1][0] == r.opset and fits and len(groups[-1][1]) < PARTS_HELD:
            groups[-1][1].append(name)
            held |= more
            weights += r.weight_bytes
        else:
            groups.append((r.opset, [name]))
            held, weights = set(r.names), r.weight_bytes
    return groups


def _sample_bytes(float_model, reads: list[str], reference: Reference) -> dict[str, int]:
    """The bytes of each of ``reads`` a sample, from one run of the first batch cut to one sample."""
    feeds = reference.batches[0][0]
    one = {n: _take(np.asarray(v), reference.axes.get(n, 0), slice(0, 1)) for n, v in feeds.items()}
    computed = [t for t in reads if t not in feeds]
    try:
        values, per = Runner(float_model, computed, reference.runtime)(one), 1
    except QuantizationError:  # a model whose batch is fixed: the whole first batch, a sample's share of it
        values, per = Runner(float_model, computed, reference.runtime)(feeds), _count(feeds, reference.axes) or 1
    values = {**values, **one}
    return {t: -(-np.asarray(values[t]).nbytes // per) for t in reads}


def _float_values(
    float_model: onnx.ModelProto, reads: list[str], reference: Reference
) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function of a batch's feeds giving its float values of ``reads`` (the batch's own inputs among them).

    The model's outputs are only these, so the runtime computes no node
    they do not need. Its session keeps no arena: the values it returns are
    many and go once the batch's parts have run, and it takes turns with
    the parts' sessions, so it does not spin either.
    """
    reads = list(dict.fromkeys(reads))
    computed = [t for t in reads if t not in reference.batches[0][0]]
    runner = Runner(only_outputs(float_model, computed), [], reference.runtime, arena=False, spinning=False) if computed else None

    def values(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = {**(runner(feeds) if runner is not None else {}), **feeds}
        return {t: np.asarray(got[t]) for t in reads}

    return values


def most_sensitive_first(figures: dict[str, NodeSensitivity]) -> list[str]:
    """Node names, the lowest sensitivity SQNR first (exact nodes last, in graph order among equals)."""
    order = {name: k for k, name in enumerate(figures)}
    return sorted(figures, key=lambda n: (_error(figures[n].sensitivity_db), order[n]))


def _error(db: float | None) -> float:
    """Sort key: a NaN output SQNR (the node alone broke the output) first, an exact one (None) last."""
    if db is None:
        return np.inf
    return -np.inf if db != db else db


def _activation_sqnr(builder: ModelBuilder, full: Built, reference: Reference) -> dict[str, float | None]:
    """Each node's lowest input-activation SQNR on the float model's values."""
    p = full.plan
    tensors = sorted({t for node in p.nodes for t in node.activations})
    if not tensors:
        return {}
    runner = Runner(builder.fm.model, tensors, reference.runtime)
    signal = dict.fromkeys(tensors, 0.0)
    noise = dict.fromkeys(tensors, 0.0)
    for feeds, _ in reference.batches:
        values = runner(feeds)
        for t in tensors:
            x = np.asarray(values[t], np.float32)
            qp = builder.params(p.root(t), p.activation_type(t), p.root(t) in p.symmetric)
            q = qlinear.quantize_linear(x, qp.scale, qp.zero_point, output_dtype=p.activation_type(t))
            back = qlinear.dequantize_linear(q, qp.scale, qp.zero_point).astype(np.float64)
            x64 = x.astype(np.float64)
            finite = np.isfinite(x64)
            signal[t] += float((x64[finite] ** 2).sum())
            noise[t] += float(((x64[finite] - back[finite]) ** 2).sum())
    db = {t: sqnr_db(signal[t], noise[t]) for t in tensors}
    out = {}
    for node in p.nodes:
        values = [db[t] for t in node.activations]
        finite = [v for v in values if v is not None]
        out[node.name] = min(finite) if finite else None
    return out
