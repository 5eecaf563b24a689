"""A short quantization-aware training run: the loss falls and the export runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

import qlinear.onnx as qonnx  # noqa: E402
import qlinear.torch as qt  # noqa: E402


def test_qat_loss_decreases_and_export_runs(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(256, 12)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    config = qt.QuantConfig(
        weight=qt.QuantSpec("int4", axis=1, block_size=4, qparams="learnable"),
        activation=qt.QuantSpec("uint8", qparams="learnable", symmetric=False),
    )
    qt.quantize_modules(model, config)
    model.train()
    model(x)  # sets the activation qparams before the optimizer sees them
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    scales = [m.weight_quant.scale for m in model if isinstance(m, qt.QuantizedModule)]
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in scales)
    proto = qt.export_onnx(model, x[:4], tmp_path / "qat.onnx", opset=21)
    got = next(iter(qonnx.run(proto, {"input": x.numpy()}, backend="qlinear").values()))
    np.testing.assert_allclose(got, model.eval()(x).detach().numpy(), rtol=1e-5, atol=1e-5)
