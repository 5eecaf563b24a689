"""export_onnx: standard QDQ models whose outputs equal the torch eval forward."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto  # noqa: E402
from torch import nn  # noqa: E402

import qlinear  # noqa: E402
import qlinear.onnx as qonnx  # noqa: E402
import qlinear.torch as qt  # noqa: E402

CONFIGS = {
    "int8_per_channel": (qt.QuantSpec("int8", axis=0), qt.QuantSpec("uint8", symmetric=False), TensorProto.INT8),
    "int4_blocked": (qt.QuantSpec("int4", axis=1, block_size=8), None, TensorProto.INT4),
    "float8e4m3fn": (qt.QuantSpec("float8e4m3fn", axis=0), qt.QuantSpec("float8e4m3fn"), TensorProto.FLOAT8E4M3FN),
}


def _model(weight, activation):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 20), nn.ReLU(), nn.Linear(20, 5)
    )
    with warnings.catch_warnings():
        # Blocks of 8 do not fit the first convolution's single input channel: it goes per output channel
        # (tests/test_torch_scales.py checks that warning); the Linear layers keep their blocks.
        warnings.filterwarnings("ignore", message=r"quantize_modules: 0: blocks of 8 along axis 1 of size 1")
        qt.quantize_modules(model, qt.QuantConfig(weight=weight, activation=activation))
    model.train()
    model(torch.randn(16, 1, 6, 6))  # observe activation ranges
    return model.eval()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("backend", ["qlinear", "onnxruntime"])
def test_export_round_trip(config, backend, tmp_path):
    weight, activation, weight_type = CONFIGS[config]
    model = _model(weight, activation)
    x = torch.randn(3, 1, 6, 6)
    proto = qt.export_onnx(model, x, tmp_path / "model.onnx", opset=21)
    assert {n.domain for n in proto.graph.node} == {""}
    got = qonnx.run(str(tmp_path / "model.onnx"), {"input": x.numpy()}, backend=backend)
    want = model(x).detach().numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-5)
    weights = [i for i in proto.graph.initializer if i.name.startswith("weight_q")]
    assert len(weights) == 3 and all(w.data_type == weight_type for w in weights)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_exported_weights_are_the_fake_quantized_weights(config):
    weight, activation, _ = CONFIGS[config]
    model = _model(weight, activation)
    proto = qt.export_onnx(model, torch.randn(2, 1, 6, 6), None, opset=21)
    tensors = {i.name: qlinear.from_tensor_proto(i) for i in proto.graph.initializer}
    dq_nodes = [n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("weight_q")]
    layers = [m for m in model if isinstance(m, qt.QuantizedModule)]
    for node, layer in zip(dq_nodes, layers, strict=True):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w = qlinear.dequantize_linear(*(tensors[i] for i in node.input), **attrs)
        want = layer.weight_quant(layer.layer.weight).detach().numpy()
        assert np.array_equal(w.view(np.uint32), want.view(np.uint32))


def test_quantized_outputs_are_bit_identical():
    s = torch.tensor([0.05, 0.1, 0.2])
    model = nn.Sequential(qt.QuantizeLinear("int8", qparams="fixed", axis=1, scale=s, zero_point=torch.tensor([0.0, 3.0, -4.0])))
    x = torch.randn(50, 3) * 10
    proto = qt.export_onnx(model, x, None, opset=21)
    assert proto.graph.output[0].type.tensor_type.elem_type == TensorProto.INT8
    for backend in ("qlinear", "onnxruntime", "reference"):
        got = next(iter(qonnx.run(proto, {"input": x.numpy()}, backend=backend).values()))
        assert np.array_equal(got.astype(np.float32), model.eval()(x).numpy())


def test_float8_fake_quantize_output_bit_identical():
    model = nn.Sequential(qt.FakeQuantize("float8e4m3fn", qparams="fixed", scale=torch.tensor(0.01)))
    x = torch.randn(200) * 3
    proto = qt.export_onnx(model, x[None], None, opset=21)
    got = next(iter(qonnx.run(proto, {"input": x[None].numpy()}, backend="qlinear").values()))
    assert np.array_equal(got.view(np.uint32), model.eval()(x[None]).numpy().view(np.uint32))


def test_shape_inference_types_every_tensor():
    model = _model(*CONFIGS["int4_blocked"][:2])
    proto = qt.export_onnx(model, torch.randn(2, 1, 6, 6), None, opset=21)
    typed = {v.name for v in proto.graph.value_info}
    assert all(n.output[0] in typed for n in proto.graph.node[:-1])
    assert [d.dim_param or d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim] == ["N", 5]


def test_export_refuses_type_newer_than_opset():
    model = nn.Sequential(qt.FakeQuantize("float4e2m1", qparams="fixed", scale=torch.tensor(0.5)))
    with pytest.raises(qlinear.QuantizationError, match=r"export_onnx: .*float4.*version 21"):
        qt.export_onnx(model, torch.randn(1, 4), None, opset=21)
    assert qt.export_onnx(model, torch.randn(1, 4), None, opset=23).opset_import[0].version == 23


def test_export_refuses_unknown_module():
    # The node-by-node path names what it cannot write; by default such a model goes through torch.onnx.
    with pytest.raises(qlinear.QuantizationError, match="GELU"):
        qt.export_onnx(nn.Sequential(nn.GELU()), torch.randn(1, 4), None, dynamo=False)
    pytest.importorskip("onnxscript")
    proto = qt.export_onnx(nn.Sequential(nn.GELU()), torch.randn(1, 4), None)
    assert [n.op_type for n in proto.graph.node] == ["Gelu"]
