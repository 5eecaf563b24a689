"""Learned scales stay valid, export refuses invalid ones, and blocks never run along an axis shorter than a block."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import qlinear.torch as qt
from qlinear._errors import QuantizationError
from qlinear.torch._modules import SCALE_FLOOR


def test_a_scale_an_optimizer_takes_below_zero_comes_back_positive():
    torch.manual_seed(0)
    fq = qt.FakeQuantize("int8", qparams="learnable", scale=torch.tensor(0.05))
    opt = torch.optim.SGD(fq.parameters(), lr=1.0)
    x = torch.randn(256)
    for _ in range(3):
        opt.zero_grad()
        fq(x).square().sum().backward()
        fq.scale.grad.fill_(10.0)  # a step that would take the scale to about -10
        opt.step()
        assert fq.scale.item() < 0  # the step did it ...
        y = fq(x)  # ... and the next use undoes it
        assert fq.scale.item() == np.float32(SCALE_FLOOR) and torch.isfinite(y).all()
    fq.scale.data.fill_(float("nan"))
    fq(x)
    assert fq.scale.item() == np.float32(SCALE_FLOOR)


def test_export_refuses_a_bad_scale_naming_the_module():
    model = qt.quantize_modules(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)))
    model.train()
    model(torch.randn(16, 8))
    model[2].input_quant.scale.fill_(-1.0)  # a fixed (observed) scale set wrong
    with pytest.raises(
        QuantizationError, match=r"module '2.input_quant' \(FakeQuantize\) has 1 scale\(s\) that are not positive"
    ):
        qt.export_onnx(model, torch.randn(1, 8), None)
    model[2].input_quant.scale.fill_(float("inf"))
    with pytest.raises(QuantizationError, match=r"'2\.input_quant'"):
        qt.export_onnx(model, torch.randn(1, 8), None)


def test_blocks_longer_than_their_axis():
    fq = qt.FakeQuantize("int4", axis=1, block_size=16)
    with pytest.raises(QuantizationError, match=r"block_size=16 runs along axis 1 of size 1"):
        fq(torch.randn(8, 1, 3, 3))
    # quantize_modules turns such a weight to per output channel, and says so.
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qt.quantize_modules(model, qt.QuantConfig(weight=qt.QuantSpec("int4", axis=1, block_size=16), activation=None))
    assert [str(w.message) for w in caught] == [
        "quantize_modules: 0: blocks of 16 along axis 1 of size 1; quantized per output channel (axis 0) instead",
        "quantize_modules: 2: blocks of 16 along axis 1 of size 8; quantized per output channel (axis 0) instead",
    ]
    assert model[0].weight_quant.block_size == 0 and model[0].weight_quant.axis == 0
    proto = qt.export_onnx(model, torch.randn(1, 1, 8, 8), None, opset=21)
    first = next(t for t in proto.graph.initializer if t.name.startswith("weight_q"))
    assert len(first.raw_data) < 8 * 9 * 4  # smaller than the float weight, unlike a block a row
