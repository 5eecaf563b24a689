"""Gradients through quantization: straight-through for x, LSQ for the qparams.

Rounding has a zero derivative almost everywhere, so training uses the
straight-through estimator: rounding passes gradients unchanged, saturation
stops them. With ``v = x / s``, ``q`` the quantized value and ``inside`` the
elements saturation left alone:

* QuantizeLinear ``q = clamp(round(v) + z)``: ``dq/dx = inside / s``,
  ``dq/ds = -inside * v / s``, ``dq/dz = inside``.
* FakeQuantize ``y = s * (q - z)`` (LSQ, Esser et al. 2020; LSQ+ for the
  zero point): ``dy/dx = inside``, ``dy/ds = (q - z) - inside * v`` (that is
  ``round(v) - v`` inside and ``qmin - z`` or ``qmax - z`` at the clamps),
  ``dy/dz = -(1 - inside) * s``; the scale and zero-point gradients are
  multiplied by LSQ's ``1 / sqrt(n * qmax)``, ``n`` the elements per scale.

``grad_scale`` (the seed's "lda coeff") multiplies the gradient sent back to
``x``, as the last operation, so it scales exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from qlinear.spec import QuantizePlan
from qlinear.torch import _fast
from qlinear.torch._core import dequantize, pre_saturation, quotient, round_quotient
from qlinear.torch._layout import counts, expand, reduce

__all__ = ["QuantizeFunction", "FakeQuantizeFunction", "StraightThrough", "saturation_bounds"]


def saturation_bounds(plan: QuantizePlan) -> tuple[float, float]:
    """The clamp range of the output type: ``[qmin, qmax]`` or ``±max_finite``."""
    t = plan.output_type
    return (float(t.qmin), float(t.qmax)) if t.is_integer else (-t.max_finite, t.max_finite)


def _forward(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None):
    """The quantized values, the unsaturated mask and the values at the clamps."""
    lo, hi = saturation_bounds(plan)
    v = quotient(plan, x, scale)
    pre = pre_saturation(plan, v, zero_point)
    inside = (pre >= lo) & (pre <= hi)
    q = round_quotient(plan, v, zero_point)
    # Outside, the LSQ gradient needs the clamp (q is NaN or inf there when a
    # float8 type does not saturate).
    clamped = torch.where(inside, q, torch.clamp(pre, lo, hi))
    return q, inside, clamped


class QuantizeFunction(torch.autograd.Function):
    """QuantizeLinear with straight-through gradients (see the module docstring)."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        scale: torch.Tensor,
        zero_point: torch.Tensor | None,
        zp_values: torch.Tensor | None,
        plan: QuantizePlan,
        grad_scale: float,
    ) -> torch.Tensor:
        q, inside, _ = _forward(plan, x, scale, zp_values)
        return q, inside

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, scale, zero_point, _, plan, grad_scale = inputs
        _, inside = output
        ctx.plan, ctx.grad_scale = plan, grad_scale
        ctx.zp_dtype = None if zero_point is None else zero_point.dtype
        ctx.save_for_backward(x, scale, inside)
        ctx.mark_non_differentiable(inside)
        ctx.set_materialize_grads(False)  # see FakeQuantizeFunction.setup_context

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None, _grad_inside: Any):
        if grad is None:
            return None, None, None, None, None, None
        x, scale, inside = ctx.saved_tensors
        plan = ctx.plan
        g = torch.where(inside, grad.to(torch.float32), 0.0)
        s = expand(scale, plan.granularity, plan.x_shape).to(torch.float32)
        dx = ds = dz = None
        if ctx.needs_input_grad[0]:
            dx = (g / s).to(x.dtype) * ctx.grad_scale
        if ctx.needs_input_grad[1]:
            v = x.to(torch.float32) / s
            ds = reduce(-g * v / s, plan.granularity, tuple(scale.shape)).to(scale.dtype)
        if ctx.needs_input_grad[2]:
            dz = reduce(g, plan.granularity, tuple(scale.shape)).to(ctx.zp_dtype)
        return dx, ds, dz, None, None, None


class FakeQuantizeFunction(torch.autograd.Function):
    """DequantizeLinear(QuantizeLinear(x)) with LSQ gradients (see the module docstring)."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        scale: torch.Tensor,
        zero_point: torch.Tensor | None,
        zp_values: torch.Tensor | None,
        plan: QuantizePlan,
        grad_scale: float,
        dq_plan: Any,
    ) -> torch.Tensor:
        if _fast.applies(plan, x, scale, zp_values):
            got = _fast.training_forward(
                plan, x, scale, zp_values, axis=plan.granularity.axis or 0, block_size=plan.granularity.block_size
            )
            if got is not None:
                return got
        q, inside, clamped = _forward(plan, x, scale, zp_values)
        return dequantize(dq_plan, q, scale, zp_values), inside, clamped

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, scale, zero_point, zp_values, plan, grad_scale, _ = inputs
        _, inside, clamped = output
        ctx.plan, ctx.grad_scale = plan, grad_scale
        ctx.zp_dtype = None if zero_point is None else zero_point.dtype
        ctx.save_for_backward(x, scale, zp_values, inside, clamped)
        ctx.mark_non_differentiable(inside, clamped)
        # The mask and the clamped values never carry a gradient: without this, autograd would fill a tensor of
        # zeros of x's size for each of them on every backward (two passes over memory for nothing).
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None, _grad_inside: Any, _grad_clamped: Any):
        if grad is None:
            return None, None, None, None, None, None, None
        x, scale, zp_values, inside, clamped = ctx.saved_tensors
        plan = ctx.plan
        g_all = grad.to(torch.float32).contiguous()  # once: both passes below read it
        dx = ds = dz = None
        fused = None
        if ctx.needs_input_grad[1]:
            # The scale's per-element terms, and x's gradient from the same pass where x is float32.
            with_dx = ctx.needs_input_grad[0] and x.dtype == torch.float32
            fused = _fast.lsq_scale_terms(plan, x, g_all, scale, zp_values, inside, clamped, ctx.grad_scale if with_dx else None)
            if fused is not None and fused[1] is not None:
                dx = fused[1]
        if ctx.needs_input_grad[0] and dx is None:
            dx = _fast.straight_through(g_all, inside, ctx.grad_scale) if x.dtype == torch.float32 else None
            if dx is None:
                dx = torch.where(inside, g_all, 0.0).to(x.dtype) * ctx.grad_scale
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            shape = tuple(scale.shape)
            lsq = torch.rsqrt(_counts(plan, shape, x.device) * _qmax(plan))
            s = expand(scale, plan.granularity, plan.x_shape).to(torch.float32)
            if ctx.needs_input_grad[1]:
                if fused is not None:
                    per_element = fused[0]
                else:
                    z = 0.0 if zp_values is None else expand(zp_values, plan.granularity, plan.x_shape)
                    v = x.to(torch.float32) / s
                    per_element = g_all * ((clamped - z) - torch.where(inside, v, 0.0))
                    # NaN inputs carry no information about the scale.
                    per_element = torch.where(torch.isnan(per_element), 0.0, per_element)
                ds = (reduce(per_element, plan.granularity, shape) * lsq).to(scale.dtype)
            if ctx.needs_input_grad[2]:
                per_element = torch.where(inside, 0.0, -g_all * s)
                dz = (reduce(per_element, plan.granularity, shape) * lsq).to(ctx.zp_dtype)
        return dx, ds, dz, None, None, None, None


def _counts(plan: QuantizePlan, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Elements each scale applies to, as float32: counted, not summed, where every count is exact in float32."""
    g = plan.granularity
    total = 1
    for d in plan.x_shape:
        total *= d
    if g.kind != "blocked":
        per_scale = total // max(1, int(torch.Size(shape).numel()))
        if per_scale <= 1 << 24:  # a sum of that many ones is exact in float32 whatever its order: the same bits
            return torch.full(shape, float(per_scale), dtype=torch.float32, device=device)
    return counts(g, plan.x_shape, shape, device)


def _qmax(plan: QuantizePlan) -> float:
    """LSQ's ``Q_P``: the largest positive quantized value."""
    t = plan.output_type
    return float(t.qmax) if t.is_integer else t.max_finite


class StraightThrough(torch.autograd.Function):
    """``values`` forward, the gradient passed to ``source`` unchanged backward.

    Used for a zero point rounded to its type: unlike ``source + (values -
    source).detach()`` it keeps ``values`` bit for bit (a ``-0`` stays ``-0``).
    """

    @staticmethod
    def forward(source: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        return grad.to(ctx.dtype), None
