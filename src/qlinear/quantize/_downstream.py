"""The part of a model that a change reaches: what the per-node analysis runs instead of the whole model.

A model with one node quantized computes what the float model computes
everywhere but downstream of that node. :func:`downstream` cuts the
changed model to the nodes its changes reach (new or rewritten nodes,
nodes reading a rewritten initializer, and every node after them), with
the float model's values of what those nodes read from outside as the
part's inputs. Run on those values, the part gives the changed model's
outputs: the float model's values are computed once for all the nodes
analysed, and each node runs only the part of the graph after it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from qlinear.onnx._graph import node_reads

__all__ = ["Downstream", "Unchanged", "downstream", "element_types"]


@dataclass(frozen=True)
class Downstream:
    """The nodes a change reaches, the float values they read from outside, and the judged outputs they make.

    ``reads``: tensors of the float model the part takes as inputs (graph
    inputs among them); ``outputs``: the judged outputs it computes (none:
    the change reaches no judged output, which stays the float model's).
    """

    nodes: tuple[onnx.NodeProto, ...]
    initializers: tuple[onnx.TensorProto, ...]
    reads: tuple[str, ...]
    outputs: tuple[str, ...]
    opset_import: tuple[onnx.OperatorSetIdProto, ...]
    functions: tuple[onnx.FunctionProto, ...]
    ir_version: int

    def model(self, types: dict[str, int]) -> onnx.ModelProto:
        """The part as a model whose inputs are ``reads``, of ``types`` (tensor name -> ONNX element type)."""
        inputs = [helper.make_tensor_value_info(name, types[name], None) for name in self.reads]
        graph = helper.make_graph(
            list(self.nodes), "downstream", inputs, [onnx.ValueInfoProto(name=o) for o in self.outputs], list(self.initializers)
        )
        model = helper.make_model(graph, opset_imports=list(self.opset_import), functions=list(self.functions))
        model.ir_version = self.ir_version
        return model


@dataclass(frozen=True)
class Unchanged:
    """The float model's nodes and initializers, serialized once for every changed model compared with it."""

    nodes: frozenset[bytes]
    initializers: dict[str, bytes]

    @classmethod
    def of(cls, float_model: onnx.ModelProto) -> Unchanged:
        g = float_model.graph
        return cls(frozenset(n.SerializeToString() for n in g.node), {t.name: t.SerializeToString() for t in g.initializer})


def downstream(changed: onnx.ModelProto, unchanged: Unchanged, outputs: list[str]) -> Downstream:
    """The part of ``changed`` that differs from the float model (``unchanged``, at the same opset) and what follows it.

    ``outputs``: the judged outputs; the part computes those it reaches.
    """
    g = changed.graph
    known, before = unchanged.nodes, unchanged.initializers
    initializers = {t.name: t for t in g.initializer}
    rewritten = {name for name, t in initializers.items() if name in before and before[name] != t.SerializeToString()}
    reads = [node_reads(n) for n in g.node]
    readers: dict[str, list[int]] = defaultdict(list)
    for k, names in enumerate(reads):
        for name in names:
            readers[name].append(k)
    stack = [k for k, n in enumerate(g.node) if n.SerializeToString() not in known or rewritten.intersection(reads[k])]
    reached: set[int] = set()
    while stack:
        k = stack.pop()
        if k not in reached:
            reached.add(k)
            stack.extend(r for o in g.node[k].output if o for r in readers.get(o, ()))
    # A constant a reached node reads comes with it, not as an input (it costs nothing to compute again).
    constants = {o: k for k, n in enumerate(g.node) if not reads[k] for o in n.output}
    reached |= {constants[name] for k in reached for name in reads[k] if name in constants}
    made = {o for k in reached for o in g.node[k].output if o}
    read = list(dict.fromkeys(name for k in sorted(reached) for name in reads[k] if name not in made))
    return Downstream(
        nodes=tuple(g.node[k] for k in sorted(reached)),
        initializers=tuple(initializers[name] for name in read if name in initializers),
        reads=tuple(name for name in read if name not in initializers),
        outputs=tuple(o for o in outputs if o in made),
        opset_import=tuple(changed.opset_import),
        functions=tuple(changed.functions),
        ir_version=changed.ir_version,
    )


def element_types(values: dict[str, np.ndarray]) -> dict[str, int]:
    """The ONNX element type of each array."""
    return {name: helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype) for name, v in values.items()}
