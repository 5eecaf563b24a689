"""Quantize a small CNN on scikit-learn's digits: post-training and quantization-aware.

A float CNN is trained on the 8x8 digits bundled with scikit-learn (no
download), then quantized four ways with qlinear.torch:

* PTQ int8: int8 per-output-channel weights, uint8 activations (min-max);
* PTQ int4: int4 weights in blocks of 16 along the input axis, float activations;
* PTQ int4/uint4: those weights and uint4 activations (min-max);
* QAT int4/uint4: the same types fine-tuned from the float model, with
  learnable weight scales (LSQ) and moving-average activation ranges.

Each is exported as a standard QDQ ONNX model, and the exported model's
accuracy (run by ONNX Runtime) is printed beside the torch accuracy.

    pip install -e '.[examples]'
    python examples/qat_digits.py --out /tmp/qat_digits
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import qlinear.onnx
import qlinear.torch as qt


def data() -> tuple[torch.Tensor, ...]:
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (n, 1, 8, 8) in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    return torch.from_numpy(x_train), torch.from_numpy(x_test), torch.from_numpy(y_train), torch.from_numpy(y_test)


def cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model.eval()(x).argmax(1) == y).float().mean())


def onnx_accuracy(path: Path, x: torch.Tensor, y: torch.Tensor) -> float:
    logits = next(iter(qlinear.onnx.run(str(path), {"input": x.numpy()}, backend="onnxruntime").values()))
    return float((logits.argmax(1) == y.numpy()).mean())


@torch.no_grad()
def calibrate(model: nn.Module, x: torch.Tensor) -> None:
    """Observe activation ranges: quantizers observe in training mode."""
    model.train()
    for batch in x.split(256):
        model(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("qat_digits_out"), help="directory for the ONNX models")
    parser.add_argument("--opset", type=int, default=21)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    x_train, x_test, y_train, y_test = data()

    float_model = cnn()
    train(float_model, x_train, y_train, epochs=30, lr=3e-3)
    rows = [("float32", "float32", "float32", accuracy(float_model, x_test, y_test), None)]

    int8 = qt.QuantConfig(weight=qt.QuantSpec("int8", axis=0), activation=qt.QuantSpec("uint8", symmetric=False))
    int4_weights = qt.QuantSpec("int4", axis=1, block_size=16)
    int4 = qt.QuantConfig(weight=int4_weights, activation=None)
    w4a4 = qt.QuantConfig(weight=int4_weights, activation=qt.QuantSpec("uint4", symmetric=False))
    qat = qt.QuantConfig(
        weight=qt.QuantSpec("int4", axis=1, block_size=16, qparams="learnable"),
        activation=qt.QuantSpec("uint4", qparams="moving_average", symmetric=False),
    )

    runs = (("PTQ int8", int8, 0), ("PTQ int4", int4, 0), ("PTQ int4/uint4", w4a4, 0), ("QAT int4/uint4", qat, 4))
    for label, config, epochs in runs:
        model = qt.quantize_modules(copy.deepcopy(float_model), config)
        calibrate(model, x_train)
        if epochs:
            train(model, x_train, y_train, epochs=epochs, lr=1e-3)
        path = args.out / f"digits_{label.lower().replace(' ', '_').replace('/', '_')}.onnx"
        qt.export_onnx(model, x_test[:1], path, opset=args.opset)
        weights = config.weight.dtype + (f" blocks of {config.weight.block_size}" if config.weight.block_size else " per-channel")
        activations = config.activation.dtype if config.activation else "float32"
        rows.append((label, weights, activations, accuracy(model, x_test, y_test), onnx_accuracy(path, x_test, y_test)))

    print("| model | weights | activations | accuracy (torch) | accuracy (ONNX) |\n| --- | --- | --- | --- | --- |")
    for label, weights, activations, acc, onnx_acc in rows:
        print(f"| {label} | {weights} | {activations} | {acc:.4f} | {'-' if onnx_acc is None else f'{onnx_acc:.4f}'} |")
    print(f"ONNX models written to {args.out}")


if __name__ == "__main__":
    main()
