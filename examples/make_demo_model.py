"""Train the models that ship with qlinear (`qlinear quantize --demo` and the tests), and write them with their data.

Two CNNs on the 8x8 handwritten digits that ship with scikit-learn (from
the UCI "Optical Recognition of Handwritten Digits" set, E. Alpaydin and
C. Kaynak, 1998; no download), written as real exported models are:

- ``digits_cnn.onnx``, the tests' model: Conv + Relu + MaxPool twice, then
  Flatten; a LayerNorm written out as ReduceMean / Sub / Mul / ReduceMean /
  Add / Sqrt / Div / Mul / Add (what exporters produce for older opsets);
  Gemm + Relu, then a MatMul whose weight is held in a Constant node and a
  bias Add, giving the logits. It runs in tens of microseconds, so its Q/DQ
  cost more than its integer kernels save;
- ``digits_resized_cnn.onnx``, the demo's: the image resized to 16x16 in
  the graph (as exported preprocessing is), three Conv + Relu (32, 64 and
  128 channels, a MaxPool after the first and the last), a
  GlobalAveragePool, then the same LayerNorm and head. Its convolutions do
  enough work for ONNX Runtime's integer kernels to pay, as a real CNN's do.

The outputs go to ``src/qlinear/quantize/_demo/``, with
``digits_calibration.npz`` (300 training images) and ``digits_eval.npz``
(the 450 held-out images and their labels), which both models read.

    pip install -e '.[examples]'
    python examples/make_demo_model.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import qlinear.onnx as qo

OUT = Path(__file__).resolve().parent.parent / "src" / "qlinear" / "quantize" / "_demo"
OPSET = 17


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.norm = nn.LayerNorm(128)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.norm(x.flatten(1))
        return self.fc2(torch.relu(self.fc1(x)))


class DigitsResizedCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.norm = nn.LayerNorm(128)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.relu(self.conv2(x))
        x = nn.functional.max_pool2d(torch.relu(self.conv3(x)), 2)
        x = self.norm(x.mean((2, 3)))
        return self.fc2(torch.relu(self.fc1(x)))


def train(x: torch.Tensor, y: torch.Tensor, kind: type[nn.Module] = DigitsCNN, lr: float = 3e-3) -> nn.Module:
    torch.manual_seed(0)
    model = kind()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        for batch in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval()


def to_onnx(model: DigitsCNN) -> onnx.ModelProto:
    """The trained tests' model as an ONNX graph, op by op."""
    p = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    g = qo.Graph("digits_cnn", opset=OPSET)
    x = g.input("image", "float", ("N", 1, 8, 8))
    for i in (1, 2):
        x = g.op("Conv", [x, p[f"conv{i}.weight"], p[f"conv{i}.bias"]], name=f"conv{i}", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        x = g.op("Relu", [x], name=f"relu{i}")
        x = g.op("MaxPool", [x], name=f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Flatten", [x], name="flatten")
    _head(g, x, p, model.norm.eps, "relu3")
    return g.to_model()


def resized_to_onnx(model: DigitsResizedCNN) -> onnx.ModelProto:
    """The trained demo model as an ONNX graph, op by op."""
    p = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    g = qo.Graph("digits_resized_cnn", opset=OPSET)
    x = g.input("image", "float", ("N", 1, 8, 8))
    scales = np.array([1, 1, 2, 2], np.float32)
    x = g.op("Resize", [x, None, scales], name="resize", mode="linear", coordinate_transformation_mode="half_pixel")
    for i in (1, 2, 3):
        x = g.op("Conv", [x, p[f"conv{i}.weight"], p[f"conv{i}.bias"]], name=f"conv{i}", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        x = g.op("Relu", [x], name=f"relu{i}")
        if i != 2:
            x = g.op("MaxPool", [x], name=f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], name="pool")], name="flatten")
    _head(g, x, p, model.norm.eps, "relu4")
    return g.to_model()


def _head(g: qo.Graph, x: str, p: dict[str, np.ndarray], eps: float, relu: str) -> None:
    """The LayerNorm written out, Gemm + Relu and the MatMul with a Constant weight and its bias: the logits."""
    mean = g.op("ReduceMean", [x], name="norm_mean", axes=[-1], keepdims=1)
    d = g.op("Sub", [x, mean], name="norm_sub")
    var = g.op("ReduceMean", [g.op("Mul", [d, d], name="norm_square")], name="norm_var", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, np.float32(eps)], name="norm_eps")], name="norm_sqrt")
    x = g.op("Div", [d, std], name="norm_div")
    x = g.op("Add", [g.op("Mul", [x, p["norm.weight"]], name="norm_gamma"), p["norm.bias"]], name="norm_beta")
    x = g.op("Gemm", [x, p["fc1.weight"], p["fc1.bias"]], name="fc1", transB=1)
    x = g.op("Relu", [x], name=relu)
    w2 = g.op("Constant", [], name="fc2_weight", value=onnx.numpy_helper.from_array(p["fc2.weight"].T.copy(), "fc2_weight"))
    logits = g.op("Add", [g.op("MatMul", [x, w2], name="fc2"), p["fc2.bias"]], name="fc2_bias", output_names=["logits"])
    g.output(logits)


def main() -> None:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "digits_calibration.npz", image=x_train[:300])
    np.savez_compressed(OUT / "digits_eval.npz", image=x_test, label=y_test.astype(np.int64))
    # The deeper model learns nothing at the first one's rate (its loss stays at ln 10): a third of it.
    for kind, export, name, lr in (
        (DigitsCNN, to_onnx, "digits_cnn", 3e-3),
        (DigitsResizedCNN, resized_to_onnx, "digits_resized_cnn", 1e-3),
    ):
        model = train(torch.from_numpy(x_train), torch.from_numpy(y_train), kind, lr)
        with torch.no_grad():
            torch_accuracy = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
        proto = export(model)
        onnx.save(proto, OUT / f"{name}.onnx")
        logits = qo.run(proto, {"image": x_test}, backend="onnxruntime")["logits"]
        onnx_accuracy = float((logits.argmax(1) == y_test).mean())
        print(f"{name}: torch accuracy {torch_accuracy:.4f}, ONNX accuracy {onnx_accuracy:.4f}; written to {OUT}")


if __name__ == "__main__":
    main()
