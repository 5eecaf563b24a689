"""Gradients of qlinear.torch: straight-through for x, LSQ for scale and zero point."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import qlinear.torch as qt  # noqa: E402


def _grads(fn, *tensors):
    out = fn(*tensors)
    out.backward(torch.ones_like(out))
    return [t.grad for t in tensors]


def test_fake_quantize_ste_mask_int8_edges():
    # round(127.5) = 128 (half to even) saturates; round(-128.5) = -128 does not.
    x = torch.tensor([126.5, 127.4, 127.5, 200.0, -128.5, -128.6, float("nan")], requires_grad=True)
    (dx,) = _grads(lambda x: qt.fake_quantize(x, torch.tensor(1.0), output_dtype="int8"), x)
    assert dx.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_fake_quantize_ste_mask_uint8_zero_point():
    # zero point 10: representable x/s lies in [-10, 245].
    x = torch.tensor([-10.4, -10.6, 244.9, 245.6], requires_grad=True)
    zp = torch.tensor(10, dtype=torch.uint8)
    (dx,) = _grads(lambda x: qt.fake_quantize(x, torch.tensor(1.0), zp), x)
    assert dx.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_fake_quantize_ste_mask_float8_edges():
    # Clipping to 448 happens before rounding: 448 is inside, anything above is not.
    x = torch.tensor([447.0, 448.0, 449.0, -448.0, -460.0, float("inf")], requires_grad=True)
    (dx,) = _grads(lambda x: qt.fake_quantize(x, torch.tensor(1.0), output_dtype="float8e4m3fn"), x)
    assert dx.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_quantize_linear_gradient_is_straight_through():
    x = torch.tensor([1.2, -3.0, 400.0], requires_grad=True)
    s = torch.tensor(0.5, requires_grad=True)
    z = torch.tensor(3.0, requires_grad=True)
    dx, ds, dz = _grads(lambda x, s, z: qt.quantize_linear(x, s, z, output_dtype="int8"), x, s, z)
    inside = torch.tensor([1.0, 1.0, 0.0])
    assert torch.equal(dx, inside / 0.5)
    assert ds.item() == pytest.approx(float((-inside * x.detach() / 0.25).sum()))
    assert dz.item() == 2.0


def _lsq_reference(x, s_el, z_el, qmin, qmax, n):
    """LSQ/LSQ+ per element, by hand: returns (dy/ds, dy/dz) before summing."""
    v = x / s_el
    r = torch.round(v) + z_el
    inside = (r >= qmin) & (r <= qmax)
    ds = torch.where(inside, torch.round(v) - v, torch.clamp(r, qmin, qmax) - z_el)
    dz = torch.where(inside, 0.0, -s_el)
    g = 1 / math.sqrt(n * qmax)
    return ds * g, dz * g


def test_lsq_per_tensor():
    x = torch.tensor([0.26, -1.1, 0.74, 3.0, -2.2, 0.0], requires_grad=True)
    s = torch.tensor(0.25, requires_grad=True)
    z = torch.tensor(1.0, requires_grad=True)
    _, ds, dz = _grads(lambda x, s, z: qt.fake_quantize(x, s, z, output_dtype="int4"), x, s, z)
    want_s, want_z = _lsq_reference(x.detach(), 0.25, 1.0, -8, 7, 6)
    assert ds.item() == pytest.approx(want_s.sum().item(), rel=1e-6)
    assert dz.item() == pytest.approx(want_z.sum().item(), rel=1e-6)


def test_lsq_per_axis():
    x = torch.tensor([[0.3, -0.9, 2.6], [10.0, -0.2, 0.45]], requires_grad=True)
    s = torch.tensor([0.1, 0.5], requires_grad=True)
    _, ds = _grads(lambda x, s: qt.fake_quantize(x, s, axis=0, output_dtype="int2"), x, s)
    want, _ = _lsq_reference(x.detach(), s.detach()[:, None], 0.0, -2, 1, 3)
    torch.testing.assert_close(ds, want.sum(dim=1))


def test_lsq_blocked_ragged():
    # 5 columns in blocks of 2: the last block holds one element, so n differs per block.
    x = torch.tensor([[0.3, -0.9, 2.6, 0.1, -7.0], [1.0, -0.2, 0.45, 9.0, 0.33]], requires_grad=True)
    s = torch.tensor([[0.2, 0.3, 0.4], [0.5, 0.6, 0.7]], requires_grad=True)
    z = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, 0.0]], requires_grad=True)
    _, ds, dz = _grads(lambda x, s, z: qt.fake_quantize(x, s, z, axis=1, block_size=2, output_dtype="int4"), x, s, z)
    s_el = torch.repeat_interleave(s.detach(), 2, dim=1)[:, :5]
    z_el = torch.repeat_interleave(z.detach(), 2, dim=1)[:, :5]
    v = x.detach() / s_el
    r = torch.round(v) + z_el
    inside = (r >= -8) & (r <= 7)
    per_s = torch.where(inside, torch.round(v) - v, torch.clamp(r, -8, 7) - z_el)
    per_z = torch.where(inside, 0.0, -s_el)
    n = torch.tensor([2.0, 2.0, 1.0])
    want_s = torch.stack([per_s[:, :2].sum(1), per_s[:, 2:4].sum(1), per_s[:, 4]], dim=1) / torch.sqrt(n * 7)
    want_z = torch.stack([per_z[:, :2].sum(1), per_z[:, 2:4].sum(1), per_z[:, 4]], dim=1) / torch.sqrt(n * 7)
    torch.testing.assert_close(ds, want_s)
    torch.testing.assert_close(dz, want_z)


def test_lsq_saturated_region_matches_finite_differences():
    # Where every element saturates, y = s * (qmax - z) is smooth: LSQ's
    # gradient divided by its scale 1/sqrt(n * qmax) is the true derivative.
    x = torch.tensor([50.0, 60.0, -70.0], dtype=torch.float32)
    s = torch.tensor(0.5, requires_grad=True)
    z = torch.tensor(2.0, requires_grad=True)
    y = qt.fake_quantize(x, s, z, output_dtype="int4")
    y.sum().backward()
    g = 1 / math.sqrt(3 * 7)
    eps = 1e-2

    def total(s_value, z_value):
        return float(qt.fake_quantize(x, torch.tensor(s_value), torch.tensor(z_value), output_dtype="int4").sum())

    fd_s = (total(0.5 + eps, 2.0) - total(0.5 - eps, 2.0)) / (2 * eps)
    assert s.grad.item() / g == pytest.approx(fd_s, rel=1e-4)
    # z is rounded in the forward pass: the finite difference needs whole steps.
    fd_z = (total(0.5, 3.0) - total(0.5, 1.0)) / 2
    assert z.grad.item() / g == pytest.approx(fd_z, rel=1e-6)


def test_dequantize_linear_gradcheck():
    # DequantizeLinear is smooth in x and the scale (the zero point is rounded
    # to its type); it computes in float32, so the tolerances are loose.
    q = torch.tensor([[3.0, -2.0, 7.0], [0.0, 1.0, -8.0]], requires_grad=True)
    s = torch.tensor([0.5, 1.5], requires_grad=True)
    z = torch.tensor([0.25, -0.5])
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(
            lambda q, s: qt.dequantize_linear(q, s, z, axis=0, input_dtype="float8e4m3fn"),
            (q, s),
            eps=1e-3,
            atol=1e-2,
            rtol=1e-2,
        )


def test_fake_quantize_gradcheck_of_x_inside_range():
    # Inside the range the straight-through gradient of x is exactly the identity.
    x = torch.randn(4, 6, dtype=torch.float32, requires_grad=True)
    y = qt.fake_quantize(x, torch.tensor(0.05), output_dtype="int8")
    (dx,) = torch.autograd.grad(y, x, torch.arange(24.0).reshape(4, 6))
    assert torch.equal(dx, torch.arange(24.0).reshape(4, 6))


@pytest.mark.parametrize("fn", [qt.fake_quantize, qt.quantize_linear])
def test_grad_scale_multiplies_x_gradient_exactly(fn):
    torch.manual_seed(0)
    base = torch.randn(3, 8) * 4
    upstream = torch.randn(3, 8)
    s = torch.tensor([0.1, 0.2, 0.3])

    def grad(coeff):
        x = base.clone().requires_grad_(True)
        (dx,) = torch.autograd.grad(fn(x, s, axis=0, output_dtype="int4", grad_scale=coeff), x, upstream)
        return dx

    one = grad(1.0)
    assert torch.equal(grad(0.3), one * 0.3)
    assert torch.equal(grad(-2.0), one * -2.0)


def test_no_graph_without_grad():
    x = torch.randn(5, requires_grad=True)
    with torch.no_grad():
        y = qt.fake_quantize(x, torch.tensor(0.1), output_dtype="int8")
    assert y.grad_fn is None and not y.requires_grad


def test_gradients_keep_input_dtypes():
    x = torch.randn(4, 4, dtype=torch.bfloat16, requires_grad=True)
    s = torch.full((4,), 0.1, dtype=torch.float16, requires_grad=True)
    y = qt.fake_quantize(x, s, axis=0, output_dtype="float8e5m2")
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and s.grad.dtype == torch.float16


@pytest.mark.parametrize("fn", [qt.fake_quantize, qt.quantize_linear])
def test_backward_fills_no_zero_gradients_for_the_saved_mask(fn):
    # The Functions' extra outputs (saturation mask, clamped values) never receive a gradient; autograd must not
    # fill a tensor of zeros of x's size for each of them on every backward.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fills(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (
                torch.ops.aten.zeros,
                torch.ops.aten.zeros_like,
                torch.ops.aten.fill_,
                torch.ops.aten.zero_,
            ):
                self.sizes.append(out.numel())
            return out

    x = torch.randn(64, 300, requires_grad=True)
    scale = torch.full((300,), 0.05, requires_grad=True)
    y = fn(x, scale, None, axis=1, output_dtype="int8")
    mode = Fills()
    with mode:
        y.backward(torch.randn_like(y))
    assert x.numel() not in mode.sizes, mode.sizes
    assert x.grad is not None and scale.grad is not None
