"""Weight-only quantization of a model larger than memory: one weight at a time, from its external data to the output's.

The model is read with onnx-ir, whose external tensors stay on disk until
asked for. Two passes, each holding one weight at a time:

1. each weight to quantize (Conv, ConvTranspose, Gemm, MatMul weights and
   Gather tables, as the plan pass chooses them) is read from the external
   data file (a plain read at its offset, so its pages do not stay in the
   process), its scales and zero points computed (:func:`weight_params`),
   and a DequantizeLinear put in front of its readers, whose codes are an
   onnx-ir ``LazyTensor``;
2. onnx-ir writes the model, calling each lazy tensor as it writes it: the
   weight is read again and quantized by qlinear's kernels, its bytes
   written to the output's external data file and dropped.

Peak memory is the graph plus a few of the largest weight, whatever the
model's size. Why onnx-ir: its external tensors are lazy and its writer
streams tensors to the data file one by one (with a bound on bytes in
flight); written by hand the same needs protobuf surgery on TensorProto
locations and offsets, which the onnx package's own save does not stream
(it gathers every tensor first). The output passes the checker's path-based
check. No calibration, analysis or evaluation runs: a model this size is
checked by the caller on its own runtime.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

import qlinear
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._checked import check_quantized
from qlinear.quantize._choose import QuantParams, in_float_type, weight_params
from qlinear.quantize._gathered_table import gather_streamed, gathers_codes
from qlinear.quantize._memory import peak_rss_bytes
from qlinear.quantize._qdq_names import CODES, SCALE, VALUES, ZERO_POINT
from qlinear.quantize.targets import QDQ_FORM, target
from qlinear.spec import type_opset

if TYPE_CHECKING:  # the options compose every algorithm's fields, and algorithms import this module
    from qlinear.quantize._options import QuantizeOptions


__all__ = ["IN_MEMORY_COPIES", "StreamResult", "model_bytes", "quantize_weights_streaming", "streaming_choice", "unstreamable"]

_FLOATS = ("FLOAT", "FLOAT16", "BFLOAT16")
_WEIGHT_TYPES = ("int8", "uint8", "int4", "uint4")
# The options that change what a weight-only run given no data writes, and that this path does not take.
_IN_MEMORY_ONLY = ("exclude", "opset", "equalize")
# What the in-memory path holds of a weight-only model, in copies of its weights: the float weights, their codes,
# the weights read back for the report and the written model (a 205 MB decoder peaked at 1.1 GB).
IN_MEMORY_COPIES = 6
# Bytes onnx-ir may hold in flight while writing; a few times the largest weight is enough.
_IN_FLIGHT = 64 << 20


@dataclass
class StreamResult:
    path: Path
    weights: int
    bytes_before: int
    bytes_after: int
    seconds: float
    peak_rss_bytes: int
    # Weights stored wider than asked, (name, type stored, why): the target's placement.stored_type.
    widened: list[tuple[str, str, str]] = field(default_factory=list)


def unstreamable(options: QuantizeOptions) -> str | None:
    """The first option (its field's name) that one weight at a time cannot honour; None: it honours them all."""
    if options.activations is not None:
        return "activations"
    if options.weights not in _WEIGHT_TYPES:
        return "weights"
    defaults = type(options)()
    return next((name for name in _IN_MEMORY_ONLY if getattr(options, name) != getattr(defaults, name)), None)


def streaming_choice(model_path: str | os.PathLike, options: QuantizeOptions, memory_bytes: int | None = None) -> str | None:
    """Why a weight-only run given no data takes its weights one at a time; None: it runs in memory.

    It streams when the in-memory path would hold more than half the
    machine's memory (:data:`IN_MEMORY_COPIES` times the model's bytes),
    unless an option asks for what only the in-memory path does.
    """
    if unstreamable(options) is not None:
        return None
    size = model_bytes(Path(model_path))
    memory = _memory_bytes() if memory_bytes is None else memory_bytes
    if IN_MEMORY_COPIES * size <= memory // 2:
        return None
    return (
        f"the model's {size / 2**30:.1f} GiB would take about {IN_MEMORY_COPIES * size / 2**30:.0f} GiB in memory, "
        f"more than half of this machine's {memory / 2**30:.0f} GiB"
    )


# A model file this large holds its weights inline (a graph of external weights is a few MiB at most).
INLINE_BYTES = 64 << 20


def model_bytes(path: Path) -> int:
    """The model file and the external data files its tensors name (read from the graph alone, not the weights).

    A model file of :data:`INLINE_BYTES` or more holds its weights itself:
    its size is the answer, without parsing it.
    """
    try:
        if path.stat().st_size >= INLINE_BYTES:
            return path.stat().st_size
        graph = onnx.load(str(path), load_external_data=False).graph
        files = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
        return path.stat().st_size + sum((path.parent / f).stat().st_size for f in files if (path.parent / f).is_file())
    except Exception:
        return 0


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 62


def quantize_weights_streaming(
    model_path: str | os.PathLike, output: str | os.PathLike, options: QuantizeOptions
) -> StreamResult:
    """Quantize the weights of the model at ``model_path`` into ``output`` (with ``output``.data beside it), one at a time.

    Raises:
        QuantizationError: a type other than int8/uint8/int4/uint4,
            quantized activations, an option only the in-memory path takes
            (``exclude``, ``opset``, ``equalize``), a file
            that is no model, external data that is missing, short, or
            outside the model's folder, an opset too old for the type whose
            operators changed since, or an output that cannot be written
            (nothing is left behind).
    """
    import onnx_ir as ir

    start = time.perf_counter()
    refused = unstreamable(options)
    if refused == "weights":
        raise QuantizationError(f"quantize: streaming weights takes int8, uint8, int4 or uint4, got {options.weights!r}")
    if refused == "activations":
        raise QuantizationError(f"quantize: streaming quantizes weights only: give activations None, not {options.activations!r}")
    if refused is not None:
        raise QuantizationError(
            f"quantize: {refused}= is not for streaming weights (weights only, one at a time), got "
            f"{getattr(options, refused)!r}: leave it out, or quantize in memory"
        )
    src, out = Path(model_path), Path(output)
    try:
        model = ir.load(src)
    except Exception as e:  # onnx-ir raises the protobuf's and its own types
        raise QuantizationError(f"quantize: {src} is not a readable ONNX model: {str(e).splitlines()[0]}") from None
    base = src.resolve().parent
    opset = _opset_for(model, options)
    runtime = target(options.target)
    placement = runtime.placement  # the types the runtime runs each weight in
    done: dict[str, ir.Value] = {}  # weight name -> its DequantizeLinear's output
    centred: dict[str, bool] = {}  # weight name -> whether some zero point is not 0
    widened: list[tuple[str, str, str]] = []
    spill = Path(tempfile.mkdtemp(prefix=".qlinear-scales-", dir=out.resolve().parent if out.resolve().parent.is_dir() else None))
    try:
        before = after = 0
        graph = model.graph
        for node in list(graph):
            site = _weight_site(node)
            if site is None:
                continue
            index, channel_axis, reduction_axis = site
            weight = node.inputs[index]
            if (
                weight is None
                or weight.const_value is None
                or weight.const_value.dtype.name not in _FLOATS
                or weight.name not in graph.initializers
            ):
                continue
            # A Gemm's weight read transposed (transB=1) is stored transposed, transB=0, as the in-memory path
            # stores it: only then does ONNX Runtime fuse its DequantizeLinear into MatMulNBits.
            transposed = _untransposable(node, weight)
            if transposed:
                node.attributes["transB"] = ir.AttrInt64("transB", 0)
                channel_axis, reduction_axis = 1, 0
            if weight.name not in done:
                array = _read(weight.const_value, base)
                array = array.T if transposed else array
                if array.ndim < 2 and node.op_type != "MatMul":
                    continue
                # The type the plan stores it in (a table the runtime gathers as 8-bit codes, say).
                stored, why = placement.stored_type(node.op_type, options.weights, array.shape[channel_axis % array.ndim])
                wt = element_type(stored)
                if why is not None:
                    widened.append((weight.name, stored, why))
                params, axis, block = weight_params(
                    array.astype(np.float32), wt, granularity=options.granularity, channel_axis=channel_axis % array.ndim,
                    reduction_axis=reduction_axis % array.ndim, block_size=options.block_size, clip=options.weight_clip,
                    weight_only=True,
                )  # fmt: skip
                before += array.nbytes
                done[weight.name] = _dequantize(ir, graph, node, weight, params, axis, block, wt, base, spill, transposed)
                centred[weight.name] = params.zero_point is not None and bool(np.any(params.zero_point))
                after += (int(np.prod(weight.const_value.shape.numpy())) * wt.bits + 7) // 8 + params.scale.nbytes
                del array
            if node.op_type == "Gather" and gathers_codes(done[weight.name], node):
                gather_streamed(ir, graph, node, done[weight.name], centred=centred[weight.name])
            else:
                node.replace_input_with(index, done[weight.name])
        unread = list(done)  # the float weights, and the parameters of the DequantizeLinears removed below
        for value in done.values():  # a DequantizeLinear only gathered tables read is left unread
            if not list(value.uses()):
                dq = value.producer()
                unread += [v.name for v in dq.inputs[1:] if v is not None]
                graph.remove(dq, safe=True)
        for name in unread:
            if name in graph.initializers and not list(graph.initializers[name].uses()):  # one still read stays
                graph.initializers.pop(name)
        if options.format != QDQ_FORM:
            runtime.forms[options.format].streamed(ir, model)
        _set_opset(model, opset)
        _write(ir, model, out)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    return StreamResult(out, len(done), before, after, time.perf_counter() - start, peak_rss_bytes(), widened)


def _weight_site(node) -> tuple[int, int, int] | None:
    """``(input index, channel axis, reduction axis)`` of the node's weight, as the plan pass takes it."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return None
    if op == "Conv":
        return 1, 0, 1
    if op == "ConvTranspose":
        return 1, 1, 0
    if op == "Gemm":
        trans_b = node.attributes.get_int("transB", 0)
        return (1, 0, 1) if trans_b else (1, 1, 0)
    if op == "MatMul":
        return 1, -1, -2
    if op == "Gather":
        return 0, 0, 1
    return None


def _untransposable(node, weight) -> bool:
    """Whether ``node`` is a Gemm reading ``weight`` (2-D, read by it alone) transposed: ``transB=1``, ``transA=0``."""
    if node.op_type != "Gemm" or node.attributes.get_int("transB", 0) != 1 or node.attributes.get_int("transA", 0) != 0:
        return False
    return len(weight.const_value.shape) == 2 and len(list(weight.uses())) == 1


def _read(tensor, base: Path) -> np.ndarray:
    """A weight's values, read from its external data with a plain read (no mapping left behind), or from the model."""
    import onnx_ir as ir

    if not isinstance(tensor, ir.ExternalTensor):
        return np.asarray(tensor.numpy())
    path = Path(tensor.base_dir or base, tensor.location).resolve()
    if base not in path.parents:
        raise QuantizationError(
            f"quantize: weight {tensor.name!r} names external data {tensor.location!r} outside the model's folder; refused"
        )
    dtype = tensor.dtype.numpy()
    count = int(np.prod(tensor.shape.numpy()))
    offset = tensor.offset or 0
    try:
        size = path.stat().st_size
    except OSError:
        raise QuantizationError(f"quantize: weight {tensor.name!r}: external data file {path} is missing") from None
    if offset + count * dtype.itemsize > size:
        raise QuantizationError(
            f"quantize: weight {tensor.name!r}: external data file {path} holds {size} bytes, "
            f"expected at least {offset + count * dtype.itemsize} (truncated?)"
        )
    return np.fromfile(path, dtype=dtype, count=count, offset=offset).reshape(tensor.shape.numpy())


def _spilled(ir, array: np.ndarray, name: str, folder: Path):
    """``(lazy tensor, loader)`` of ``array`` kept in a file until needed: blocked scales are 1/32 of the weights, too much to hold."""
    path = folder / f"{len(os.listdir(folder))}.bin"
    np.ascontiguousarray(array).view(np.uint8).tofile(path)  # raw bytes: ml_dtypes' int4 is one byte an element
    numpy_dtype, shape = array.dtype, array.shape

    def load() -> np.ndarray:
        return np.fromfile(path, np.uint8).view(numpy_dtype).reshape(shape)

    lazy = ir.LazyTensor(
        lambda: ir.Tensor(load(), name=name), dtype=ir.DataType.from_numpy(numpy_dtype), shape=ir.Shape(shape), name=name
    )
    return lazy, load


def _dequantize(ir, graph, node, weight, params, axis: int, block: int, t, base: Path, spill: Path, transposed: bool = False):
    """A DequantizeLinear of lazily quantized codes for ``weight`` (``transposed``: of its transpose), before ``node``."""
    source = weight.const_value
    shape = ir.Shape(list(reversed(source.shape.numpy()))) if transposed else source.shape
    # The scale in the weight's own float type, as the in-memory path stores it: a float16 model's
    # DequantizeLinear gives float16, and its codes are the float16 weight's.
    params = QuantParams(in_float_type(params.scale, source.dtype.value), params.zero_point)
    own_type = params.scale.dtype != np.float32
    # Scales and zero points wait in files: the lazy codes must not hold them either.
    scale, load_scale = _spilled(ir, params.scale, weight.name + SCALE, spill)
    zero_point, load_zero_point = (None, lambda: None)
    if params.zero_point is not None:
        zero_point, load_zero_point = _spilled(ir, params.zero_point, weight.name + ZERO_POINT, spill)
    scale_is_array = params.scale.ndim > 0

    def codes():
        array = _read(source, base)
        array = np.ascontiguousarray(array.T) if transposed else array
        array = array if own_type else array.astype(np.float32)
        q = qlinear.quantize_linear(array, load_scale(), load_zero_point(), axis=axis, block_size=block, output_dtype=t.name)
        return ir.Tensor(q, name=weight.name + CODES)

    lazy = ir.LazyTensor(codes, dtype=ir.DataType[t.name.upper()], shape=shape, name=weight.name + CODES)
    tensors = [lazy, scale, *([zero_point] if zero_point is not None else [])]
    inputs = [ir.Value(name=c.name, const_value=c, type=ir.TensorType(c.dtype), shape=c.shape) for c in tensors]
    for v in inputs:
        graph.register_initializer(v)
    attributes = {"axis": axis} if scale_is_array else {}
    if block:
        attributes["block_size"] = block
    dq = ir.node("DequantizeLinear", inputs, attributes=attributes, name=weight.name + VALUES)
    dq.outputs[0].name = weight.name + VALUES
    graph.insert_before(node, dq)
    return dq.outputs[0]


def _opset_for(model, options: QuantizeOptions) -> int:
    """The ai.onnx opset the output needs; an older model is raised only where none of its operators changed since."""
    current = model.opset_imports.get("", 1)
    need = max(current, type_opset(options.weights), 21 if options.granularity == "blocked" else 13)
    if need == current:
        return current
    changed = sorted(
        {
            n.op_type
            for n in model.graph
            if n.domain in ("", "ai.onnx")
            and onnx.defs.get_schema(n.op_type, need).since_version != onnx.defs.get_schema(n.op_type, current).since_version
        }
    )
    if changed:
        raise QuantizationError(
            f"quantize: {options.weights} {options.granularity} weights need opset {need}, and this model's opset {current} "
            f"has operators that changed since ({', '.join(changed[:5])}); convert the model to opset {need} first"
        )
    return need


def _set_opset(model, opset: int) -> None:
    model.opset_imports[""] = opset
    model.ir_version = max(model.ir_version, 10 if opset >= 21 else 7)


def _write(ir, model, out: Path) -> None:
    """The model and its external data written in a temporary folder beside ``out``, then moved in place."""
    parent = out.resolve().parent
    if not parent.is_dir():
        raise QuantizationError(f"quantize: output {out} cannot be written: folder {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        try:
            ir.save(model, tmp / out.name, external_data=f"{out.name}.data", max_workers=1, max_in_flight_bytes=_IN_FLIGHT)
        except OSError as e:
            raise QuantizationError(f"quantize: cannot write {out}: {e.strerror or e}") from None
        check_quantized(tmp / out.name)  # by path: the checker reads a model over 2 GB only so
        for f in sorted(tmp.iterdir()):
            os.replace(f, parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
