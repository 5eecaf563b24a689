"""A builder for ONNX graphs: Q/DQ nodes checked by qlinear.spec, any other operator by onnx's schemas."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Any

import numpy as np
import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type, to_tensor_proto
from qlinear.onnx._io import DEFAULT_EXTERNAL_THRESHOLD, save
from qlinear.onnx._qdq_check import QDQ_OPS, check_qdq_node
from qlinear.onnx._schema_check import check_schema_node
from qlinear.onnx._tensor_info import Dim, TensorInfo, onnx_type_enum

__all__ = ["DEFAULT_OPSET", "Graph", "names_read", "node_reads", "nodes_read", "producers", "readers"]

# The newest ai.onnx opset ONNX Runtime 1.31 runs; Graph(opset=28) builds
# newer graphs that run on the "qlinear" and "reference" backends.
DEFAULT_OPSET = 25
_MS_DOMAIN = "com.microsoft"
_MS_OPSET = 1

Tensor = str | np.ndarray | np.generic


class Graph:
    """An ONNX graph under construction; every node is checked as it is added.

    Tensors are referred to by name; the builder methods return the names of
    the outputs they create. Arrays passed where a tensor is expected become
    initializers named after the node and argument.

    >>> import numpy as np
    >>> g = Graph("q", opset=21)
    >>> x = g.input("x", "float", ("N", 4))
    >>> y = g.quantize_linear(x, np.float32(0.5), np.int8(0), name="q")
    >>> g.output(g.dequantize_linear(y, np.float32(0.5), np.int8(0), output_names=["x_hat"]))
    >>> [n.op_type for n in g.to_model().graph.node]
    ['QuantizeLinear', 'DequantizeLinear']
    """

    def __init__(self, name: str = "qlinear", *, opset: int = DEFAULT_OPSET) -> None:
        if not isinstance(opset, int) or isinstance(opset, bool) or not 1 <= opset <= onnx.defs.onnx_opset_version():
            raise QuantizationError(f"Graph: opset must be an int in [1, {onnx.defs.onnx_opset_version()}], got {opset!r}")
        self.name = name
        self.opset = opset
        self._info: dict[str, TensorInfo] = {}
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._initializers: dict[str, onnx.TensorProto] = {}
        self._small_constants: dict[str, onnx.TensorProto] = {}
        self._nodes: list[onnx.NodeProto] = []
        self._node_names: set[str] = set()
        self._domains = {"": opset}

    def info(self, name: str) -> TensorInfo:
        """Element type and shape of tensor ``name`` as the graph knows them."""
        if name not in self._info:
            raise QuantizationError(f"Graph.info: no tensor named {name!r} in graph {self.name!r}")
        return self._info[name]

    def input(self, name: str, dtype: Any, shape: Sequence[Dim] | None) -> str:
        """Declare a graph input of element type ``dtype`` and (symbolic) ``shape``; returns ``name``."""
        self._define(
            name, TensorInfo(onnx_type_enum(dtype, what=f"Graph.input: {name!r} dtype"), _shape(shape, name)), "Graph.input"
        )
        self._inputs.append(name)
        return name

    def initializer(self, name: str, array: Any) -> str:
        """Add a constant holding ``array`` (any type qlinear knows, packed as ONNX stores it); returns ``name``."""
        array = np.asarray(array) if isinstance(array, np.generic) else array
        if not isinstance(array, np.ndarray):
            raise QuantizationError(f"Graph.initializer: {name!r} must be a numpy array, got {type(array).__name__}")
        try:
            proto = to_tensor_proto(array, name)
        except QuantizationError:
            # int64 shapes, bool masks and other types that are no quantization type.
            proto = onnx.numpy_helper.from_array(array, name)
        self._define(name, TensorInfo(proto.data_type, tuple(array.shape)), "Graph.initializer")
        self._initializers[name] = proto
        if _is_small_int(array):
            # Shape inference of Reshape, Slice and friends needs these values.
            self._small_constants[name] = proto
        return name

    def output(self, name: str, dtype: Any = None, shape: Sequence[Dim] | None = None) -> None:
        """Make tensor ``name`` a graph output; its type and shape default to what the graph inferred."""
        known = self.info(name)
        elem = onnx_type_enum(dtype, what=f"Graph.output: {name!r} dtype") if dtype is not None else known.elem_type
        if known.elem_type and elem != known.elem_type:
            raise QuantizationError(f"Graph.output: {name!r} has type {known.type_name}, got dtype={dtype!r}")
        self._info[name] = TensorInfo(elem, _shape(shape, name) if shape is not None else known.shape)
        self._outputs.append(name)

    def quantize_linear(
        self,
        x: Tensor,
        y_scale: Tensor,
        y_zero_point: Tensor | None = None,
        *,
        axis: int = 1,
        block_size: int = 0,
        output_dtype: Any = None,
        saturate: bool = True,
        precision: Any = None,
        domain: str = "",
        name: str | None = None,
        output_names: Sequence[str] | None = None,
    ) -> str:
        """Add a QuantizeLinear node; arguments as :func:`qlinear.quantize_linear`. Returns the output's name.

        Raises:
            QuantizationError: the function's message for anything the
                graph's opset does not allow, prefixed by the node's name.
        """
        attrs = {
            "block_size": block_size,
            "output_dtype": _enum(output_dtype, "output_dtype"),
            "saturate": int(saturate) if isinstance(saturate, (bool, int, np.bool_, np.integer)) else saturate,
            "precision": _enum(precision, "precision"),
        }
        return self._qdq("QuantizeLinear", [x, y_scale, y_zero_point], axis, attrs, {"saturate": 1}, domain, name, output_names)

    def dequantize_linear(
        self,
        x: Tensor,
        x_scale: Tensor,
        x_zero_point: Tensor | None = None,
        *,
        axis: int = 1,
        block_size: int = 0,
        output_dtype: Any = None,
        domain: str = "",
        name: str | None = None,
        output_names: Sequence[str] | None = None,
    ) -> str:
        """Add a DequantizeLinear node; arguments as :func:`qlinear.dequantize_linear`. Returns the output's name."""
        attrs = {"block_size": block_size, "output_dtype": _enum(output_dtype, "output_dtype")}
        return self._qdq("DequantizeLinear", [x, x_scale, x_zero_point], axis, attrs, {}, domain, name, output_names)

    def dynamic_quantize_linear(
        self, x: Tensor, *, name: str | None = None, output_names: Sequence[str] | None = None
    ) -> tuple[str, str, str]:
        """Add a DynamicQuantizeLinear node; returns the names of ``(y, y_scale, y_zero_point)``."""
        return self._add("DynamicQuantizeLinear", [x], {}, "", name, output_names, 3)

    def op(
        self,
        op_type: str,
        inputs: Sequence[Tensor | None],
        *,
        name: str | None = None,
        output_names: Sequence[str] | None = None,
        num_outputs: int = 1,
        domain: str = "",
        **attrs: Any,
    ) -> str | tuple[str, ...]:
        """Add any operator the onnx package has a schema for (``graph.op("Conv", [x, w], pads=[1, 1, 1, 1])``).

        Inputs are names, arrays (they become initializers) or None for an
        omitted optional input. Returns the output name, or a tuple of names
        when the node has several outputs.

        Raises:
            QuantizationError: no such operator at the graph's opset, an
                attribute the schema lacks or misses, a wrong number of
                inputs or outputs, or a type the schema rejects.
        """
        out = self._add(op_type, list(inputs), attrs, domain, name, output_names, num_outputs)
        return out[0] if len(out) == 1 else out

    def to_model(self) -> onnx.ModelProto:
        """The graph as a ModelProto that passes ``onnx.checker.check_model(m, full_check=True)``.

        Raises:
            QuantizationError: the graph has no outputs.
        """
        if not self._outputs:
            raise QuantizationError(f"Graph.to_model: graph {self.name!r} has no outputs; declare them with Graph.output")
        model = onnx.ModelProto()
        imports = [helper.make_opsetid(d, v) for d, v in self._domains.items()]
        model.opset_import.extend(imports)
        model.ir_version = helper.find_min_ir_version_for(imports, ignore_unknown=True)
        model.producer_name = "qlinear"
        g = model.graph
        g.name = self.name
        g.node.extend(self._nodes)
        g.input.extend(self._info[n].value_info(n) for n in self._inputs)
        g.output.extend(self._info[n].value_info(n) for n in self._outputs)
        g.initializer.extend(self._initializers.values())
        ends = set(self._inputs) | set(self._outputs) | set(self._initializers)
        # Intermediate types let runtimes and inference see through com.microsoft nodes.
        g.value_info.extend(i.value_info(n) for n, i in self._info.items() if n not in ends and i.elem_type)
        return model

    def save(self, path: str | PathLike[str], *, external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD) -> None:
        """Write the model to ``path``; tensors of at least ``external_threshold`` bytes go to ``path + ".data"``."""
        save(self.to_model(), path, external_threshold=external_threshold)

    def _qdq(
        self,
        op: str,
        inputs: list[Tensor | None],
        axis: int,
        attrs: dict[str, Any],
        defaults: dict[str, Any],
        domain: str,
        name: str | None,
        output_names: Sequence[str] | None,
    ) -> str:
        # Like the functions, an axis only matters for per-axis and blocked
        # scales; writing it only then keeps opset-10 graphs valid.
        written = {k: v for k, v in attrs.items() if v is not None and v != defaults.get(k, 0)}
        scale = inputs[1]
        scale_shape = (
            np.shape(scale) if not isinstance(scale, str) else (self._info[scale].shape if scale in self._info else None)
        )
        if attrs.get("block_size") or (scale_shape and any(d != 1 for d in scale_shape)):
            written["axis"] = axis
        return self._add(op, inputs, written, domain, name, output_names, 1)[0]

    def _add(
        self,
        op_type: str,
        inputs: list[Tensor | None],
        attrs: dict[str, Any],
        domain: str,
        name: str | None,
        output_names: Sequence[str] | None,
        num_outputs: int,
    ) -> tuple[str, ...]:
        name = name if name is not None else f"{op_type}_{len(self._nodes)}"
        if name in self._node_names:
            raise QuantizationError(f"Graph: node {name!r}: the graph already has a node with this name")
        pending: dict[str, np.ndarray] = {}
        names = [self._tensor(v, f"{name}_input{i}", name, pending) for i, v in enumerate(inputs)]
        while names and names[-1] == "":
            names.pop()
        outputs = (
            list(output_names)
            if output_names is not None
            else [f"{name}_output{i}" if num_outputs > 1 else f"{name}_output" for i in range(num_outputs)]
        )
        node = helper.make_node(op_type, names, outputs, name=name, domain=domain or None, **attrs)
        known = ChainMap({n: TensorInfo.of_array(a) for n, a in pending.items()}, self._info)
        infos = [known[n] if n else None for n in names]
        opset = self._domain_opset(domain, name)
        if op_type in QDQ_OPS and domain in ("", _MS_DOMAIN):
            checked = check_qdq_node(
                op_type, opset, domain, {a.name: helper.get_attribute_value(a) for a in node.attribute}, infos, name
            )
            out_infos = checked.outputs
            if len(outputs) != len(out_infos):
                raise QuantizationError(
                    f"Graph: node {name!r} ({op_type}): output_names must name {len(out_infos)} outputs, got {len(outputs)}"
                )
        else:
            constants = {n: self._small_constants[n] for n in names if n in self._small_constants}
            constants.update({n: onnx.numpy_helper.from_array(a, n) for n, a in pending.items() if _is_small_int(a)})
            out_infos = check_schema_node(node, opset, {n: known[n] for n in names if n}, constants)
        # Only a node that passed its checks leaves anything in the graph.
        for n, a in pending.items():
            self.initializer(n, a)
        for out, info in zip(outputs, out_infos, strict=True):
            self._define(out, info, f"Graph: node {name!r}")
        self._nodes.append(node)
        self._node_names.add(name)
        if domain:
            self._domains[domain] = opset
        return tuple(outputs)

    def _domain_opset(self, domain: str, node: str) -> int:
        if domain in self._domains:
            return self._domains[domain]
        if domain == _MS_DOMAIN:
            return _MS_OPSET
        raise QuantizationError(f"Graph: node {node!r}: domain must be '' (ai.onnx) or {_MS_DOMAIN!r}, got {domain!r}")

    def _tensor(self, value: Tensor | None, default_name: str, node: str, pending: dict[str, np.ndarray]) -> str:
        """The name of an input: a known tensor, or a new name in ``pending`` for an array."""
        if value is None:
            return ""
        if isinstance(value, str):
            if value not in self._info:
                raise QuantizationError(
                    f"Graph: node {node!r}: input {value!r} is no graph input, initializer or output of an earlier node"
                )
            return value
        if not isinstance(value, (np.ndarray, np.generic)):
            raise QuantizationError(
                f"Graph: node {node!r}: inputs must be tensor names or numpy arrays, got {type(value).__name__}"
            )
        new = self._fresh(default_name)
        pending[new] = np.asarray(value)
        return new

    def _fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self._info:
            name, i = f"{base}_{i}", i + 1
        return name

    def _define(self, name: str, info: TensorInfo, caller: str) -> None:
        if not name:
            raise QuantizationError(f"{caller}: tensor names must not be empty")
        if name in self._info:
            raise QuantizationError(f"{caller}: tensor {name!r} is already defined in graph {self.name!r}")
        self._info[name] = info


def _shape(shape: Sequence[Dim] | None, name: str) -> tuple[Dim, ...] | None:
    if shape is None:
        return None
    dims = tuple(shape)
    for d in dims:
        if not (d is None or isinstance(d, str) or (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0)):
            raise QuantizationError(f"Graph: shape of {name!r} must hold sizes >= 0, names or None, got {shape!r}")
    return tuple(int(d) if isinstance(d, np.integer) else d for d in dims)


def _is_small_int(a: np.ndarray) -> bool:
    return a.size <= 64 and a.dtype.kind in "iu"


def _enum(value: Any, arg: str) -> int | None:
    if value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0):
        return None
    return element_type(value, what=f"Graph: {arg}").onnx_enum


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Each tensor name a node of ``graph`` writes, and that node."""
    return {name: node for node in graph.node for name in node.output}


def readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each tensor name and the nodes of ``graph`` that read it, in graph order."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name the graph's nodes read, those of its subgraphs (If, Loop, Scan bodies) included, and its outputs.

    A subgraph may read a tensor of the graph around it by name alone, an
    initializer among them: a pass that drops the initializers nothing reads
    must count those reads too.
    """
    return {o.name for o in graph.output} | nodes_read(graph.node)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The names ``node`` reads from the graph around it: its inputs, then what its subgraphs read of that graph.

    Unlike :func:`nodes_read`, a name a subgraph makes itself (its nodes'
    outputs, its inputs and initializers) is not one: it is no value of the
    graph the node is in.
    """
    found = [i for i in node.input if i]
    for a in node.attribute:
        for sub in (a.g,) if a.type == onnx.AttributeProto.GRAPH else a.graphs:
            own = {t.name for t in sub.initializer} | {i.name for i in sub.input} | {o for n in sub.node for o in n.output}
            found += [name for name in [*(r for n in sub.node for r in node_reads(n)), *(o.name for o in sub.output)]
                      if name not in own]  # fmt: skip
    return list(dict.fromkeys(found))


def nodes_read(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Every tensor name ``nodes`` read, inside their subgraphs too (see :func:`names_read`)."""
    found: set[str] = set()
    for node in nodes:
        found.update(i for i in node.input if i)
        for a in node.attribute:
            for sub in (a.g,) if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                found |= names_read(sub)
    return found
