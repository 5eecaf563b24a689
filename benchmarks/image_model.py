"""A CNN of realistic layer sizes on real images, for the quantizer benchmarks.

scikit-learn's 8x8 handwritten digits (UCI, shipped with the package)
enlarged to 32x32 (each pixel a 4x4 block, then a 3x3 box blur): four 3x3
convolutions of 32-64 channels with batch normalization and ReLU, two
max-pools, a global average pool and a Gemm. Trained with PyTorch for a
few epochs (seeded), then written op by op with qlinear.onnx.Graph, the
batch normalizations folded into the convolutions as exporters do. The demo CNN's convolutions (1-32
channels on 8x8) are too small for integer kernels to beat float ones; at
these sizes they do.
"""

from __future__ import annotations

import numpy as np
import onnx
from _training import fit

import qlinear.onnx as qo

CHANNELS = (32, 32, 64, 64)


def images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: 32x32 float32 images in [0, 1], int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    big = np.kron(digits.images / 16.0, np.ones((4, 4)))
    padded = np.pad(big, ((0, 0), (1, 1), (1, 1)), mode="edge")
    blurred = sum(padded[:, i : i + 32, j : j + 32] for i in range(3) for j in range(3)) / 9
    x = blurred.astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)


def train(x: np.ndarray, y: np.ndarray, epochs: int = 8, lr: float = 3e-3, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers, c = [], 1
    for i, co in enumerate(CHANNELS):
        layers += [nn.Conv2d(c, co, 3, padding=1), nn.BatchNorm2d(co), nn.ReLU()]
        if i in (1, 2):
            layers.append(nn.MaxPool2d(2))
        c = co
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    return fit(model, x, y, epochs=epochs, lr=lr, seed=seed)


def to_onnx(model) -> onnx.ModelProto:
    import torch
    from torch import nn

    g = qo.Graph("digits32_cnn", opset=17)
    h = g.input("image", "float", ("N", 1, 32, 32))
    layers = list(model)
    for i, layer in enumerate(layers):
        if isinstance(layer, nn.Conv2d):
            # The BatchNorm after it folded in, as exporters do for inference.
            bn = layers[i + 1]
            k = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().numpy()
            w = layer.weight.detach().numpy() * k[:, None, None, None]
            b = (layer.bias.detach().numpy() - bn.running_mean.detach().numpy()) * k + bn.bias.detach().numpy()
            h = g.op(
                "Conv", [h, w.astype(np.float32), b.astype(np.float32)], name=f"conv{i}", pads=[1, 1, 1, 1], kernel_shape=[3, 3]
            )
        elif isinstance(layer, nn.BatchNorm2d):
            continue
        elif isinstance(layer, nn.ReLU):
            h = g.op("Relu", [h], name=f"relu{i}")
        elif isinstance(layer, nn.MaxPool2d):
            h = g.op("MaxPool", [h], name=f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
        elif isinstance(layer, nn.AdaptiveAvgPool2d):
            h = g.op("GlobalAveragePool", [h], name="gap")
        elif isinstance(layer, nn.Flatten):
            h = g.op("Flatten", [h], name="flatten")
        else:
            w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
            h = g.op("Gemm", [h, w, b], name="fc", transB=1, output_names=["logits"])
    g.output(h)
    return g.to_model()
