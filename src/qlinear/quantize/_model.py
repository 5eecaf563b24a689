"""The load pass: a float model read, checked and indexed for the passes after it.

Weights held in ``Constant`` nodes become initializers here, so every later
pass sees one kind of constant (exporters write them either way, and a
quantizer that looks only at initializers leaves such weights in float).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx._graph import names_read
from qlinear.onnx._io import load_mapped

__all__ = [
    "attribute", "clip_bounds", "FloatModel", "fresh_name", "index", "load_float_model", "reserve_name", "scalar_constant",
]  # fmt: skip

# Models of this many bytes or more keep their big initializers' values in a store, out of the graph:
# copies of the graph then cost the graph alone, and a model past protobuf's 2 GiB is never serialized whole.
STORE_THRESHOLD = 1 << 30

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclass
class FloatModel:
    """A float model and the indices the passes read: producers, consumers, constants, types.

    ``model`` is the caller's model with Constant nodes folded into
    initializers (a copy: the caller's model is never modified).
    """

    model: onnx.ModelProto
    digest: str
    # Where the values of a large model's big initializers live (its initializers are markers then); None: inline.
    store: large.TensorStore | None = None
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=lambda: defaultdict(list))
    initializers: dict[str, TensorProto] = field(default_factory=dict)
    elem_types: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, tuple] = field(default_factory=dict)
    nodes: dict[str, onnx.NodeProto] = field(default_factory=dict)  # by name
    # Tensors of the graph that a subgraph (an If branch, a Loop body) reads by name: readers no QDQ layout reaches.
    read_in_subgraphs: set[str] = field(default_factory=set)
    # The nodes of the model as given that the target's prepare passes folded into others (a BatchNormalization into
    # its Conv): an exclude pattern may name them, and they are float where their node is.
    folded: set[str] = field(default_factory=set)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    @property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 0)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.graph.input if i.name not in self.initializers]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.graph.output]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of initializer ``name``, or None if it is not a constant."""
        t = self.initializers.get(name)
        return None if t is None else large.value_of(t)

    def set_constant(self, name: str, value: np.ndarray) -> None:
        """Give initializer ``name`` the value ``value`` (kept in the store where the model has one)."""
        t = self.initializers[name]
        if self.store is not None and large.is_marker(t):
            t.CopyFrom(self.store.marker(name, value))
        else:
            t.CopyFrom(numpy_helper.from_array(value, name))

    def is_float(self, name: str) -> bool:
        return self.elem_types.get(name, TensorProto.FLOAT) in _FLOAT_TYPES

    def producer_output(self, node_name: str) -> str:
        """The first output of node ``node_name``."""
        return self.nodes[node_name].output[0]

    def node(self, name: str) -> onnx.NodeProto:
        return self.nodes[name]

    def node_inputs(self, name: str) -> list[str]:
        return list(self.nodes[name].input)

    def size_bytes(self) -> int:
        return large.byte_size(self.model)


def load_float_model(model: onnx.ModelProto | str | PathLike[str]) -> FloatModel:
    """Read ``model`` (a path or a ModelProto), fold its Constant nodes and index it.

    Raises:
        QuantizationError: the file is missing, not ONNX or truncated; the
            model has no graph, no nodes or a node without an op type.
    """
    store: large.TensorStore | None = large.TensorStore()
    if isinstance(model, (str, PathLike)):
        path = Path(model)
        if path.is_dir():
            raise QuantizationError(f"quantize: model {path} is a directory, expected an .onnx file")
        proto = load_mapped(path, store)
        if large.byte_size(proto) < STORE_THRESHOLD:
            proto, store = large.inline(proto), None
    elif isinstance(model, onnx.ModelProto):
        if large.byte_size(model) >= STORE_THRESHOLD:
            proto = large.into_store(model, store)
        else:
            proto, store = onnx.ModelProto(), None
            proto.CopyFrom(model)
    else:
        raise QuantizationError(f"quantize: model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    if not proto.graph.node:
        raise QuantizationError("quantize: the model's graph has no nodes")
    digest = large.digest(proto)  # of the model as given, before its Constant nodes are folded
    _fold_constants(proto.graph)
    fm = FloatModel(proto, digest, store)
    index(fm)
    return fm


def _fold_constants(graph: onnx.GraphProto) -> None:
    """Turn each tensor-valued Constant node into an initializer of the same name."""
    keep = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            attr = node.attribute[0]
            value = None
            if attr.name == "value":
                value = numpy_helper.to_array(attr.t)
            elif attr.name in ("value_float", "value_int"):
                value = np.array(
                    attr.f if attr.name == "value_float" else attr.i, np.float32 if attr.name == "value_float" else np.int64
                )
            elif attr.name in ("value_floats", "value_ints"):
                value = np.array(
                    attr.floats if attr.name == "value_floats" else attr.ints,
                    np.float32 if attr.name == "value_floats" else np.int64,
                )
            if value is not None:
                graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
                continue
        keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def index(fm: FloatModel) -> None:
    """(Re)build ``fm``'s indices from its graph; nodes without a name get one."""
    g = fm.graph
    fm.producer, fm.consumers, fm.elem_types, fm.shapes = {}, defaultdict(list), {}, {}
    taken = {n.name for n in g.node}
    for i, node in enumerate(g.node):
        if not node.name:  # every pass and the report name nodes; unnamed ones get the op type and position
            candidates = itertools.chain([f"{node.op_type}_{i}"], (f"{node.op_type}_{i}_{k}" for k in itertools.count(1)))
            node.name = next(n for n in candidates if n not in taken)
            taken.add(node.name)
    fm.initializers = {t.name: t for t in g.initializer}
    try:
        inferred = large.infer_shapes(fm.model, data_prop=True)
    except Exception:  # inference is a help, not a requirement: unknown types default to float
        inferred = fm.model
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tt = vi.type.tensor_type
        fm.elem_types[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            fm.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    for t in g.initializer:
        fm.elem_types[t.name] = t.data_type
        fm.shapes[t.name] = tuple(t.dims)
    fm.nodes = {node.name: node for node in g.node}
    for node in g.node:
        if not node.op_type:
            raise QuantizationError(f"quantize: node {node.name!r} has no op type")
        for o in node.output:
            if o:
                fm.producer[o] = node
        for i in node.input:
            if i:
                fm.consumers[i].append(node)
    subgraphs = [
        a_g for node in g.node for a in node.attribute for a_g in ((a.g,) if a.type == onnx.AttributeProto.GRAPH else a.graphs)
    ]
    outer = set(fm.producer) | set(fm.initializers) | {i.name for i in g.input}
    fm.read_in_subgraphs = outer & set().union(*(names_read(sub) for sub in subgraphs)) if subgraphs else set()


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def reserve_name(base: str, taken: set[str]) -> str:
    """:func:`fresh_name`, added to ``taken``: for a pass that names several new tensors and nodes in a row."""
    name = fresh_name(base, taken)
    taken.add(name)
    return name


def scalar_constant(name: str, inits: dict[str, TensorProto]) -> float | None:
    """The value of a one-element float initializer ``name``, or None (not an initializer, not one float)."""
    t = inits.get(name)
    if t is None:
        return None
    v = numpy_helper.to_array(t)
    return float(v.reshape(-1)[0]) if v.size == 1 and np.issubdtype(v.dtype, np.floating) else None


def clip_bounds(clip: onnx.NodeProto, inits: dict[str, TensorProto]) -> tuple[float | None, float | None]:
    """A Clip's constant bounds (its inputs from opset 11, its attributes before); None where one is not a constant."""
    if len(clip.input) == 1 and any(a.name in ("min", "max") for a in clip.attribute):
        return attribute(clip, "min"), attribute(clip, "max")
    bounds = [scalar_constant(clip.input[k], inits) if len(clip.input) > k and clip.input[k] else None for k in (1, 2)]
    return bounds[0], bounds[1]


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of ``node`` as a Python value, or ``default`` where the node does not set it."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
