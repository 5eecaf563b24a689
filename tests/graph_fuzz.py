"""A seeded generator of small valid float ONNX models, from a grammar of the ops real exporters write.

``fuzz_case(seed)`` gives a model (as a path-free ModelProto), calibration
data for it, and random quantizer options. tests/test_quantize_fuzz.py runs
the quantizer on each case and checks what the quantizer promises whatever
the model: a clear error or a valid model that its runtime loads (or that
the report says it cannot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["FuzzCase", "fuzz_case"]

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "HardSwish", "Sigmoid", "SiLU", "Tanh", "None")
WEIGHTS = ("int8", "uint8", "int4", "uint4", "int2", "float8e4m3fn", "float4e2m1")
WEIGHTS_SINCE_10 = (*WEIGHTS, "uint2", "float8e5m2")
ACTIVATION_TYPES = ("uint8", "int8", "uint16", "int16", "float8e4m3fn", None)


@dataclass
class FuzzCase:
    seed: int
    model: onnx.ModelProto
    data: dict[str, np.ndarray]
    options: dict[str, Any]
    description: list[str] = field(default_factory=list)


class _Builder:
    def __init__(self, rng: np.random.Generator, float_type: int, opset: int, grammar: int) -> None:
        self.rng, self.float_type, self.opset, self.grammar = rng, float_type, opset, grammar
        self.np_float = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: ml_dtypes.bfloat16}.get(float_type, np.float32)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.extra_outputs: list[str] = []
        self.extra_inputs: list[tuple[str, list]] = []  # inputs fed whole to every batch: name, shape

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, array: np.ndarray, base: str, *, constant_node: bool = False) -> str:
        name = self.name(base)
        tensor = numpy_helper.from_array(array, name)
        if constant_node:  # as some exporters write weights: a Constant node, not an initializer
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_const", value=tensor))
        else:
            self.inits.append(tensor)
        return name

    def weight(self, *shape: int, constant_node: bool = False) -> str:
        w = (self.rng.standard_normal(shape) * 0.3).astype(self.np_float)
        return self.const(w, "w", constant_node=constant_node)

    def node(self, op: str, inputs: list[str], base: str | None = None, **attrs: Any) -> str:
        out = self.name(base or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def nodes_outputs(self, op: str, inputs: list[str], count: int, **attrs: Any) -> list[str]:
        """A node of ``count`` outputs (Split), their names."""
        outs = [self.name(op.lower()) for _ in range(count)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"{outs[0]}_node", **attrs))
        return outs

    def activation(self, x: str, kind: str) -> str:
        if kind == "None":
            return x
        if kind == "HardSwish" and self.opset < 14:  # an op of opset 14
            kind = "HardSigmoid"
        if kind == "LeakyRelu":
            return self.node("LeakyRelu", [x], alpha=0.1)
        if kind == "Clip":
            lo = self.const(np.array(0.0, self.np_float), "lo")
            hi = self.const(np.array(6.0, self.np_float), "hi")
            return self.node("Clip", [x, lo, hi])
        if kind == "SiLU":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if kind == "Gelu" and self.opset < 20:  # written out, as exporters did before the op (opset 20)
            root2 = self.const(np.array(np.sqrt(2.0), self.np_float), "sqrt2")
            half = self.const(np.array(0.5, self.np_float), "half")
            one = self.const(np.array(1.0, self.np_float), "one")
            erf = self.node("Erf", [self.node("Div", [x, root2])])
            return self.node("Mul", [self.node("Mul", [x, half]), self.node("Add", [erf, one])])
        return self.node(kind, [x])

    def affine(self, x: str, channels: int) -> str:
        """``x * a + c`` on a 2-D feature map: scalars, as paddle2onnx writes a learnable affine block, or one a channel."""
        shape = () if self.rng.random() < 0.5 else (1, channels, 1, 1)
        scale = self.const(self.rng.uniform(0.5, 1.5, shape).astype(self.np_float), "affine_scale")
        shift = self.const(self.rng.uniform(-0.5, 0.5, shape).astype(self.np_float), "affine_shift")
        return self.node("Add", [self.node("Mul", [scale, x]), shift])

    def activations(self) -> tuple[str, ...]:
        """The activations this grammar version draws from (3 added Gelu)."""
        return (*ACTIVATIONS, "Gelu") if self.grammar >= 3 else ACTIVATIONS


def _cnn(b: _Builder, rng: np.random.Generator, x: str, channels: int, size: int, desc: list[str]) -> tuple[str, int]:
    if size <= 8 and rng.random() < 0.15:  # an exporter's upsampling of the input
        scales = b.const(np.array([1, 1, 2, 2], np.float32), "scales")
        roi = "" if b.opset >= 13 else b.const(np.array([], np.float32), "roi")  # an input it must have before 13
        x = b.node("Resize", [x, roi, scales], mode="nearest")
        size *= 2
        desc.append("Resize")
    for _ in range(int(rng.integers(1, 4))):
        out = int(rng.choice([4, 6, 8]))
        if rng.random() < 0.2:  # two 1x1 branches concatenated along the channels
            left = b.node("Conv", [x, b.weight(out // 2, channels, 1, 1)])
            right = b.node("Conv", [x, b.weight(out - out // 2, channels, 1, 1)])
            x, channels = b.node("Concat", [left, right], axis=1), out
            desc.append("concat")
        if (
            b.grammar >= 2 and channels % 2 == 0 and rng.random() < 0.2
        ):  # a C2f block: the channels split, one half convolved, joined
            half = channels // 2
            if b.opset >= 13:
                first, second = b.nodes_outputs("Split", [x, b.const(np.array([half, half], np.int64), "split")], 2, axis=1)
            else:  # its sizes an attribute before opset 13
                first, second = b.nodes_outputs("Split", [x], 2, axis=1, split=[half, half])
            first = b.activation(b.node("Conv", [first, b.weight(half, half, 3, 3)], pads=[1, 1, 1, 1]), "Relu")
            x = b.node("Concat", [first, second], axis=1)
            desc.append("Split")
        if b.grammar >= 3 and size <= 8 and rng.random() < 0.15:  # a decoder's upsampling: a ConvTranspose, stride 2
            up = [x, b.weight(channels, out, 2, 2)] + ([b.const(np.zeros(out, b.np_float), "bias")] if rng.random() < 0.5 else [])
            x, channels, size = b.activation(b.node("ConvTranspose", up, strides=[2, 2]), "Relu"), out, size * 2
            desc.append("ConvTranspose")
        if b.grammar >= 2 and size >= 6 and rng.random() < 0.15:  # a crop of the rows and columns, as a Slice
            edges = [
                b.const(np.array(v, np.int64), name) for v, name in (([1, 1], "starts"), ([-1, -1], "ends"), ([2, 3], "axes"))
            ]
            x, size = b.node("Slice", [x, *edges]), size - 2
            desc.append("Slice")
        if b.grammar >= 10 and rng.random() < 0.2:  # a depthwise 3x3 Conv before the block's, as MobileNets have
            dw = [x, b.weight(channels, 1, 3, 3)] + (
                [b.const(np.zeros(channels, b.np_float), "bias")] if rng.random() < 0.7 else []
            )
            x = b.activation(b.node("Conv", dw, pads=[1, 1, 1, 1], group=channels), str(rng.choice(b.activations())))
            desc.append("depthwise")
        pads, conv_in = [1, 1, 1, 1], x
        if rng.random() < 0.15:  # padding as its own node
            conv_in = b.node("Pad", [x, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")])
            pads = [0, 0, 0, 0]
            desc.append("Pad")
        inputs = [conv_in, b.weight(out, channels, 3, 3, constant_node=bool(rng.random() < 0.2))]
        if rng.random() < 0.7:
            inputs.append(b.const((rng.standard_normal(out) * 0.1).astype(b.np_float), "bias"))
        y = b.node("Conv", inputs, pads=pads)
        if rng.random() < 0.4:
            stats = [np.abs(rng.standard_normal(out)) + 0.5, rng.standard_normal(out) * 0.1, rng.standard_normal(out) * 0.1]
            params = [b.const(p.astype(b.np_float), "bn") for p in (stats[0], stats[1], stats[2], np.abs(stats[0]))]
            y = b.node("BatchNormalization", [y, *params])
            desc.append("batchnorm")
        if b.grammar >= 8 and rng.random() < 0.25:  # a learnable affine block after the Conv (PP-LCNetV3's)
            y = b.affine(y, out)
            desc.append("affine")
        kind = str(rng.choice(b.activations()))
        y = b.activation(y, kind)
        desc.append(f"conv{out}+{kind}")
        if b.grammar >= 8 and rng.random() < 0.25:  # and one after the activation, before the next Conv or the pool
            y = b.affine(y, out)
            desc.append("affine after")
        if out == channels and rng.random() < 0.4:
            y = b.node("Add", [y, x])
            desc.append("residual")
        if b.grammar >= 9 and rng.random() < 0.2:  # a squeeze-and-excitation gate on the block's output
            squeezed = b.node("Conv", [b.node("GlobalAveragePool", [y]), b.weight(out, out, 1, 1)])
            gate = b.node("HardSigmoid", [squeezed]) if rng.random() < 0.5 else b.node("Sigmoid", [squeezed])
            y = b.node("Mul", [y, gate])
            desc.append("SE gate")
        if b.grammar >= 9 and size >= 4 and size % 2 == 0 and rng.random() < 0.2:  # a pyramid's coarser level joined
            coarse = b.node("Conv", [b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2]), b.weight(out, out, 1, 1)])
            roi = "" if b.opset >= 13 else b.const(np.array([], np.float32), "roi")
            up = b.node("Resize", [coarse, roi, b.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
            y = b.node("Add", [y, up])
            desc.append("pyramid")
        if size >= 4 and rng.random() < 0.4:
            pool = str(rng.choice(["MaxPool", "AveragePool"]))
            y = b.node(pool, [y], kernel_shape=[2, 2], strides=[2, 2])
            size //= 2
            desc.append(pool)
        if rng.random() < 0.15:
            b.extra_outputs.append(y)  # a graph output in the middle
            desc.append("middle output")
        x, channels = y, out
    if rng.random() < 0.5:
        x = b.node("GlobalAveragePool", [x])
        return b.node("Flatten", [x]), channels
    return b.node("Flatten", [x]), channels * size * size


def _volume(b: _Builder, rng: np.random.Generator, x: str, channels: int, desc: list[str]) -> tuple[str, int]:
    """3-D convolutions over a (channels, 4, 6, 6) volume, then its channels' means."""
    for _ in range(int(rng.integers(1, 3))):
        out = int(rng.choice([4, 6]))
        inputs = [x, b.weight(out, channels, 3, 3, 3)]
        if rng.random() < 0.7:
            inputs.append(b.const((rng.standard_normal(out) * 0.1).astype(b.np_float), "bias"))
        kind = str(rng.choice(b.activations()))
        x, channels = b.activation(b.node("Conv", inputs, pads=[1] * 6), kind), out
        desc.append(f"conv3d{out}+{kind}")
    if rng.random() < 0.5:
        x = b.node("MaxPool", [x], kernel_shape=[1, 2, 2], strides=[1, 2, 2])
        desc.append("MaxPool3d")
    return b.node("Flatten", [b.node("GlobalAveragePool", [x])]), channels


def _mlp(b: _Builder, rng: np.random.Generator, x: str, width: int, desc: list[str]) -> tuple[str, int]:
    shared = None
    if b.grammar >= 10 and rng.random() < 0.15:  # a rank-1 input of fixed size (a per-feature offset), fed whole
        b.extra_inputs.append(("offset", [width]))
        x = b.node("Add", [x, "offset"])
        desc.append("rank-1 input")
    for _ in range(int(rng.integers(1, 4))):
        out = width if rng.random() < 0.3 else int(rng.choice([8, 12, 16]))
        if shared is not None and shared[1] == width and out == width and rng.random() < 0.5:
            w = shared[0]  # a square weight two layers share
            desc.append("shared weight")
        else:
            w = b.weight(width, out)
        if out == width:
            shared = (w, width)
        if rng.random() < 0.5:
            inputs = [x, w] + ([b.const(np.zeros(out, b.np_float), "bias")] if rng.random() < 0.7 else [])
            y = b.node("Gemm", inputs)
            desc.append(f"gemm{out}")
        else:
            y = b.node("MatMul", [x, w])
            if rng.random() < 0.6:
                y = b.node("Add", [y, b.const((rng.standard_normal(out) * 0.1).astype(b.np_float), "bias")])
            desc.append(f"matmul{out}")
        kind = str(rng.choice(b.activations()))
        x, width = b.activation(y, kind), out
        desc.append(kind)
        if b.grammar >= 5 and rng.random() < 0.12:
            x, width = _branch(b, rng, x, width)
            desc.append(f"If{width}")
        if b.opset >= 17 and rng.random() < 0.2:
            gamma, beta = b.const(np.ones(width, b.np_float), "gamma"), b.const(np.zeros(width, b.np_float), "beta")
            x = b.node("LayerNormalization", [x, gamma, beta], axis=-1)
            desc.append("LayerNormalization")
        elif rng.random() < 0.1:
            x = _written_out_layernorm(b, x)
            desc.append("written-out LayerNorm")
        if width % 2 == 0 and rng.random() < 0.15:  # a MatMul on 3-D activations between Reshapes
            half = width // 2
            y = b.node("Reshape", [x, b.const(np.array([-1, 2, half], np.int64), "shape")])
            y = b.node("MatMul", [y, b.weight(half, half)])
            x = b.node("Reshape", [y, b.const(np.array([-1, width], np.int64), "shape")])
            desc.append("3-D MatMul")
        if rng.random() < 0.1:
            x = b.node("Cast", [b.node("Cast", [x], to=TensorProto.DOUBLE)], to=b.float_type)
            desc.append("Cast")
    return x, width


def _branch(b: _Builder, rng: np.random.Generator, x: str, width: int) -> tuple[str, int]:
    """An If on the data (its sum above 0) whose two sides each multiply ``x`` by a weight of the outer graph; its width."""
    out = int(rng.choice([8, 12]))
    zero = b.const(np.array(0.0, b.np_float), "zero")
    cond = b.node("Greater", [b.node("ReduceSum", [x], keepdims=0), zero])

    def side(name: str) -> onnx.GraphProto:
        result = b.name(f"{name}_out")
        node = helper.make_node("MatMul", [x, b.weight(width, out)], [result], name=f"{result}_node")
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(result, b.float_type, None)])

    return b.node("If", [cond], then_branch=side("then"), else_branch=side("else")), out


def _written_out_layernorm(b: _Builder, x: str) -> str:
    """LayerNorm as older exporters write it: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div."""

    def mean(t: str) -> str:
        if b.opset >= 18:
            return b.node("ReduceMean", [t, b.const(np.array([-1], np.int64), "axes")], keepdims=1)
        return b.node("ReduceMean", [t], axes=[-1], keepdims=1)

    centred = b.node("Sub", [x, mean(x)])
    var = mean(b.node("Pow", [centred, b.const(np.array(2.0, b.np_float), "two")]))
    std = b.node("Sqrt", [b.node("Add", [var, b.const(np.array(1e-5, b.np_float), "eps")])])
    return b.node("Div", [centred, std])


def _tokens(b: _Builder, rng: np.random.Generator, desc: list[str]) -> tuple[str, int]:
    """A token model's front: an embedding table gathered by int64 ids, a dense layer on (batch, length, width), a mean."""
    width = int(rng.choice([8, 16]))
    table = b.weight(20, width)
    x = b.node("Gather", [table, "x"])
    x = b.node("MatMul", [x, b.weight(width, width)])
    if rng.random() < 0.5:
        x = b.node("Add", [x, b.const(np.zeros(width, b.np_float), "bias")])
    x = b.activation(x, str(rng.choice(b.activations())))
    if b.opset >= 18:
        x = b.node("ReduceMean", [x, b.const(np.array([1], np.int64), "axes")], keepdims=0)
    else:
        x = b.node("ReduceMean", [x], axes=[1], keepdims=0)
    desc.append(f"embedding {width}")
    return x, width


def _recurrent(b: _Builder, rng: np.random.Generator, x: str, width: int, desc: list[str]) -> tuple[str, int]:
    """A GRU or LSTM over (batch, length, width) inputs: its weights stay float on ONNX Runtime."""
    hidden = 8
    op = str(rng.choice(["GRU", "LSTM"]))
    gates = 3 if op == "GRU" else 4
    seq = b.node("Transpose", [x], perm=[1, 0, 2])
    w, r = b.weight(1, gates * hidden, width), b.weight(1, gates * hidden, hidden)
    out = b.name(op.lower())
    outputs = ["", f"{out}_h"] + ([f"{out}_c"] if op == "LSTM" else [])
    b.nodes.append(helper.make_node(op, [seq, w, r], outputs, name=f"{out}_node", hidden_size=hidden))
    if b.opset >= 13:
        last = b.node("Squeeze", [f"{out}_h", b.const(np.array([0], np.int64), "axes")])
    else:  # its axes an attribute before opset 13
        last = b.node("Squeeze", [f"{out}_h"], axes=[0])
    desc.append(op)
    return last, hidden


# The grammar's versions: 2 added Split (a C2f block's) and Slice to the convolutional models, 3 ConvTranspose and
# Gelu (the op, or written out with Erf before opset 20), 4 opsets 11, 12 and 23, 5 an If whose sides read weights
# of the outer graph, 6 a rank-5 input through 3-D convolutions and a scalar (rank-0) input, 7 exclusions in every
# form of pattern, 8 learnable affine blocks (a Mul and an Add by scalars or by one constant a channel) after a Conv
# and after its activation, 9 squeeze-and-excitation gates and a pyramid's coarser level upsampled (nearest Resize)
# and added back, 10 opsets 11 to 23 each, bfloat16 models (opsets 22 and 23), depthwise Convs, an image of open
# height and width, a sequence of open length, a rank-1 input fed whole, uint2 and float8e5m2 weights, block sizes,
# GPTQ, AWQ, depthwise equalization, fine-tuning and every form of target (agreement, SQNR, a user's metric, a latency
# budget, the share left float), 11 the least-error weight scales and ONNX Runtime's MatMulNBits form, 12 the OpenVINO
# target. A case is its seed and the version it was drawn with: a regression test names both, so that a
# grammar grown later keeps its case.
GRAMMAR = 12


def fuzz_case(seed: int, grammar: int = GRAMMAR) -> FuzzCase:
    """Case number ``seed`` of grammar version ``grammar``: the same model, data and options every time."""
    rng = np.random.default_rng(seed)
    float_type = TensorProto.FLOAT16 if rng.random() < 0.15 else TensorProto.FLOAT
    opsets = list(range(11, 24)) if grammar >= 10 else [11, 12, 13, 15, 17, 19, 21, 23] if grammar >= 4 else [13, 15, 17, 19, 21]
    opset = int(rng.choice(opsets))
    if grammar >= 10 and opset >= 22 and rng.random() < 0.3:  # bfloat16: the ops here take it from opset 22
        float_type = TensorProto.BFLOAT16
    b = _Builder(rng, float_type, opset, grammar)
    batch: Any = "N" if rng.random() < 0.8 else 1
    desc = [f"opset {opset}", TensorProto.DataType.Name(float_type).lower(), f"batch {batch}"]
    samples = 24
    kind = rng.random()
    input_type = float_type
    if kind < 0.45 and grammar >= 6 and rng.random() < 0.15:  # a volume: rank-5 input, 3-D convolutions
        channels = int(rng.choice([1, 2]))
        shape = [batch, channels, 4, 6, 6]
        x, width = _volume(b, rng, "x", channels, desc)
    elif kind < 0.45:
        channels, size = int(rng.choice([1, 3])), int(rng.choice([8, 12]))
        shape = [batch, channels, size, size]
        if grammar >= 10 and rng.random() < 0.2:  # an image of any size, as detectors and OCR models declare
            shape[2:] = ["H", "W"]
            desc.append("open height and width")
        x, width = _cnn(b, rng, "x", channels, size, desc)
    elif kind < 0.8:
        width = int(rng.choice([8, 16]))
        shape = [batch, width]
        x, width = _mlp(b, rng, "x", width, desc)
    elif kind < 0.9:
        shape, input_type = [batch, 6], TensorProto.INT64
        if grammar >= 10 and rng.random() < 0.3:  # a sequence of any length
            shape[1] = "L"
            desc.append("open length")
        x, width = _tokens(b, rng, desc)
    else:
        width = 8
        shape = [batch, 5, width]
        x, width = _recurrent(b, rng, "x", width, desc)
    classes = 5
    logits = b.node("Gemm", [x, b.weight(width, classes), b.const(np.zeros(classes, b.np_float), "bias")], base="logits")
    inputs = [helper.make_tensor_value_info("x", input_type, shape)]
    if grammar >= 6 and rng.random() < 0.15:  # a scalar input (a temperature) the logits are scaled by
        logits = b.node("Mul", [logits, "t"])
        inputs.append(helper.make_tensor_value_info("t", float_type, []))
        desc.append("scalar input")
    if rng.random() < 0.3:
        logits = b.node("Softmax", [logits], axis=-1)
        desc.append("softmax")
    inputs += [helper.make_tensor_value_info(name, float_type, dims) for name, dims in b.extra_inputs]
    outputs = [helper.make_tensor_value_info(logits, float_type, None)]
    outputs += [helper.make_tensor_value_info(t, float_type, None) for t in b.extra_outputs]
    graph = helper.make_graph(b.nodes, f"fuzz{seed}", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # The IR version an exporter writes for the opset (8 in grammars before 4, which drew no opset past 21).
    model.ir_version = max(8, helper.find_min_ir_version_for(model.opset_import)) if grammar >= 4 else 8
    data_shape = [samples, *(size if d in ("H", "W") else 6 if d == "L" else d for d in shape[1:])]
    if input_type == TensorProto.INT64:
        data = {"x": rng.integers(0, 20, data_shape).astype(np.int64)}
    else:
        data = {"x": rng.standard_normal(data_shape).astype(b.np_float)}
    for name, dims in b.extra_inputs:  # fed whole to every batch
        data[name] = (rng.standard_normal(dims) * 0.1).astype(b.np_float)
    # The outputs' shapes as ONNX Runtime computes them (onnx's inference leaves some open), batch axis as the input's.
    import onnxruntime as ort

    if "t" in (i.name for i in inputs):
        data["t"] = np.array(0.8, b.np_float)  # fed whole to every batch
    feeds = {"x": data["x"][: 1 if batch == 1 else 2], **{k: v for k, v in data.items() if k != "x"}}
    if float_type == TensorProto.BFLOAT16:  # ONNX Runtime's CPU provider runs few ops in bfloat16: the logits' shape only
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info(logits, float_type, [batch, classes]))
    else:
        values = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for output, value in zip(model.graph.output, values, strict=True):
            output.CopyFrom(helper.make_tensor_value_info(output.name, float_type, [batch, *value.shape[1:]]))
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    options: dict[str, Any] = {
        "weights": str(rng.choice(WEIGHTS_SINCE_10 if grammar >= 10 else WEIGHTS)),
        "activations": ACTIVATION_TYPES[int(rng.integers(len(ACTIVATION_TYPES)))],
        "granularity": str(rng.choice(["per-tensor", "per-channel", "blocked"])),
        "method": str(rng.choice(["minmax", "mse", "percentile", "entropy"])),
        "promote": bool(rng.random() < 0.15),
    }
    if rng.random() < 0.3:
        options["bias_correction"] = bool(rng.random() < 0.5)
    if rng.random() < 0.2:
        options["smoothquant"] = bool(rng.random() < 0.5)
    if rng.random() < 0.15:
        compute = [nd for nd in b.nodes if nd.op_type in ("Conv", "Gemm", "MatMul")]
        options["exclude"] = (str(rng.choice([nd.name for nd in compute])),)
        if grammar >= 7:  # the pattern's every form: a name, an op type, a glob, an expression, a region from the input
            chosen = compute[int(rng.integers(len(compute)))]
            forms = [
                chosen.name,
                chosen.op_type,
                f"{chosen.op_type.lower()}*",
                f"re:^{chosen.op_type.lower()}\\d+",
                f"x..{chosen.name}",
            ]
            options["exclude"] = (forms[int(rng.integers(len(forms)))],)
    for name, share in (("symmetric", 0.1), ("equalize", 0.1), ("empirical_bias_correction", 0.1)):
        if rng.random() < share:
            options[name] = True
    if rng.random() < 0.1:
        options["weight_clip"] = "mse"
    if grammar >= 10:
        _options_since_10(rng, options)
    if grammar >= 11:
        _options_since_11(rng, options)
    if grammar >= 12 and rng.random() < 0.1:  # placed for, calibrated, judged and timed on OpenVINO
        options["target"] = "openvino"
    return FuzzCase(seed, model, data, options, desc)


def _options_since_10(rng: np.random.Generator, options: dict[str, Any]) -> None:
    """Grammar 10's options: block sizes, the algorithms that round or rewrite, fine-tuning, and every form of target."""
    if options["granularity"] == "blocked" and rng.random() < 0.5:
        options["block_size"] = int(rng.choice([16, 64, 128]))
    for name, share in (("gptq", 0.1), ("awq", 0.1), ("equalize_depthwise", 0.1)):
        if rng.random() < share:
            options[name] = bool(rng.random() < 0.7)
    if rng.random() < 0.03:
        options["finetune"] = 2
    goal = rng.random()
    if goal < 0.06:
        options["target_agreement"] = 0.99
    elif goal < 0.12:
        options["target_sqnr_db"] = float(rng.choice([20.0, 40.0]))
    elif goal < 0.16:
        options["metric"], options["target_metric"] = mean_closeness, -0.05
    elif goal < 0.19:
        options["latency_budget"] = float(rng.choice([0.8, 1.5]))
    if rng.random() < 0.08:
        options["max_float"] = float(rng.choice([0.0, 0.5, 1.0]))


def _options_since_11(rng: np.random.Generator, options: dict[str, Any]) -> None:
    """Grammar 11's options: the least-error weight scales, and ONNX Runtime's MatMulNBits form."""
    if rng.random() < 0.1:
        options["weight_clip"] = "search"
    if options.get("activations", "uint8") is None and options["granularity"] == "blocked" and rng.random() < 0.4:
        options["format"] = "matmulnbits"


def mean_closeness(float_outputs: dict, quantized_outputs: dict, labels: Any) -> float:
    """A user's metric: minus the mean absolute difference of the first outputs (higher is better)."""
    ref, got = (np.asarray(next(iter(o.values())), np.float64) for o in (float_outputs, quantized_outputs))
    return -float(np.mean(np.abs(ref - got)))
