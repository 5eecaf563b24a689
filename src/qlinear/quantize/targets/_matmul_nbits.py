"""The MatMulNBits form: blocked weight-only MatMuls written as ONNX Runtime's own ``com.microsoft.MatMulNBits``.

ONNX Runtime fuses a blocked 2/4/8-bit DequantizeLinear of a constant
``(K, N)`` weight into the MatMul (or the untransposed Gemm) that reads it:
one MatMulNBits whose weight is the codes transposed to ``(N, blocks,
bytes a block)``, as unsigned codes packed lowest bits first, its scales
``(N, blocks)`` and its zero points packed the same way a column. Some
runtimes and tools read only that form. This pass writes it from the QDQ
model: the same codes, scales and zero points, so the node computes what
the QDQ form computes (a signed code ``c`` of zero point ``z`` is the
unsigned code ``c + 2**(bits-1)`` of zero point ``z + 2**(bits-1)``: the
same ``c - z``). Its ``accuracy_level`` is the one the QDQ form was
measured at (0, its input float as the QDQ model says, unless the
quantizer found level 4 faster: :mod:`qlinear.quantize._run_settings`),
so it needs no session setting where the model runs.

A MatMulNBits takes a block size that is a power of two of 16 or more;
other blocks, weights read by other nodes, and every other DequantizeLinear
stay in the QDQ form.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qlinear.dtypes import ElementType, element_type, from_tensor_proto, pack, to_tensor_proto
from qlinear.onnx._graph import producers, readers
from qlinear.onnx._large import is_marker, value_of
from qlinear.quantize._qdq_names import CODES
from qlinear.quantize._session import nbits_level

__all__ = [
    "CONTRIB_DOMAIN",
    "blocked_matmuls",
    "packed_codes",
    "packed_zero_points",
    "streamed_to_matmul_nbits",
    "to_matmul_nbits",
]

CONTRIB_DOMAIN = "com.microsoft"
_CODES = {TensorProto.INT2, TensorProto.UINT2, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT8, TensorProto.UINT8}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def blocked_matmuls(model: onnx.ModelProto) -> list[str]:
    """The MatMuls (and plain Gemms) of ``model`` that ONNX Runtime runs as MatMulNBits: written so, or fused from Q/DQ."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    made, reading = producers(graph), readers(graph)
    return [
        n.name
        for n in graph.node
        if (n.op_type == "MatMulNBits" and n.domain == CONTRIB_DOMAIN) or _weight_dequantize(n, made, reading, inits)
    ]


def to_matmul_nbits(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s blocked DequantizeLinear -> MatMul (and plain Gemm) pairs into MatMulNBits; how many.

    Their accuracy level is the one the model says it runs at (0 unless
    the quantizer chose another by speed: :func:`qlinear.quantize._session.nbits_level`).
    """
    graph, level = model.graph, nbits_level(model)
    inits = {t.name: t for t in graph.initializer}
    made, reading = producers(graph), readers(graph)
    done, packed_for = 0, {}  # a weight's codes and parameters -> its packed tensors' names (shared by its readers)
    for node in list(graph.node):
        dq = _weight_dequantize(node, made, reading, inits)
        if dq is None:
            continue
        codes = inits[dq.input[0]]
        block = next(a.i for a in dq.attribute if a.name == "block_size")
        bits = element_type(codes.data_type).bits
        key = (*dq.input, block)  # a shared weight has a DequantizeLinear a reader, all of the same tensors
        if key not in packed_for:
            zero_point = inits[dq.input[2]] if len(dq.input) > 2 and dq.input[2] else None
            packed, scales, zero_points, _ = _packed(codes, inits[dq.input[1]], zero_point, block)
            stem = _stem(codes.name)
            new = [to_tensor_proto(packed, f"{stem}_nbits"), to_tensor_proto(scales, f"{stem}_nbits_scale")]
            if zero_points is not None:
                new.append(to_tensor_proto(zero_points, f"{stem}_nbits_zp"))
            graph.initializer.extend(new)
            packed_for[key] = [t.name for t in new]
        inputs = [node.input[0], *packed_for[key]]
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            inputs += [""] * (5 - len(inputs)) + [node.input[2]]  # MatMulNBits' bias is its input 5
        k, n = codes.dims
        nbits = helper.make_node(
            "MatMulNBits", inputs, list(node.output), name=node.name, domain=CONTRIB_DOMAIN,
            K=k, N=n, bits=bits, block_size=block, accuracy_level=level,
        )  # fmt: skip
        at = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(at, nbits)
        done += 1
        reading[dq.output[0]].remove(node)
        if not reading[dq.output[0]]:  # no other reader: the DequantizeLinear and its tensors go
            graph.node.remove(dq)
            for name in dq.input:
                if name and not any(name in n.input for n in graph.node):
                    graph.initializer.remove(inits.pop(name))
    if done and not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return done


def _stem(codes_name: str) -> str:
    """The weight's name, from its codes' (``w_q`` -> ``w``): the packed tensors are named for the weight, not a reader."""
    return codes_name.removesuffix(CODES)


def _weight_dequantize(node: onnx.NodeProto, made: dict, reading: dict, inits: dict) -> onnx.NodeProto | None:
    """The blocked DequantizeLinear of ``node``'s constant 2-D weight that a MatMulNBits can take, or None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    dq = made.get(node.input[1])
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a.i for a in dq.attribute}
    block = attrs.get("block_size", 0)
    codes = inits.get(dq.input[0])
    scale = inits.get(dq.input[1]) if len(dq.input) > 1 else None
    if codes is None or scale is None or len(codes.dims) != 2 or codes.data_type not in _CODES:
        return None
    if scale.data_type not in _FLOATS or attrs.get("axis", 1) % 2 != 0 or block < 16 or block & (block - 1):
        return None
    if len(dq.input) > 2 and dq.input[2] and dq.input[2] not in inits:
        return None
    if node.op_type == "Gemm" and not _plain_gemm(node, inits, codes.dims[1]):
        return None
    if any(r.op_type not in ("MatMul", "Gemm") for r in reading.get(dq.output[0], [])):
        return None  # the weight is read as values elsewhere too: it stays a DequantizeLinear for them
    return dq


def _plain_gemm(node: onnx.NodeProto, inits: dict, columns: int) -> bool:
    """Whether a Gemm is ``A @ B + bias``: no transpose, no scaling, a bias (if any) of one value an output column."""
    for a in node.attribute:
        if (a.name in ("transA", "transB") and a.i) or (a.name in ("alpha", "beta") and a.f != 1.0):
            return False
    if len(node.input) < 3 or not node.input[2]:
        return True
    bias = inits.get(node.input[2])
    return bias is not None and list(bias.dims) == [columns] and bias.data_type in _FLOATS


def _values(t: TensorProto) -> np.ndarray:
    return value_of(t) if is_marker(t) else from_tensor_proto(t)


def _packed(codes: TensorProto, scale: TensorProto, zero_point: TensorProto | None, block: int):
    """MatMulNBits' weight ``(N, blocks, bytes)``, scales ``(N, blocks)``, packed zero points (None: its default) and bits."""
    t = element_type(codes.data_type)
    zeros = None if zero_point is None else _values(zero_point)
    weight = packed_codes(_values(codes), zeros, block, t)
    return weight, np.ascontiguousarray(np.asarray(_values(scale)).T), packed_zero_points(zeros, codes.dims, block, t), t.bits


def packed_codes(codes: np.ndarray, zero_point: np.ndarray | None, block: int, t: ElementType) -> np.ndarray:
    """A ``(K, N)`` weight's codes of type ``t`` as MatMulNBits' unsigned ``(N, blocks, bytes a block)``."""
    k, n = codes.shape
    blocks = -(-k // block)
    padded = np.repeat(_unsigned(zero_point, (blocks, n), t), block, axis=0)  # past K: the zero point, dequantizing to 0
    padded[:k] = np.asarray(codes).astype(np.int16) + _offset(t)
    return _pack_rows(padded.T.reshape(n, blocks, block).astype(np.uint8), t.bits)


def packed_zero_points(zero_point: np.ndarray | None, shape, block: int, t: ElementType) -> np.ndarray | None:
    """The zero points ``(blocks, N)`` packed a column at a time, or None where each is MatMulNBits' default."""
    k, n = shape
    z = _unsigned(zero_point, (-(-k // block), n), t)
    if np.all(z == 1 << (t.bits - 1)):
        return None
    return _pack_rows(np.ascontiguousarray(z.T).astype(np.uint8), t.bits)


def _offset(t: ElementType) -> int:
    """What makes a code of ``t`` unsigned: ``c - z`` is ``(c + o) - (z + o)``."""
    return 1 << (t.bits - 1) if t.qmin < 0 else 0


def _unsigned(zero_point: np.ndarray | None, shape: tuple[int, int], t: ElementType) -> np.ndarray:
    z = np.zeros(shape, np.int16) if zero_point is None else np.asarray(zero_point).astype(np.int16)
    return z + _offset(t)


def _pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """The last axis of ``codes`` packed as ONNX packs a sub-byte tensor (lowest bits first), each row to whole bytes."""
    per = 8 // bits
    width = -(-codes.shape[-1] // per) * per
    padded = np.zeros((*codes.shape[:-1], width), np.uint8)  # a row's last byte padded with 0
    padded[..., : codes.shape[-1]] = codes
    return pack(padded.astype(element_type(f"uint{bits}").dtype)).reshape(*codes.shape[:-1], width // per)


def streamed_to_matmul_nbits(ir, model) -> int:
    """The same rewrite on an onnx-ir model whose codes are lazy (weights streamed): each packed as it is written."""
    graph, done = model.graph, 0
    for dq in [n for n in graph if n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx")]:
        codes = dq.inputs[0]
        block, axis = dq.attributes.get_int("block_size", 0), dq.attributes.get_int("axis", 1)
        uses = list(dq.outputs[0].uses())
        if codes.const_value is None or len(codes.shape) != 2 or block < 16 or block & (block - 1) or axis % 2:
            continue
        if not uses or any(index != 1 or not _streamed_reader(node, codes.shape[1]) for node, index in uses):
            continue  # (a transB=1 Gemm's weight is blocked along its axis 1: it stays a DequantizeLinear)
        packed = _lazy_inputs(ir, graph, dq, _stem(codes.name), block)  # once a weight, for each of its readers
        for node, _ in uses:
            inputs = [node.inputs[0], *packed]
            if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
                inputs += [None] * (5 - len(inputs)) + [node.inputs[2]]  # MatMulNBits' bias is its input 5
            new = ir.node(
                "MatMulNBits", inputs,
                attributes={"K": codes.shape[0], "N": codes.shape[1], "bits": element_type(codes.dtype.name.lower()).bits,
                            "block_size": block, "accuracy_level": 0},
                domain=CONTRIB_DOMAIN, name=node.name,
            )  # fmt: skip
            ir.convenience.replace_nodes_and_values(graph, node, [node], [new], list(node.outputs), list(new.outputs))
            done += 1
        read = list(dq.inputs)  # removing the node lets go of its inputs
        graph.remove(dq, safe=True)
        for value in read:
            if value is not None and not list(value.uses()):
                graph.initializers.pop(value.name)
    if done:
        model.opset_imports[CONTRIB_DOMAIN] = 1
    return done


def _streamed_reader(node, columns: int) -> bool:
    """Whether an onnx-ir node reading a weight at input 1 becomes a MatMulNBits: a MatMul, or a plain Gemm."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm"):
        return False
    if node.op_type == "MatMul":
        return True
    attrs = node.attributes
    if attrs.get_int("transA", 0) or attrs.get_int("transB", 0):
        return False
    if attrs.get_float("alpha", 1.0) != 1.0 or attrs.get_float("beta", 1.0) != 1.0:
        return False
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return bias is None or (bias.shape is not None and list(bias.shape) == [columns])


def _lazy_inputs(ir, graph, dq, stem: str, block: int) -> list:
    """MatMulNBits' weight, scales and zero points from ``dq``'s lazy tensors, each computed as it is written."""
    codes, scale = dq.inputs[0], dq.inputs[1]
    zero_point = dq.inputs[2] if len(dq.inputs) > 2 else None
    t = element_type(codes.dtype.name.lower())
    k, n = codes.shape
    blocks, per = -(-k // block), 8 // t.bits

    def zeros() -> np.ndarray | None:
        return None if zero_point is None else zero_point.const_value.numpy()

    tensors = [
        ir.LazyTensor(lambda: ir.Tensor(packed_codes(codes.const_value.numpy(), zeros(), block, t)), dtype=ir.DataType.UINT8,
                      shape=ir.Shape((n, blocks, block // per)), name=f"{stem}_nbits"),
        ir.LazyTensor(lambda: ir.Tensor(np.ascontiguousarray(scale.const_value.numpy().T)), dtype=scale.dtype,
                      shape=ir.Shape((n, blocks)), name=f"{stem}_nbits_scale"),
    ]  # fmt: skip
    if zero_point is not None:
        packed = packed_zero_points(zeros(), (k, n), block, t)  # a byte a column's two blocks: 1/64 of the weight's
        if packed is not None:
            tensors.append(ir.Tensor(packed, name=f"{stem}_nbits_zp"))
    values = [ir.Value(name=c.name, const_value=c, type=ir.TensorType(c.dtype), shape=c.shape) for c in tensors]
    for value in values:
        graph.register_initializer(value)
    return values
