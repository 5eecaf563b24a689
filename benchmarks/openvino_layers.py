"""What OpenVINO's CPU plugin makes of small QDQ layouts: the evidence behind ``--target openvino``'s placement.

Each probe is one small ONNX model (a 3x3 Conv of 16 -> 32 channels on
16x16, or a MatMul of 64 -> 32), compiled by OpenVINO's CPU plugin at one
thread and f32 precision; the line printed for it is the runtime node
that took in the probe's Conv or MatMul (by the node's name, or by its
output's, which the plugin names a node by too): its layer type and kernel
(``primitiveType``, whose ``I8`` suffix marks an integer kernel).

    python benchmarks/openvino_layers.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)
C, K, HW = 16, 32, 16


def _qdq(x: str, out: str, scale, zero_point, axis: int | None = None) -> tuple[list, list]:
    """QuantizeLinear -> DequantizeLinear of activation ``x``; the zero point's dtype picks the type."""
    kw = {} if axis is None else {"axis": axis}
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), f"{x}_s"), numpy_helper.from_array(zero_point, f"{x}_z")]
    nodes = [
        helper.make_node("QuantizeLinear", [x, f"{x}_s", f"{x}_z"], [f"{x}_q"], name=f"{x}_Q", **kw),
        helper.make_node("DequantizeLinear", [f"{x}_q", f"{x}_s", f"{x}_z"], [out], name=f"{x}_DQ", **kw),
    ]
    return nodes, inits


def _weight(name: str, w: np.ndarray, axis: int, zero_point: int = 0) -> tuple[list, list]:
    """Stored int8 codes of ``w`` per channel along ``axis``, and their DequantizeLinear."""
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    scale = np.abs(w).max(axis=reduce) / 127
    shape = [1] * w.ndim
    shape[axis] = -1
    codes = np.clip(np.rint(w / scale.reshape(shape)) + zero_point, -128, 127).astype(np.int8)
    inits = [numpy_helper.from_array(codes, f"{name}_q"), numpy_helper.from_array(scale.astype(np.float32), f"{name}_s"),
             numpy_helper.from_array(np.full(scale.shape, zero_point, np.int8), f"{name}_z")]  # fmt: skip
    return [
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name], name=f"{name}_DQ", axis=axis)
    ], inits


def _conv(activation: dict | None, *, weight_zero_point: int = 0, concat_scales: tuple | None = None) -> onnx.ModelProto:
    w = (RNG.standard_normal((K, C, 3, 3)) * 0.1).astype(np.float32)
    nodes, inits = _weight("w", w, 0, weight_zero_point)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])]
    source = "x"
    if concat_scales is not None:  # two halves of the channels, each quantized, joined by a Concat
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, C // 2, HW, HW]) for n in ("a", "b")]
        for name, scale in zip(("a", "b"), concat_scales, strict=True):
            n, i = _qdq(name, f"{name}_v", scale, np.uint8(0))
            nodes, inits = nodes + n, inits + i
        nodes.append(helper.make_node("Concat", ["a_v", "b_v"], ["cat"], name="cat", axis=1))
        n, i = _qdq("cat", "cat_v", max(concat_scales), np.uint8(0))
        nodes, inits, source = nodes + n, inits + i, "cat_v"
    elif activation is not None:
        n, i = _qdq("x", "x_v", **activation)
        nodes, inits, source = nodes + n, inits + i, "x_v"
    nodes.append(helper.make_node("Conv", [source, "w"], ["y"], name="conv", pads=[1, 1, 1, 1]))
    return _model(nodes, inits, inputs)


def _act_matmul(zero_point) -> onnx.ModelProto:
    """A MatMul of two activations, each quantized (attention's scores)."""
    nodes, inits = [], []
    for name, zp in (("a", zero_point), ("b", np.int8(0))):
        n, i = _qdq(name, f"{name}_v", 0.02, zp)
        nodes, inits = nodes + n, inits + i
    nodes.append(helper.make_node("MatMul", ["a_v", "b_v"], ["y"], name="conv"))
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 64]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 64, 8])]  # fmt: skip
    return _model(nodes, inits, inputs)


def _model(nodes: list, inits: list, inputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "probe", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


PROBES = {
    "Conv, uint8 activations (zero point 0), int8 weights": _conv({"scale": 0.02, "zero_point": np.uint8(0)}),
    "Conv, uint8 activations (zero point 128)": _conv({"scale": 0.02, "zero_point": np.uint8(128)}),
    "Conv, int8 activations": _conv({"scale": 0.02, "zero_point": np.int8(0)}),
    "Conv, per-channel activation scales": _conv(
        {"scale": np.linspace(0.01, 0.03, C), "zero_point": np.zeros(C, np.uint8), "axis": 1}
    ),
    "Conv, weights of zero point 5": _conv({"scale": 0.02, "zero_point": np.uint8(0)}, weight_zero_point=5),
    "Conv, uint16 activations": _conv({"scale": 0.0001, "zero_point": np.uint16(0)}),
    "Conv, weight-only": _conv(None),
    "Conv after a Concat of one scale": _conv(None, concat_scales=(0.02, 0.02)),
    "Conv after a Concat of two scales": _conv(None, concat_scales=(0.02, 0.05)),
    "MatMul of activations, int8 (zero point 0)": _act_matmul(np.int8(0)),
    "MatMul of activations, uint8 (zero point 128)": _act_matmul(np.uint8(128)),
}


def main() -> None:
    import openvino

    core = openvino.Core()
    print(f"OpenVINO {openvino.__version__}, {core.get_property('CPU', 'FULL_DEVICE_NAME')}")
    print("| probe | runs as | kernel | integer |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for label, model in PROBES.items():
            path = Path(folder) / "probe.onnx"
            onnx.save(model, path)
            compiled = core.compile_model(
                core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}
            )
            found = ("-", "-")
            for op in compiled.get_runtime_model().get_ops():
                info = op.get_rt_info()
                names = str(info["originalLayersNames"].astype(str)).split(",") if "originalLayersNames" in info else []
                # The plugin names a node by the ONNX node's name or by its output's ("y", "y_original").
                if any(n in ("conv", "y", "y_original") or n.startswith("conv/") for n in names):
                    found = (str(info["layerType"].astype(str)), str(info["primitiveType"].astype(str)))
            print(f"| {label} | {found[0]} | {found[1]} | {'yes' if found[1].lower().endswith('i8') else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
