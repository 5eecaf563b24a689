"""A model too large to hold whole, run part by part: each part's session made, run and let go in turn.

ONNX Runtime copies every weight of a model it runs into its session (and,
for its fast MatMul and Conv kernels, packs another copy of each), so a
session of a 3 GB model costs 6-9 GB however small its batch. A model
that :func:`runs_in_parts` is cut here, in graph order, into parts of
about :data:`PART_BYTES` of weights; a run makes each part's session in
turn, feeds it the tensors earlier parts made (as ONNX Runtime values,
never copied through numpy) and drops it before the next, so a run holds
one part's weights and the tensors that cross the cuts. A weight's values
come from its :class:`~qlinear.onnx._large.TensorStore`, mapped at each
use, so its pages leave the process with the part.

What a part reads only from weights (a weight's DequantizeLinear, a
reshape of a constant) goes with each part that reads it: a cut never
carries a weight's values from one part to the next, and ONNX Runtime
fuses a weight's DequantizeLinear into its consumer as in the whole
model. Fusions across a cut (a MatMul and the Add of the next part) do
not happen, so a part's figures can differ from the whole model's in the
last bits of a float; a run costs a session a part, so a model run in
parts is not timed. Parts' sessions do not pack weights (each is made for
one run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx._graph import node_reads
from qlinear.onnx._ort_values import from_ort_value, to_ort_value

__all__ = ["PART_BYTES", "WHOLE_BYTES", "PartedSession", "cut", "runs_in_parts", "session"]

# A model whose initializers hold this many bytes or more runs in parts.
WHOLE_BYTES = 1 << 30
# A part's weights, about: a node is added to a part while the part holds less (one node of more is a part alone).
PART_BYTES = 256 << 20


@dataclass
class Part:
    """Nodes of the graph run as one session, in graph order, and what they read from outside the part."""

    nodes: list[onnx.NodeProto]
    reads: list[str]  # graph inputs and tensors of earlier parts, in the order first read
    initializers: list[str]  # the graph's initializers they read


# ONNX Runtime's names of tensor types ("tensor(float)") -> ONNX's.
_ORT_TYPES = {f"tensor({name.lower()})": number for name, number in onnx.TensorProto.DataType.items()}


def session(model: onnx.ModelProto, make_options: Callable[[], Any], providers: list[str]) -> Any:
    """An ONNX Runtime session for ``model`` of any size: a large one's big initializers go beside its graph.

    ``make_options`` makes the ``SessionOptions`` (a session's own: they
    hold the values given beside its graph for the session's life). A
    model that :func:`runs_in_parts` gets a :class:`PartedSession`, which
    has ``run`` only.
    """
    if runs_in_parts(model):
        return PartedSession(model, make_options, lambda part, options: _whole_session(part, options, providers))
    return _whole_session(model, make_options(), providers)


def _whole_session(model: onnx.ModelProto, options: Any, providers: list[str]) -> Any:
    import onnxruntime as ort

    markers = [t for t in model.graph.initializer if large.is_marker(t)]
    past_limit = large.is_large(model)
    if not markers and not past_limit:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    light, moved = large.graph_only(model) if past_limit else (model, [])
    values = [to_ort_value(large.value_of(t)) for t in (*markers, *moved)]
    options.add_external_initializers([t.name for t in (*markers, *moved)], values)
    sess = ort.InferenceSession(light.SerializeToString(), options, providers=providers)
    sess._qlinear_initializers = values  # ONNX Runtime's API asks that they live as long as the session
    return sess


def runs_in_parts(model: onnx.ModelProto) -> bool:
    """Whether ``model`` runs in parts: its initializers hold :data:`WHOLE_BYTES` or more, or those beside its graph
    (a large model's, or those of a model made from one: its int8 codes) :data:`PART_BYTES` or more.

    ONNX Runtime copies each weight given beside a graph into a session of
    it (and packs a copy of it for its fast kernels), so a session of a 3
    GB float model's 0.75 GB of int8 codes took 1.5 GB.
    """
    beside = whole = 0
    for t in model.graph.initializer:
        size = large.tensor_bytes(t)
        whole += size
        beside += size if large.is_marker(t) else 0
    return whole >= WHOLE_BYTES or beside >= PART_BYTES


def cut(graph: onnx.GraphProto, part_bytes: int | None = None) -> list[Part]:
    """``graph``'s nodes (in topological order, as ONNX has them) in parts of about ``part_bytes`` (default
    :data:`PART_BYTES`) of weights, in that order."""
    part_bytes = PART_BYTES if part_bytes is None else part_bytes
    inits = {t.name: t for t in graph.initializer}
    sizes = {name: large.tensor_bytes(t) for name, t in inits.items()}
    constant: dict[str, int] = {}  # a tensor made from initializers alone -> its producer's index
    order = list(graph.node)
    for k, node in enumerate(order):
        if all(name in inits or name in constant for name in node_reads(node)):
            constant.update({o: k for o in node.output if o})

    def closure(k: int) -> set[int]:
        """Node ``k`` and the constant nodes it reads through."""
        found, todo = {k}, [k]
        while todo:
            for name in node_reads(order[todo.pop()]):
                j = constant.get(name)
                if j is not None and j not in found:
                    found.add(j)
                    todo.append(j)
        return found

    groups: list[set[int]] = []
    held = 0
    pending: set[int] = set()  # activations' DequantizeLinear nodes, placed with the node after them
    for k, node in enumerate(order):
        if node.output and all(o in constant for o in node.output if o):
            continue  # goes with each part that reads it
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            # A cut passes an activation's codes, never its dequantized values: ONNX Runtime fuses a DequantizeLinear
            # into its consumer (an integer kernel) only where both are in one part.
            pending |= closure(k)  # with the constants it reads (a scale a Reshape makes)
            continue
        own = closure(k) | pending
        pending = set()
        weights = {name for j in own for name in node_reads(order[j]) if name in inits}
        added = sum(sizes[name] for name in weights)
        if groups and held and held + added > part_bytes:
            groups.append(set())
            held = 0
        if not groups:
            groups.append(set())
        groups[-1] |= own
        held += added
    # What no node placed reads, the graph ends with: those DequantizeLinear nodes, and constant nodes whose outputs
    # only the graph's outputs (or a caller asking for them) read.
    placed = set().union(*groups) | pending
    unread = {j for k in range(len(order)) if k not in placed and order[k].output for j in closure(k)}
    if pending or unread:
        if not groups:
            groups.append(set())
        groups[-1] |= pending | unread
    parts = []
    for group in groups:
        nodes = [order[j] for j in sorted(group)]
        makes = {o for n in nodes for o in n.output if o}
        reads = list(dict.fromkeys(name for n in nodes for name in node_reads(n) if name not in makes))
        initializers = [name for name in reads if name in inits]
        outer = [name for name in reads if name not in inits]
        parts.append(Part(nodes, outer, initializers))
    return parts


class PartedSession:
    """``run(names, feeds)`` as ONNX Runtime's session gives it, for a model run in parts (see the module's text).

    ``make_options`` makes a fresh ``SessionOptions`` for each part's
    session (ONNX Runtime ties the weights given beside a graph to its
    options); ``make_session(model, options)`` makes the session of a
    part's model.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        make_options: Callable[[], Any],
        make_session: Callable[[onnx.ModelProto, Any], Any],
        part_bytes: int | None = None,
    ) -> None:
        first = make_options()
        if first.optimized_model_filepath or first.enable_profiling:
            raise QuantizationError("a model run in parts has no one optimized graph or profile: it is never held whole")
        self._model = model
        self._make_options = make_options
        self._make_session = make_session
        self.parts = cut(model.graph, part_bytes)
        self._inits = {t.name: t for t in model.graph.initializer}
        self._outputs = [o.name for o in model.graph.output]
        # What parts after part k read: what part k must hand on.
        self._read_after: list[set[str]] = []
        later: set[str] = set()
        for part in reversed(self.parts):
            self._read_after.append(set(later))
            later |= set(part.reads)
        self._read_after.reverse()

    def run(self, names: Sequence[str] | None, feeds: dict[str, Any]) -> list[Any]:
        """The tensors ``names`` (None: the graph's outputs) of the model run on ``feeds``, as numpy arrays."""
        wanted = list(self._outputs if names is None else names)
        live = {name: to_ort_value(np.asarray(a)) for name, a in feeds.items()}
        for part, read_after in zip(self.parts, self._read_after, strict=True):
            hand_on = [o for n in part.nodes for o in n.output if o and (o in read_after or o in wanted)]
            if hand_on:  # else nothing of it is read
                types = {name: _ort_type(name, live) for name in part.reads}
                session = self._make_session(self._part_model(part, hand_on, types), self._options())
                got = session.run_with_ort_values(hand_on, {name: live[name] for name in part.reads})
                del session
                live.update(zip(hand_on, got, strict=True))
            for name in [n for n in live if n not in read_after and n not in wanted]:
                del live[name]
        missing = [n for n in wanted if n not in live and n not in self._inits]
        if missing:
            raise QuantizationError(f"run: no tensor named {missing[0]!r} in the model")
        return [from_ort_value(live[n]) if n in live else _initializer_value(self._inits[n]) for n in wanted]

    def optimized(self, folder: str) -> onnx.ModelProto:
        """The graph ONNX Runtime makes of each part, their nodes in one graph, in order (weights left out).

        A part's inputs take the types shape inference gives them.

        Raises:
            QuantizationError: a tensor crossing a cut has no inferred type, or ONNX Runtime cannot load a part.
        """
        inferred = large.infer_shapes(self._model)
        g = inferred.graph
        types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info, *g.output)}
        graph = onnx.GraphProto(name=self._model.graph.name)
        graph.input.extend(self._model.graph.input)
        graph.output.extend(self._model.graph.output)
        seen: set[str] = set()
        for k, (part, read_after) in enumerate(zip(self.parts, self._read_after, strict=True)):
            outputs = [o for n in part.nodes for o in n.output if o and (o in read_after or o in self._outputs)]
            if not outputs:  # nothing of it is read: a run skips it too
                continue
            missing = [name for name in part.reads if not types.get(name)]
            if missing:
                raise QuantizationError(f"optimized graph: no type inferred for {missing[0]!r}, which crosses a cut")
            path = os.path.join(folder, f"part{k}", "optimized.onnx")
            os.makedirs(os.path.dirname(path))
            options = self._options()
            options.optimized_model_filepath = path
            options.add_session_config_entry(large.OPTIMIZED_DATA, "optimized.onnx.data")
            try:
                self._make_session(self._part_model(part, outputs, {name: types[name] for name in part.reads}), options)
            except Exception as e:  # ONNX Runtime raises its own exception types
                raise QuantizationError(f"optimized graph: ONNX Runtime cannot load part {k} of the model: {e}") from None
            got = onnx.load(path, load_external_data=False)
            graph.node.extend(got.graph.node)
            graph.initializer.extend(t for t in got.graph.initializer if t.name not in seen)
            seen |= {t.name for t in got.graph.initializer}
        model = onnx.ModelProto()
        large.copy_fields(self._model, model, skip="graph")
        model.graph.CopyFrom(graph)
        return model

    def _options(self) -> Any:
        options = self._make_options()
        options.add_session_config_entry(large.NO_PACKED_COPIES, "1")  # made for one run: no packed copy
        return options

    def _part_model(self, part: Part, outputs: list[str], types: dict[str, int]) -> onnx.ModelProto:
        """The model of ``part`` giving ``outputs``, its inputs of ``types`` (ONNX's element types)."""
        graph = helper.make_graph(
            part.nodes, self._model.graph.name, [helper.make_tensor_value_info(name, types[name], None) for name in part.reads],
            [onnx.ValueInfoProto(name=o) for o in outputs], initializer=[self._inits[name] for name in part.initializers],
        )  # fmt: skip
        model = onnx.ModelProto()
        large.copy_fields(self._model, model, skip="graph")
        model.graph.CopyFrom(graph)
        return model


def _ort_type(name: str, live: dict[str, Any]) -> int:
    """The ONNX element type of tensor ``name`` as ONNX Runtime holds it in ``live``."""
    if name not in live:
        raise QuantizationError(f"run: part of the model reads {name!r}, which no feed or earlier part gives")
    value = live[name]
    if not value.is_tensor():
        raise QuantizationError(f"run: a model run in parts passes tensors only between them; {name!r} is not one")
    return _ORT_TYPES[value.data_type()]


def _initializer_value(t: onnx.TensorProto) -> np.ndarray:
    return np.array(large.value_of(t))
