"""ONNX Runtime for the graph, qlinear for the Q/DQ nodes it has no kernel for (``backend="onnxruntime+qlinear"``).

Two steps, chosen by what they cost:

- **Fold**: a Q/DQ node of such a type whose inputs are all constants (a
  weight's DequantizeLinear, the common case: int2, float4, float6
  weights) is computed once by qlinear when the runner is built, and its
  output becomes an initializer. A weight-only model then runs as one ONNX
  Runtime session.
- **Split**: the Q/DQ nodes left (activations of such types) cut the graph
  into segments, in graph order. Each run of other nodes is one ONNX
  Runtime session over that part of the graph (built once, at the first
  call); each cut node runs on qlinear's operators in between.

Which Q/DQ nodes ONNX Runtime runs: DequantizeLinear of 8- and 16-bit
integers with float32 scales in the ai.onnx domain, where its results are
the specification's bit for bit (`qlinear conformance`). Every other Q/DQ
node runs on qlinear: QuantizeLinear of every type (ONNX Runtime maps NaN
to another code than the specification, and float8's -0 to +0),
int32 DequantizeLinear (it rounds values beyond 2**24 otherwise), float8,
int4, int2, float4, float6, float8e8m0, 16-bit float scales, com.microsoft,
and any whose types inference cannot tell. Sessions run with graph
optimizations off, as the ``"onnxruntime"`` backend does, so Q/DQ nodes are
computed as the graph says. A segment ONNX Runtime will not load (an opset
newer than it knows) runs on onnx's reference evaluator with qlinear's
operators, as ``"qlinear"`` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from qlinear.dtypes import element_type, from_tensor_proto, to_tensor_proto
from qlinear.onnx._graph import node_reads, nodes_read
from qlinear.onnx._ort_values import from_ort_value, to_ort_value
from qlinear.onnx._qdq_check import QDQ_OPS
from qlinear.onnx._qlinear_nodes import QLINEAR_OPS, run_node

__all__ = ["MixedRunner"]

# Code types whose DequantizeLinear ONNX Runtime runs here.
_ORT_TYPES = frozenset({TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16})


class MixedRunner:
    """A model prepared once for ``onnxruntime+qlinear``, then run on any number of feeds."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._opsets = {o.domain or "": o.version for o in model.opset_import}
        self._ir_version = model.ir_version
        self._opset_import = list(model.opset_import)
        types = _tensor_types(model)
        graph = model.graph
        constants = {t.name: t for t in graph.initializer}
        values: dict[str, np.ndarray] = {}
        self.folded: list[str] = []
        kept: list[onnx.NodeProto] = []
        for node in graph.node:
            on_qlinear = _on_qlinear(node, types)
            if on_qlinear and node.op_type != "DynamicQuantizeLinear" and all(not i or i in constants for i in node.input):
                outputs = self._run_node(node, [_constant(constants[i], values) if i else None for i in node.input])
                for name, out in zip(node.output, outputs, strict=False):
                    values[name] = out
                    constants[name] = to_tensor_proto(out, name)
                self.folded.append(node.name or node.op_type)
            else:
                kept.append(node)
        used = nodes_read(kept) | {o.name for o in graph.output}  # subgraphs read outer initializers by name
        self._initializers = {name: t for name, t in constants.items() if name in used}
        self._graph_outputs = [o.name for o in graph.output]
        self._graph_inputs = [i.name for i in graph.input if i.name not in constants]
        # Segments, in graph order: ("ort", [nodes]) or ("qlinear", node).
        self._steps: list[tuple[str, Any]] = []
        for node in kept:
            if _on_qlinear(node, types):
                self._steps.append(("qlinear", node))
            elif self._steps and self._steps[-1][0] == "ort":
                self._steps[-1][1].append(node)
            else:
                self._steps.append(("ort", [node]))
        self.cut = [n.name or n.op_type for kind, n in self._steps if kind == "qlinear"]
        self._sessions: dict[int, tuple[Any, list[str], list[str]]] = {}
        self._arrays: dict[str, np.ndarray] = dict(values)  # constants as arrays, converted once
        self.on_reference: list[int] = []  # segments ONNX Runtime would not load

    def __call__(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = list(output_names) if output_names is not None else self._graph_outputs
        env: dict[str, np.ndarray] = {n: np.asarray(feeds[n]) for n in self._graph_inputs}
        constants = self._initializers
        for k, (kind, payload) in enumerate(self._steps):
            if kind == "qlinear":
                node = payload
                args = [self._value(i, env, constants) if i else None for i in node.input]
                for name, out in zip(node.output, self._run_node(node, args), strict=False):
                    env[name] = out
            else:
                session, inputs, outputs = self._session(k, payload, env)
                if isinstance(session, ReferenceEvaluator):
                    got = session.run(outputs, {n: env[n] for n in inputs})
                    env.update(zip(outputs, got, strict=True))
                else:
                    got = session.run_with_ort_values(outputs, {n: to_ort_value(env[n]) for n in inputs})
                    env.update({n: from_ort_value(v) for n, v in zip(outputs, got, strict=True)})
        return {n: env[n] if n in env else _constant(constants[n], self._arrays) for n in names}

    def _value(self, name: str, env: dict[str, np.ndarray], constants: dict[str, TensorProto]) -> np.ndarray:
        return env[name] if name in env else _constant(constants[name], self._arrays)

    def _run_node(self, node: onnx.NodeProto, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return run_node(node, self._opsets.get(node.domain or "", 1), inputs)

    def _session(self, k: int, nodes: list[onnx.NodeProto], env: dict[str, np.ndarray]):
        """The ONNX Runtime session of segment ``k``, its inputs and outputs (built at the first call)."""
        if k in self._sessions:
            return self._sessions[k]
        import onnxruntime as ort

        produced = {o for n in nodes for o in n.output if o}
        # A node's subgraphs (an If's sides) read values of this graph by name: they are the segment's inputs too.
        read = list(dict.fromkeys(i for n in nodes for i in node_reads(n) if i not in produced))
        inputs = [i for i in read if i not in self._initializers]
        later = {i for kind, p in self._steps[k + 1 :] for n in ([p] if kind == "qlinear" else p) for i in node_reads(n)}
        outputs = [o for n in nodes for o in n.output if o and (o in later or o in self._graph_outputs)]
        graph = helper.make_graph(
            nodes,
            f"segment_{k}",
            [_input_info(i, env[i]) for i in inputs],
            [onnx.ValueInfoProto(name=o) for o in outputs],
            initializer=[self._initializers[i] for i in read if i in self._initializers],
        )
        model = helper.make_model(graph, opset_imports=self._opset_import, ir_version=self._ir_version)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        if any(kind == "qlinear" for kind, _ in self._steps):
            # ONNX Runtime's idle threads spin for a while after each run, on the cores the qlinear kernels
            # between segments need: the character transformer of benchmarks/quantizers.py with float8 weights
            # and activations, batch 64, took 0.88 of the time without the spinning (median of 8 pairs of
            # processes). A model that is one session (weights folded, nothing cut) keeps it: its runs are
            # faster with it (digits CNN, float4 weights: 0.60 against 0.82 ms).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # ONNX Runtime raises its own exception types
            # A segment ONNX Runtime will not load (an opset newer than it knows, an operator it lacks) runs
            # as backend="qlinear" runs it: onnx's reference evaluator with qlinear's Q/DQ operators.
            session = ReferenceEvaluator(model, new_ops=QLINEAR_OPS)
            self.on_reference.append(k)
        self._sessions[k] = (session, inputs, outputs)
        return self._sessions[k]


def _input_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    """An input of any shape of ``value``'s type (the segment serves every batch size)."""
    try:  # numpy's own types (int64 token ids, bool masks, ...)
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    except (KeyError, TypeError, ValueError):  # ml_dtypes' (int4, float8, ...)
        elem = element_type(value.dtype, what="run: value dtype").onnx_enum
    return helper.make_tensor_value_info(name, elem, [None] * value.ndim)


def _constant(t: TensorProto, cache: dict[str, np.ndarray]) -> np.ndarray:
    if t.name not in cache:
        cache[t.name] = from_tensor_proto(t)
    return cache[t.name]


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every tensor shape inference can tell."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference helps; a tensor it cannot type runs on qlinear
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _on_qlinear(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """Whether a node is a Q/DQ node ONNX Runtime does not run here (see the module's text)."""
    if node.op_type not in QDQ_OPS:
        return False
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return True  # QuantizeLinear: ONNX Runtime maps NaN elsewhere than the specification (conformance suites)
    if any(a.name in ("output_dtype", "precision") for a in node.attribute):
        return True
    scale = types.get(node.input[1]) if len(node.input) > 1 else None
    return scale != TensorProto.FLOAT or types.get(node.input[0]) not in _ORT_TYPES
