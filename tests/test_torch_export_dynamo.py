"""export_onnx of any model, through torch.onnx.export(dynamo=True): a residual CNN and a transformer block."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript", reason="export of models other than Sequential needs onnxscript (qlinear[torch])")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

import qlinear  # noqa: E402
import qlinear.onnx as qo  # noqa: E402
import qlinear.torch as qt  # noqa: E402
from qlinear._errors import QuantizationError  # noqa: E402

WEIGHTS = {
    "int8": (qt.QuantSpec("int8", axis=0), TensorProto.INT8),
    "int4_blocked": (qt.QuantSpec("int4", axis=1, block_size=8), TensorProto.INT4),
    "float8e4m3fn": (qt.QuantSpec("float8e4m3fn", axis=0), TensorProto.FLOAT8E4M3FN),
}


class ResidualCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(8, 16, 3, padding=1)
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.conv2(torch.relu(self.conv1(h))))  # the residual Add
        return self.head(h.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        attention = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5 + mask, dim=-1)  # additive mask
        x = x + self.out((attention @ v).transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def _quantized(make, weight: qt.QuantSpec, args: tuple) -> nn.Module:
    torch.manual_seed(0)
    model = qt.quantize_modules(make(), qt.QuantConfig(weight=weight))
    model.train()
    model(*args)  # observe the activations' ranges
    return model.eval()


def _inputs(make) -> tuple:
    torch.manual_seed(1)
    if make is ResidualCNN:
        return (torch.randn(4, 8, 8, 8),)
    mask = torch.triu(torch.full((6, 6), -3.4e38), diagonal=1)
    return torch.randn(2, 6, 32), mask


def _stored_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Each weight DequantizeLinear's output, from its stored codes, by qlinear's numpy reference."""
    values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    out = {}
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].endswith(".layer.weight_quantized"):
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            x, scale, *zp = (values[n] for n in node.input if n)
            out[node.input[0].removesuffix(".layer.weight_quantized")] = qlinear.dequantize_linear(
                x,
                scale,
                zp[0] if zp else None,
                axis=attrs.get("axis", 1),
                block_size=attrs.get("block_size", 0),
                backend="reference",
            )
    return out


@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("make", [ResidualCNN, TransformerBlock])
def test_any_model_exports_as_standard_qdq_with_weights_stored_quantized(make, weights):
    spec, stored_type = WEIGHTS[weights]
    args = _inputs(make)
    model = _quantized(make, spec, args)
    with torch.no_grad():
        want = model(*args).numpy()
    proto = qt.export_onnx(model, args, None, opset=23 if weights == "float4e2m1" else 21)
    onnx.checker.check_model(proto, full_check=True)
    assert {n.domain for n in proto.graph.node} <= {"", "ai.onnx"}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, qt.QuantizedModule)}
    # Every layer's weight is stored quantized (no float copy left) behind a DequantizeLinear ...
    float_weights = [t.name for t in proto.graph.initializer if t.name.endswith(".layer.weight")]
    assert float_weights == []
    stored = _stored_weights(proto)
    assert set(stored) == set(layers)
    assert {t.data_type for t in proto.graph.initializer if t.name.endswith("_quantized")} == {stored_type}
    # ... whose values are the torch forward's fake-quantized weights, bit for bit.
    with torch.no_grad():
        for name, layer in layers.items():
            w = layer.weight_quant(layer.layer.weight).numpy()
            assert np.array_equal(stored[name].view(np.uint32), w.view(np.uint32)), name
    feeds = {i.name: a.numpy() for i, a in zip(proto.graph.input, args, strict=True)}
    got = qo.run(proto, feeds, backend="onnxruntime")[proto.graph.output[0].name]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_activation_quantizers_become_quantize_dequantize_pairs():
    args = _inputs(ResidualCNN)
    model = _quantized(ResidualCNN, WEIGHTS["int8"][0], args)
    proto = qt.export_onnx(model, args, None)
    # One input quantizer a layer (uint8, its zero point calibrated), each a QuantizeLinear fed by a tensor.
    activation_q = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    assert len(activation_q) == 4
    zero_points = {t.name: t for t in proto.graph.initializer}
    assert {zero_points[n.input[2]].data_type for n in activation_q} == {TensorProto.UINT8}


def test_a_bad_scale_is_refused_with_the_module_named(tmp_path):
    args = _inputs(TransformerBlock)
    model = _quantized(TransformerBlock, qt.QuantSpec("int8", axis=0), args)
    with torch.no_grad():
        model.fc1.weight_quant.scale[3] = float("nan")
    with pytest.raises(QuantizationError, match=r"module 'fc1.weight_quant' \(FakeQuantize\) has 1 scale"):
        qt.export_onnx(model, args, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_an_unobserved_quantizer_is_refused():
    model = qt.quantize_modules(ResidualCNN())  # input quantizers never saw data
    with pytest.raises(QuantizationError, match=r"module 'stem.input_quant' \(FakeQuantize\) has no qparams yet"):
        qt.export_onnx(model.eval(), _inputs(ResidualCNN), None)


def test_the_written_model_loads_and_runs(tmp_path):
    args = _inputs(TransformerBlock)
    model = _quantized(TransformerBlock, WEIGHTS["int4_blocked"][0], args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of the exporter's reaches the user
        qt.export_onnx(model, args, tmp_path / "block.onnx")
    onnx.checker.check_model(str(tmp_path / "block.onnx"), full_check=True)
    loaded = qo.load(tmp_path / "block.onnx")
    feeds = {i.name: a.numpy() for i, a in zip(loaded.graph.input, args, strict=True)}
    with torch.no_grad():
        want = model(*args).numpy()
    got = qo.run(loaded, feeds, backend="onnxruntime")[loaded.graph.output[0].name]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
