"""Cross-layer equalization: even out the channel ranges of two convolutions joined by a Relu.

For ``Conv1 -> Relu -> Conv2`` (or no Relu), output channel ``i`` of Conv1 is
input channel ``i`` of Conv2. Since ``relu(x / s) = relu(x) / s`` for
``s > 0``, dividing Conv1's filter ``i`` and bias ``i`` by ``s_i`` and
multiplying Conv2's input channel ``i`` by ``s_i`` leaves the function
unchanged. With ``r1_i`` the range of Conv1's filter ``i`` and ``r2_i`` that
of Conv2's input channel ``i``, ``s_i = sqrt(r1_i / r2_i)`` gives both the
same range ``sqrt(r1_i r2_i)`` (Nagel et al., "Data-Free Quantization",
2019): a per-tensor weight scale then no longer spends its levels on one
large channel. Applied in chains (each pair in graph order, repeated a few
times so a layer between two others settles), on float weights before
anything is quantized; it needs no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from qlinear.quantize._model import FloatModel, index
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._registry import Algorithm, register

__all__ = ["Equalized", "equalize"]

ROUNDS = 4  # passes over the chain; each pair's scales move its neighbours' ranges


@dataclass(frozen=True)
class Equalized:
    """One pair equalized: the two convolutions and the largest and smallest channel scale applied."""

    first: str
    second: str
    largest_scale: float
    smallest_scale: float


def equalize(fm: FloatModel, excluded: set[str]) -> list[Equalized]:
    """Equalize every ``Conv -> [Relu] -> Conv`` pair of ``fm`` in place (its function unchanged up to rounding)."""
    pairs = _pairs(fm, excluded)
    if not pairs:
        return []
    values = {name: fm.constant(name).astype(np.float64) for p in pairs for name in _names(p)}
    total = {(a.name, b.name): np.ones(values[a.input[1]].shape[0]) for a, b in pairs}
    for _ in range(ROUNDS):
        for a, b in pairs:
            w1, w2 = values[a.input[1]], values[b.input[1]]
            r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
            r2 = np.abs(w2).transpose(1, 0, *range(2, w2.ndim)).reshape(w2.shape[1], -1).max(axis=1)
            s = np.where((r1 > 0) & (r2 > 0), np.sqrt(r1 / np.where(r2 > 0, r2, 1.0)), 1.0)
            values[a.input[1]] = w1 / s.reshape(-1, *([1] * (w1.ndim - 1)))
            if len(a.input) > 2 and a.input[2]:
                values[a.input[2]] = values[a.input[2]] / s
            values[b.input[1]] = w2 * s.reshape(1, -1, *([1] * (w2.ndim - 2)))
            total[(a.name, b.name)] *= s
    for name, v in values.items():
        fm.set_constant(name, v.astype(fm.constant(name).dtype))
    index(fm)
    return [Equalized(a, b, float(s.max()), float(s.min())) for (a, b), s in total.items()]


def _names(pair: tuple[onnx.NodeProto, onnx.NodeProto]) -> list[str]:
    a, b = pair
    return [a.input[1], *([a.input[2]] if len(a.input) > 2 and a.input[2] else []), b.input[1]]


def _pairs(fm: FloatModel, excluded: set[str]) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """``(Conv1, Conv2)`` where Conv1's output reaches only Conv2's data input, through at most one Relu."""
    pairs = []
    for a in fm.graph.node:
        if not _plain_conv(fm, a, excluded):
            continue
        out = a.output[0]
        users = fm.consumers.get(out, [])
        if len(users) == 1 and users[0].op_type == "Relu" and out not in fm.output_names:
            out = users[0].output[0]
            users = fm.consumers.get(out, [])
        if out in fm.output_names or len(users) != 1 or not _plain_conv(fm, users[0], excluded):
            continue
        b = users[0]
        if b.input[0] != out or fm.shapes[b.input[1]][1] != fm.shapes[a.input[1]][0]:
            continue
        pairs.append((a, b))
    return pairs


def _plain_conv(fm: FloatModel, node: onnx.NodeProto, excluded: set[str]) -> bool:
    """A Conv of one group on a constant weight (and constant bias, if any) that each belong to it alone."""
    if node.op_type != "Conv" or node.name in excluded or "Conv" in excluded or len(node.input) < 2:
        return False
    if any(a.name == "group" and helper.get_attribute_value(a) != 1 for a in node.attribute):
        return False
    consts = [t for t in node.input[1:] if t]
    return all(t in fm.initializers and len(fm.consumers.get(t, [])) == 1 for t in consts)


def _apply(fm: FloatModel, options, data, bars) -> list[Equalized]:
    return equalize(fm, set(options.exclude))


ALGORITHM = register(
    Algorithm(
        name="equalize",
        summary="cross-layer equalization of Conv -> [Relu] -> Conv pairs before quantizing (needs no data)",
        stage="float",
        reads_data=False,  # it rescales weights alone
        fields=(
            (
                "equalize",
                bool,
                option(
                    False,
                    group="algorithms",
                    form="switch",
                    help="cross-layer equalization of Conv -> Relu -> Conv pairs (off by default: it did not help the CNNs measured)",
                ),
            ),
        ),
        apply=_apply,
    )
)
