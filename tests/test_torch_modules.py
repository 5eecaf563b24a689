"""qlinear.torch's quantizer modules and quantize_modules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import qlinear  # noqa: E402
import qlinear.torch as qt  # noqa: E402


def test_fixed_fake_quantize_matches_functional():
    x = torch.randn(3, 5)
    s, z = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, -2.0, 0.0])
    fq = qt.FakeQuantize("int4", qparams="fixed", axis=0, scale=s, zero_point=z)
    assert torch.equal(fq(x), qt.fake_quantize(x, s, z, axis=0, output_dtype="int4"))


def test_minmax_observes_in_training_only():
    fq = qt.FakeQuantize("int8", qparams="minmax")
    fq(torch.tensor([-2.0, 1.0]))
    fq(torch.tensor([-1.0, 4.0]))
    assert (fq.min_val.item(), fq.max_val.item()) == (-2.0, 4.0)
    assert fq.scale.item() == pytest.approx(4.0 / 127)
    fq.eval()
    fq(torch.tensor([-100.0, 100.0]))
    assert fq.max_val.item() == 4.0


def test_moving_average_update():
    fq = qt.FakeQuantize("uint8", qparams="moving_average", averaging_constant=0.5, symmetric=False)
    fq(torch.tensor([0.0, 2.0]))
    fq(torch.tensor([-2.0, 4.0]))
    assert (fq.min_val.item(), fq.max_val.item()) == (-1.0, 3.0)
    assert fq.scale.item() == pytest.approx(4.0 / 255)
    assert fq.zero_point.item() == round(1.0 / (4.0 / 255))


def test_eval_mode_saves_nothing_for_backward():
    fq = qt.FakeQuantize("int8", qparams="learnable").train()
    x = torch.randn(8, requires_grad=True)
    assert fq(x).grad_fn is not None
    fq.eval()
    y = fq(x)
    assert y.grad_fn is None and not y.requires_grad


def test_uninitialized_eval_raises():
    with pytest.raises(qlinear.QuantizationError, match="qparams are not set"):
        qt.FakeQuantize("int8", qparams="minmax", axis=0).eval()(torch.randn(2, 2))


def test_learnable_blocked_state_dict_round_trip():
    fq = qt.FakeQuantize("int4", qparams="learnable", axis=1, block_size=3, symmetric=False)
    x = torch.randn(2, 7)
    fq(x).sum().backward()
    assert fq.scale.shape == (2, 3) and fq.scale.grad is not None and fq.zero_point.grad is not None
    other = qt.FakeQuantize("int4", qparams="learnable", axis=1, block_size=3, symmetric=False)
    other.load_state_dict(fq.state_dict())
    assert torch.equal(other.eval()(x), fq.eval()(x))


def test_quantize_dequantize_pair_shares_qparams():
    q = qt.QuantizeLinear("int8", qparams="minmax", axis=1)
    dq = qt.DequantizeLinear(q)
    x = torch.randn(4, 3)
    y = dq(q(x))
    fq = qt.FakeQuantize("int8", qparams="fixed", axis=1, scale=q.scale, zero_point=q.zero_point)
    assert torch.equal(y, fq(x))


def test_grad_scale_of_module():
    x = torch.randn(6, requires_grad=True)
    qt.FakeQuantize("int8", qparams="fixed", scale=torch.tensor(1.0), grad_scale=0.25)(x).sum().backward()
    assert torch.equal(x.grad, torch.full((6,), 0.25))


def test_quantize_modules_wraps_linear_and_conv():
    model = nn.Sequential(nn.Conv1d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6, 2), nn.Sequential(nn.Conv2d(1, 1, 1)))
    qt.quantize_modules(model, qt.QuantConfig(weight=qt.QuantSpec("int8", axis=0), activation=None))
    assert [type(m).__name__ for m in (model[0], model[3], model[4][0])] == ["QuantizedModule"] * 3
    w = model[3].layer.weight
    assert torch.equal(
        model[3].weight_quant(w),
        qt.fake_quantize(
            w, model[3].weight_quant.scale, output_dtype="int8", axis=0, zero_point=model[3].weight_quant.zero_point
        ),
    )


def test_quantize_modules_needs_a_layer():
    with pytest.raises(qlinear.QuantizationError, match="quantize_modules"):
        qt.quantize_modules(nn.Sequential(nn.ReLU()))


def test_learnable_dequantize_gradients():
    dq = qt.DequantizeLinear(
        dtype="int8", scale=torch.tensor([0.5, 2.0]), zero_point=torch.tensor([1.0, -3.0]), axis=0, learnable=True
    )
    x = torch.tensor([[4.0, 5.0], [-1.0, 0.0]])
    dq(x).sum().backward()
    assert dq.scale.grad.tolist() == [7.0, 5.0]  # sum of (x - z) per row
    assert dq.zero_point.grad.tolist() == [-1.0, -4.0]  # -scale per element
