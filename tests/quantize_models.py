"""Small float models for the quantizer's tests, built op by op with qlinear.onnx.Graph."""

from __future__ import annotations

import numpy as np
import onnx

import qlinear.onnx as qo

RNG_SEED = 0


def _w(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def single_op(op: str, *, opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of one compute op (with bias where it has one) after a Relu, and calibration data for it."""
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph(f"one_{op.lower()}", opset=opset)
    if op in ("Conv", "ConvTranspose"):
        x = g.input("x", "float", ("N", 8, 6, 6))
        h = g.op("Relu", [x], name="relu_in")
        w = _w(rng, 16, 8, 3, 3) if op == "Conv" else _w(rng, 8, 16, 3, 3)
        y = g.op(op, [h, w, _w(rng, 16)], name="layer", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        data = rng.standard_normal((40, 8, 6, 6)).astype(np.float32)
    else:
        x = g.input("x", "float", ("N", 64))
        h = g.op("Relu", [x], name="relu_in")
        if op == "Gemm":
            y = g.op("Gemm", [h, _w(rng, 48, 64), _w(rng, 48)], name="layer", transB=1)
        else:
            y = g.op("MatMul", [h, _w(rng, 64, 48)], name="layer")
        data = rng.standard_normal((40, 64)).astype(np.float32)
    g.output(g.op("Relu", [y], name="relu_out", output_names=["y"]))
    return g.to_model(), {"x": data}


def layernorm_attention(*, mask_value: float = -3.4e38) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Token embedding, one attention block with an additive mask, a LayerNorm written out, and a head.

    The traps of real transformers: a LayerNorm as ReduceMean/Sub/Mul/Div,
    an additive attention mask of ``mask_value``, residual Adds, an
    embedding Gather and weights held in a Constant node.
    """
    rng = np.random.default_rng(RNG_SEED)
    d, t, vocab = 32, 12, 50
    g = qo.Graph("tiny_transformer", opset=17)
    ids = g.input("ids", "int64", ("N", t))
    mask = g.input("mask", "float", ("N", 1, t))
    table = (rng.standard_normal((vocab, d)) * 0.5).astype(np.float32)
    x = g.op("Gather", [table, ids], name="embed")
    mean = g.op("ReduceMean", [x], name="ln_mean", axes=[-1], keepdims=1)
    c = g.op("Sub", [x, mean], name="ln_sub")
    var = g.op("ReduceMean", [g.op("Mul", [c, c], name="ln_sq")], name="ln_var", axes=[-1], keepdims=1)
    h = g.op("Div", [c, g.op("Sqrt", [g.op("Add", [var, np.float32(1e-5)], name="ln_eps")], name="ln_sqrt")], name="ln_div")
    q = g.op("MatMul", [h, _w(rng, d, d)], name="q_proj")
    k = g.op("MatMul", [h, _w(rng, d, d)], name="k_proj")
    v = g.op("MatMul", [h, _w(rng, d, d)], name="v_proj")
    scores = g.op("MatMul", [q, g.op("Transpose", [k], name="k_t", perm=[0, 2, 1])], name="scores")
    # The mask is 0 where attention is allowed and mask_value where not.
    masked = g.op("Add", [g.op("Mul", [scores, np.float32(d**-0.5)], name="scale"), mask], name="add_mask")
    attn = g.op("Softmax", [masked], name="softmax", axis=-1)
    ctx = g.op("MatMul", [attn, v], name="context")
    wo = g.op("Constant", [], name="o_weight", value=onnx.numpy_helper.from_array(_w(rng, d, d), "o_weight"))
    x = g.op("Add", [x, g.op("MatMul", [ctx, wo], name="o_proj")], name="residual")
    pooled = g.op("ReduceMean", [x], name="pool", axes=[1], keepdims=0)
    g.output(g.op("Gemm", [pooled, _w(rng, 10, d), _w(rng, 10)], name="head", transB=1, output_names=["logits"]))
    n = 48
    ids_data = rng.integers(0, vocab, (n, t)).astype(np.int64)
    lengths = rng.integers(3, t + 1, n)
    mask_data = np.where(np.arange(t)[None, None, :] < lengths[:, None, None], 0.0, mask_value).astype(np.float32)
    return g.to_model(), {"ids": ids_data, "mask": mask_data}


def detection_head(*, separate: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Conv backbone whose output concatenates box coordinates (0-320) with class scores (0-1).

    ``separate``: boxes and scores are two outputs, in that order (as SSD-style exports give them).
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("detector", opset=17)
    x = g.input("image", "float", ("N", 3, 8, 8))
    h = g.op("Relu", [g.op("Conv", [x, _w(rng, 8, 3, 3, 3), _w(rng, 8)], name="backbone", pads=[1, 1, 1, 1])], name="act")
    flat = g.op("Flatten", [h], name="flat")
    boxes = g.op(
        "Mul",
        [
            g.op("Sigmoid", [g.op("Gemm", [flat, _w(rng, 4, 512, scale=0.05)], name="box_fc", transB=1)], name="box_sig"),
            np.float32(320),
        ],
        name="box_px",
    )
    scores = g.op(
        "Softmax", [g.op("Gemm", [flat, _w(rng, 3, 512, scale=0.05)], name="cls_fc", transB=1)], name="cls_prob", axis=-1
    )
    if separate:
        g.output(g.op("Identity", [boxes], name="box_out", output_names=["boxes"]))
        g.output(g.op("Identity", [scores], name="score_out", output_names=["scores"]))
    else:
        g.output(g.op("Concat", [boxes, scores], name="detections", axis=-1, output_names=["detections"]))
    return g.to_model(), {"image": rng.uniform(0, 1, (32, 3, 8, 8)).astype(np.float32)}


def yolo_head(
    *, classes: int = 3, samples: int = 160, anchors_first: bool = False
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A YOLOv8-shaped detector: one output ``(N, 4 + C, 64)``, box centres and sizes in pixels, then Sigmoid class scores.

    Two Conv layers make an 8 x 8 grid of anchors over a 16 x 16 image;
    a box Conv gives each anchor's offsets and sizes, which a constant grid
    and a scale turn into pixels; a class Conv with a negative bias gives
    scores, a few of them above 0.25 an image. Boxes and scores meet in a
    Concat along axis 1, as the YOLOv8 export writes them (``anchors_first``:
    both transposed first, and the Concat along axis 2: ``(N, 64, 4 + C)``).
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("yolo_head", opset=17)
    x = g.input("images", "float", ("N", 3, 16, 16))
    h = g.op("Relu", [g.op("Conv", [x, _w(rng, 16, 3, 3, 3), _w(rng, 16)], name="stem", pads=[1] * 4)], name="stem_act")
    h = g.op("Conv", [h, _w(rng, 16, 16, 3, 3, scale=0.15), _w(rng, 16)], name="down", pads=[1] * 4, strides=[2, 2])
    h = g.op("Relu", [h], name="down_act")
    box = g.op("Reshape", [g.op("Conv", [h, _w(rng, 4, 16, 1, 1, scale=0.2)], name="box_conv"), np.array([0, 4, -1], np.int64)],
               name="box_flat")  # fmt: skip
    grid = np.zeros((1, 4, 64), np.float32)
    grid[0, 0], grid[0, 1] = np.tile(np.arange(8) * 2 + 1, 8), np.repeat(np.arange(8) * 2 + 1, 8)  # anchor centres
    grid[0, 2:] = 12.0  # sizes around 12 pixels: neighbours of a class overlap, and suppression drops some
    box = g.op("Add", [g.op("Mul", [box, np.float32(1.5)], name="box_scale"), grid], name="box_px")
    logits = g.op("Conv", [h, _w(rng, classes, 16, 1, 1, scale=0.6), np.full(classes, -2.0, np.float32)], name="cls_conv")
    scores = g.op("Sigmoid", [g.op("Reshape", [logits, np.array([0, classes, -1], np.int64)], name="cls_flat")], name="cls_sig")
    if anchors_first:
        box = g.op("Transpose", [box], name="box_t", perm=[0, 2, 1])
        scores = g.op("Transpose", [scores], name="cls_t", perm=[0, 2, 1])
    g.output(g.op("Concat", [box, scores], name="detections", axis=2 if anchors_first else 1, output_names=["output0"]))
    return g.to_model(), {"images": rng.uniform(0, 1, (samples, 3, 16, 16)).astype(np.float32)}


def outlier_mlp(*, outlier: float = 100.0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two MatMuls; the hidden activation between them has one channel ``outlier`` times the others.

    The outlier features of large transformers in small: under one
    per-tensor 8-bit scale, the second MatMul's input loses every channel
    but the large one, while the first MatMul quantizes well.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("outlier_mlp", opset=17)
    x = g.input("x", "float", ("N", 32))
    w1 = _w(rng, 32, 64)
    w1[:, 5] *= outlier
    h = g.op("MatMul", [x, w1], name="up")
    w2 = _w(rng, 64, 10)
    w2[5, :] /= outlier
    g.output(g.op("MatMul", [h, w2], name="down", output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((1000, 32)).astype(np.float32)}


def audio_front_end() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A keyword spotter's shape: waveform -> STFT -> power -> mel MatMul -> Log(x + 1e-6) -> Conv -> Gemm.

    The data are tones, not noise: a harmonic series on a random pitch
    under an attack-decay envelope, in quiet background noise, at gains
    from 0.01 to 1, so the power spectrum spans many decades, as speech's
    does.
    """
    rate, samples, frame, hop, bands = 8000, 2048, 128, 64, 16
    rng = np.random.default_rng(RNG_SEED)
    t = np.arange(samples) / rate
    waves = []
    for _ in range(200):
        f0 = rng.uniform(100, 600)
        tone = sum(np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 6.3)) / k for k in range(1, 8) if k * f0 < rate / 2)
        onset = rng.uniform(0, 0.12)
        envelope = np.where(t < onset, 0.0, np.exp(-(t - onset) * rng.uniform(4, 20)) * np.minimum(1, (t - onset) * 200))
        waves.append(rng.uniform(0.01, 1) * (tone * envelope + 0.003 * rng.standard_normal(samples)))
    bins = np.fft.rfftfreq(frame, 1 / rate)
    centers = np.geomspace(80, rate / 2, bands + 2)
    lo, mid, hi = centers[:-2, None], centers[1:-1, None], centers[2:, None]
    mel = np.maximum(0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid))).T.astype(np.float32)
    g = qo.Graph("audio_front_end", opset=17)
    wave = g.input("waveform", "float", ("N", samples))
    signal = g.op("Unsqueeze", [wave, np.array([-1], np.int64)], name="signal")
    window = np.hanning(frame + 1)[:-1].astype(np.float32)
    stft = g.op("STFT", [signal, np.array(hop, np.int64), window, np.array(frame, np.int64)], name="stft", onesided=1)
    power = g.op("ReduceSum", [g.op("Mul", [stft, stft], name="square"), np.array([-1], np.int64)], name="power", keepdims=0)
    logmel = g.op("Log", [g.op("Add", [g.op("MatMul", [power, mel], name="mel"), np.float32(1e-6)], name="floor")], name="log")
    h = g.op("Transpose", [logmel], name="channels_first", perm=[0, 2, 1])
    h = g.op("Relu", [g.op("Conv", [h, _w(rng, 12, bands, 3), _w(rng, 12)], name="conv", pads=[1, 1])], name="relu")
    h = g.op("ReduceMean", [h], name="time_mean", axes=[-1], keepdims=0)
    g.output(g.op("Gemm", [h, _w(rng, 5, 12), _w(rng, 5)], name="classifier", transB=1, output_names=["logits"]))
    return g.to_model(), {"waveform": np.stack(waves).astype(np.float32)}


def conv_batchnorm(*, branch: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two Conv -> BatchNormalization -> Relu layers (the first Conv without a bias), as exporters that keep the
    normalization write them, then a global average pool and a Gemm.

    ``branch``: the first Conv's output is also a graph output, so its normalization cannot be folded.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("conv_bn", opset=17)
    h = g.input("x", "float", ("N", 8, 12, 12))
    c = 8
    for i, co in enumerate((16, 24)):
        conv = g.op("Conv", [h, _w(rng, co, c, 3, 3)] + ([_w(rng, co)] if i else []), name=f"conv{i}", pads=[1, 1, 1, 1])
        if branch and i == 0:
            g.output(g.op("Identity", [conv], name="tap", output_names=["tap"]))
        stats = [rng.uniform(0.5, 1.5, co), rng.uniform(-0.2, 0.2, co), rng.uniform(-0.5, 0.5, co), rng.uniform(0.5, 2, co)]
        bn = g.op("BatchNormalization", [conv, *(s.astype(np.float32) for s in stats)], name=f"bn{i}", epsilon=1e-3)
        h = g.op("Relu", [bn], name=f"relu{i}")
        c = co
    h = g.op("ReduceMean", [h], name="gap", axes=[2, 3], keepdims=0)
    g.output(g.op("Gemm", [h, _w(rng, 10, c), _w(rng, 10)], name="fc", transB=1, output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((48, 8, 12, 12)).astype(np.float32)}


# How each gate of gated_convs is written: the operator, or as exporters write it out.
GATES = ("HardSwish", "hard_swish_written_out", "hard_sigmoid_product", "SiLU")


def gated_convs(gate: str, *, dtype: type = np.float32) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Three Conv layers, each followed by ``gate`` (one of :data:`GATES`), then a global average pool and a Gemm.

    ``hard_swish_written_out`` is ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)``
    (paddle2onnx's HardSwish); ``hard_sigmoid_product`` is
    ``Mul(x, HardSigmoid(x))`` (HardSwish as ONNX Runtime splits it).
    ``dtype``: the model's float type (``np.float16`` for a half-precision model).
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph(f"gated_{gate.lower()}", opset=17)
    h = g.input("x", np.dtype(dtype).name, ("N", 3, 16, 16))
    c = 3
    for i, co in enumerate((16, 16, 24)):
        weight, bias = _w(rng, co, c, 3, 3, scale=0.5).astype(dtype), _w(rng, co).astype(dtype)
        x = g.op("Conv", [h, weight, bias], name=f"conv{i}", pads=[1, 1, 1, 1])
        if gate == "HardSwish":
            h = g.op("HardSwish", [x], name=f"gate{i}")
        elif gate == "hard_swish_written_out":
            shifted = g.op("Add", [x, dtype(3)], name=f"gate{i}_add")
            clipped = g.op("Clip", [shifted, dtype(0), dtype(6)], name=f"gate{i}_clip")
            h = g.op("Div", [g.op("Mul", [x, clipped], name=f"gate{i}_mul"), dtype(6)], name=f"gate{i}")
        elif gate == "hard_sigmoid_product":
            h = g.op("Mul", [x, g.op("HardSigmoid", [x], name=f"gate{i}_hs", alpha=1 / 6, beta=0.5)], name=f"gate{i}")
        else:
            h = g.op("Mul", [x, g.op("Sigmoid", [x], name=f"gate{i}_sigmoid")], name=f"gate{i}")
        c = co
    h = g.op("ReduceMean", [h], name="gap", axes=[2, 3], keepdims=0)
    fc = [_w(rng, 10, c).astype(dtype), _w(rng, 10).astype(dtype)]
    g.output(g.op("Gemm", [h, *fc], name="fc", transB=1, output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((48, 3, 16, 16)).astype(dtype)}


def learnable_affine_blocks(*, per_channel: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """PP-OCRv4's learnable affine blocks: each Conv followed by ``* a + b``, a written-out HardSwish, then ``* c + d``.

    conv0 (3x3, padded) -> affine -> HardSwish -> affine -> conv1 (1x1, pads
    nothing) -> affine -> HardSwish -> affine -> conv2 (3x3 depthwise,
    padded) -> affine -> HardSwish -> pool -> Gemm. The maps' constants are
    scalars, as paddle2onnx writes them, or one a channel (``per_channel``).
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("learnable_affine", opset=17)
    h = g.input("x", "float32", ("N", 3, 16, 16))

    def affine(x, name, channels):
        shape = (1, channels, 1, 1) if per_channel else ()
        scale = rng.uniform(0.6, 1.4, shape).astype(np.float32)
        shift = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        return g.op("Add", [g.op("Mul", [scale, x], name=f"{name}_mul"), shift], name=f"{name}_add")

    def hard_swish(x, name):
        clipped = g.op(
            "Clip", [g.op("Add", [x, np.float32(3)], name=f"{name}_add"), np.float32(0), np.float32(6)], name=f"{name}_clip"
        )
        return g.op("Div", [g.op("Mul", [x, clipped], name=f"{name}_mul"), np.float32(6)], name=name)

    layers = (("conv0", 16, 3, 3, 1, [1, 1, 1, 1]), ("conv1", 24, 16, 1, 1, [0, 0, 0, 0]), ("conv2", 24, 1, 3, 24, [1, 1, 1, 1]))
    for i, (name, co, ci, k, group, pads) in enumerate(layers):
        x = g.op("Conv", [h, _w(rng, co, ci, k, k, scale=0.5), _w(rng, co)], name=name, pads=pads, group=group)
        h = hard_swish(affine(x, f"lab{i}a", co), f"gate{i}")
        if i < 2:
            h = affine(h, f"lab{i}b", co)
    h = g.op("ReduceMean", [h], name="gap", axes=[2, 3], keepdims=0)
    g.output(g.op("Gemm", [h, _w(rng, 10, 24), _w(rng, 10)], name="fc", transB=1, output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((48, 3, 16, 16)).astype(np.float32)}


def squeeze_excite(*, paddle: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Conv -> HardSwish layer, a squeeze-and-excitation block on it, a second Conv, a pool and a Gemm.

    The block (MobileNetV3, PP-LCNet): ``a * HardSigmoid(se2(Relu(se1(GlobalAveragePool(a)))))``
    with 1x1 Convs ``se1`` and ``se2``. ``paddle``: written as paddle2onnx
    writes it, each 1x1 Conv without a bias and followed by an ``Add`` of
    ``Reshape(Constant, Constant)`` and an ``Identity``.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("squeeze_excite" + ("_paddle" if paddle else ""), opset=17)
    x = g.input("x", "float", ("N", 3, 16, 16))
    a = g.op("HardSwish", [g.op("Conv", [x, _w(rng, 16, 3, 3, 3, scale=0.5), _w(rng, 16)], name="conv0", pads=[1, 1, 1, 1])])
    s = g.op("GlobalAveragePool", [a], name="squeeze")

    def conv1x1(h, co, ci, name):
        w, b = _w(rng, co, ci, 1, 1, scale=0.5), _w(rng, co)
        if not paddle:
            return g.op("Conv", [h, w, b], name=name)
        const = lambda v, n: g.op("Constant", [], name=n, value=onnx.numpy_helper.from_array(v, n))  # noqa: E731
        bias = g.op("Reshape", [const(b, f"{name}_b"), const(np.array([1, co, 1, 1], np.int64), f"{name}_shape")])
        added = g.op("Add", [g.op("Conv", [h, w], name=name), bias], name=f"{name}_add")
        return g.op("Identity", [added], name=f"{name}_identity")

    e = g.op("Relu", [conv1x1(s, 4, 16, "se1")], name="se_relu")
    gate = g.op("HardSigmoid", [conv1x1(e, 16, 4, "se2")], name="se_gate", alpha=1 / 6, beta=0.5)
    h = g.op("Mul", [a, gate], name="excite")
    h = g.op("Relu", [g.op("Conv", [h, _w(rng, 24, 16, 3, 3), _w(rng, 24)], name="conv1", pads=[1, 1, 1, 1])])
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h], name="pool")], name="flat")
    g.output(g.op("Gemm", [h, _w(rng, 10, 24), _w(rng, 10)], name="fc", transB=1, output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((48, 3, 16, 16)).astype(np.float32)}


def feature_pyramid(*, resize_mode: str = "nearest") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A text detector's neck in small: two levels, each a Conv with a residual squeeze-and-excitation gate, the coarse one
    upsampled and added to the fine one, the levels concatenated, then a Conv and a Sigmoid head.

    Level ``k``: ``f = conv_k(x)``, ``r = f + f * HardSigmoid(se_k(f))`` (Add ``res_k``, Mul ``gate_k``); then
    ``top = Resize(r1) + r0`` (``sum``), ``Concat(Resize(r1), top)`` (``levels``) -> ``head`` -> Sigmoid. A side
    branch ``side = r0 + top`` (``side_sum``) feeds only the float ReduceMean of a second output.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("feature_pyramid", opset=17)
    x = g.input("x", "float", ("N", 3, 16, 16))
    stem = g.op("Relu", [g.op("Conv", [x, _w(rng, 8, 3, 3, 3, scale=0.5), _w(rng, 8)], name="stem", pads=[1, 1, 1, 1])])
    levels = []
    for k, stride in enumerate((1, 2)):
        f = g.op("Conv", [stem, _w(rng, 8, 8, 3, 3, scale=0.3), _w(rng, 8)], name=f"conv{k}", pads=[1, 1, 1, 1],
                 strides=[stride, stride])  # fmt: skip
        se = g.op("Conv", [g.op("GlobalAveragePool", [f], name=f"pool{k}"), _w(rng, 8, 8, 1, 1, scale=0.5), _w(rng, 8)],
                  name=f"se{k}")  # fmt: skip
        gated = g.op("Mul", [f, g.op("HardSigmoid", [se], name=f"hsig{k}")], name=f"gate{k}")
        levels.append(g.op("Add", [f, gated], name=f"res{k}"))
    scales = np.array([1, 1, 2, 2], np.float32)
    up = g.op("Resize", [levels[1], np.array([], np.float32), scales], name="up", mode=resize_mode)
    top = g.op("Add", [up, levels[0]], name="sum")
    joined = g.op("Concat", [up, top], name="levels", axis=1)
    head = g.op("Conv", [joined, _w(rng, 1, 16, 3, 3, scale=0.3), _w(rng, 1)], name="head", pads=[1, 1, 1, 1])
    g.output(g.op("Sigmoid", [head], name="prob", output_names=["prob"]))
    side = g.op("Add", [levels[0], top], name="side_sum")
    g.output(g.op("ReduceMean", [side], name="side_mean", keepdims=0, output_names=["side"]))
    return g.to_model(), {"x": rng.standard_normal((48, 3, 16, 16)).astype(np.float32)}


def dense_on_sequences(shape=(4, 12, 32), opset=17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two MatMul + bias layers and a MatMul head on a 3-D input of ``shape`` (48 x 12 x 32 samples).

    A fixed shape is a transformer exported at a fixed sequence length; ("N", "T", 32) one exported with a dynamic batch
    and length.
    """
    rng = np.random.default_rng(0)
    g = qo.Graph("fixed_shape", opset=opset)
    x = g.input("x", "float", shape)
    h = g.op(
        "Add",
        [
            g.op("MatMul", [x, (rng.standard_normal((32, 64)) * 0.2).astype(np.float32)], name="fc1"),
            (rng.standard_normal(64) * 0.1).astype(np.float32),
        ],
        name="b1",
    )
    h = g.op(
        "Add",
        [
            g.op("MatMul", [g.op("Relu", [h]), (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)], name="fc2"),
            (rng.standard_normal(32) * 0.1).astype(np.float32),
        ],
        name="b2",
    )
    g.output(g.op("MatMul", [h, (rng.standard_normal((32, 10)) * 0.2).astype(np.float32)], name="head", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((48, 12, 32)).astype(np.float32)}


def shared_weight(size: int = 256) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two MatMuls in a row reading one ``size`` x ``size`` weight ``W`` (named mm1 and mm2)."""
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("shared", opset=17)
    w = (rng.standard_normal((size, size)) * 0.1).astype(np.float32)
    x = g.input("x", "float", ("N", size))
    g.initializer("W", w)
    g.output(g.op("MatMul", [g.op("MatMul", [x, "W"], name="mm1"), "W"], name="mm2", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((64, size)).astype(np.float32)}


# How the input of depthwise_block's depthwise Conv is computed.
DEPTHWISE_PRODUCERS = ("conv", "affine", "hardswish")


def depthwise_block(producer: str = "conv") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A 1x1 Conv whose 16 output channels span ranges about 1 to 10 apart, a 3x3 depthwise Conv
    that brings them back to one range, a Relu, a 1x1 Conv.

    ``producer`` (one of :data:`DEPTHWISE_PRODUCERS`) computes the depthwise
    Conv's input from the first Conv: ``conv`` is the Conv itself,
    ``affine`` a HardSwish then a Mul and an Add by one constant a channel
    (a map no fold takes into the depthwise Conv, which pads: the value it
    sends to 0 differs by channel), ``hardswish`` the HardSwish alone.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph(f"depthwise_{producer}", opset=17)
    x = g.input("x", "float", ("N", 8, 12, 12))
    spread = np.geomspace(1.0, 8.0, 16)[rng.permutation(16)].astype(np.float32)
    h = g.op("Conv", [x, _w(rng, 16, 8, 1, 1) * spread[:, None, None, None], _w(rng, 16) * spread], name="pointwise0")
    if producer != "conv":
        h = g.op("HardSwish", [h], name="hardswish")
    if producer == "affine":
        scale = np.linspace(0.7, 0.9, 16, dtype=np.float32).reshape(1, 16, 1, 1)
        shift = np.linspace(0.05, 0.15, 16, dtype=np.float32).reshape(1, 16, 1, 1)
        h = g.op("Add", [g.op("Mul", [h, scale], name="affine_mul"), shift], name="affine_add")
    # The depthwise filters bring the channels back to one range, as a trained layer's normalization does.
    filters = _w(rng, 16, 1, 3, 3) / spread[:, None, None, None]
    h = g.op("Conv", [h, filters, _w(rng, 16)], name="depthwise", group=16, pads=[1, 1, 1, 1])
    g.output(
        g.op("Conv", [g.op("Relu", [h], name="relu"), _w(rng, 12, 16, 1, 1), _w(rng, 12)], name="pointwise1", output_names=["y"])
    )
    return g.to_model(), {"x": rng.standard_normal((96, 8, 12, 12)).astype(np.float32)}


def data_movement(nodes: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two Convs with ``nodes`` data-movement nodes between them, then a pool and a Gemm.

    The nodes come in rounds of Reshape (to a sequence), Transpose, Transpose
    back, Cast (float to float), Slice (the whole tensor) and Reshape back,
    as exporters write them around attention and layout changes: the
    function is the identity, the graph hundreds of nodes long.
    """
    rng = np.random.default_rng(RNG_SEED)
    g = qo.Graph("data_movement", opset=17)
    h = g.op("Conv", [g.input("x", "float", ("N", 8, 12, 12)), _w(rng, 8, 8, 3, 3), _w(rng, 8)], name="conv0", pads=[1, 1, 1, 1])
    h = g.op("Relu", [h], name="relu0")
    rounds = [
        ("Reshape", lambda t, k: g.op("Reshape", [t, np.array([0, 8, 144], np.int64)], name=f"flat{k}")),
        ("Transpose", lambda t, k: g.op("Transpose", [t], name=f"swap{k}", perm=[0, 2, 1])),
        ("Transpose", lambda t, k: g.op("Transpose", [t], name=f"back{k}", perm=[0, 2, 1])),
        ("Cast", lambda t, k: g.op("Cast", [t], name=f"cast{k}", to=onnx.TensorProto.FLOAT)),
        ("Slice", lambda t, k: g.op("Slice", [t, np.array([0], np.int64), np.array([144], np.int64), np.array([2], np.int64)],
                                    name=f"slice{k}")),
        ("Reshape", lambda t, k: g.op("Reshape", [t, np.array([0, 8, 12, 12], np.int64)], name=f"image{k}")),
    ]  # fmt: skip
    for k in range(nodes):
        h = rounds[k % len(rounds)][1](h, k)
    if nodes % len(rounds):  # back to an image whatever the count
        h = g.op("Reshape", [h, np.array([0, 8, 12, 12], np.int64)], name="image")
    h = g.op("Relu", [g.op("Conv", [h, _w(rng, 16, 8, 3, 3), _w(rng, 16)], name="conv1", pads=[1, 1, 1, 1])], name="relu1")
    h = g.op("ReduceMean", [h], name="gap", axes=[2, 3], keepdims=0)
    g.output(g.op("Gemm", [h, _w(rng, 10, 16), _w(rng, 10)], name="fc", transB=1, output_names=["logits"]))
    return g.to_model(), {"x": rng.standard_normal((48, 8, 12, 12)).astype(np.float32)}
