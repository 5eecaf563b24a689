"""The analysis pass: how much error each quantized node adds on its own.

For every node the plan quantizes, three figures on a few held-out batches:

- **sensitivity**: the output SQNR of the model with only that node
  quantized (every other node float), the error the node adds on its own
  as the model's output sees it. This is the measure itself, not an
  estimate of it: one model a node, each built from the saved calibration
  statistics and run on ONNX Runtime (or qlinear's engine) on the same
  batches, so no node is calibrated twice;
- **weight SQNR**: the stored weight against the float one;
- **activation SQNR**: each input activation against itself quantized with
  its chosen parameters, on the float model's values (the lowest among the
  node's inputs).

The mixed-precision search promotes nodes in the order of their
sensitivity, lowest SQNR first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import qlinear
from qlinear.quantize._build import Built, ModelBuilder
from qlinear.quantize._evaluate import Reference, Runner, output_figures
from qlinear.quantize._precision import FLOAT
from qlinear.quantize._to_qdq import sqnr_db

__all__ = ["NodeSensitivity", "analyze", "most_sensitive_first"]


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
    """Each node of ``full.plan``'s figures on ``reference``'s batches, in graph order."""
    names = [p.name for p in full.plan.nodes]
    requested = {p.name: p.precision for p in full.plan.nodes}
    activation_db = _activation_sqnr(builder, full, reference)
    result = {}
    for name in names:
        alone = {other: FLOAT for other in names if other != name}
        alone[name] = requested[name]
        sqnr, _ = output_figures(builder.build(alone).model, reference)
        result[name] = NodeSensitivity(name, sqnr, full.converted[name].weight_sqnr_db, activation_db.get(name))
        if progress:
            progress(1)
    return result


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
            qp = builder.params(p.root(t), p.activation_type(t))
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
