"""Scales and zero points from observed ranges (min-max, per granularity)."""

from __future__ import annotations

import torch

from qlinear.dtypes import ElementType
from qlinear.spec import Granularity

__all__ = ["param_shape", "extremes", "from_range"]

# The smallest scale an observer sets: an all-zero range must still divide.
_MIN_SCALE = torch.finfo(torch.float32).eps  # 2**-23


def param_shape(g: Granularity, x_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the scale for granularity ``g`` on ``x_shape``."""
    if g.kind == "per_tensor":
        return ()
    if g.kind == "per_axis":
        return (x_shape[g.axis],)
    return tuple(-(-d // g.block_size) if i == g.axis else d for i, d in enumerate(x_shape))


def extremes(x: torch.Tensor, g: Granularity) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest element of ``x`` under each scale (NaN ignored)."""
    lo_src = torch.where(torch.isnan(x), torch.inf, x).to(torch.float32)
    hi_src = torch.where(torch.isnan(x), -torch.inf, x).to(torch.float32)
    if g.kind == "per_tensor":
        return lo_src.amin(), hi_src.amax()
    if g.kind == "per_axis":
        dims = [d for d in range(x.dim()) if d != g.axis]
        return (lo_src.amin(dim=dims), hi_src.amax(dim=dims)) if dims else (lo_src, hi_src)
    shape = param_shape(g, tuple(x.shape))
    pad = shape[g.axis] * g.block_size - x.shape[g.axis]
    split = [*x.shape[: g.axis], shape[g.axis], g.block_size, *x.shape[g.axis + 1 :]]

    def blocks(t: torch.Tensor, fill: float) -> torch.Tensor:
        # The ragged last block is padded with values that never win.
        widths = [0, 0] * (t.dim() - 1 - g.axis) + [0, pad]
        return torch.nn.functional.pad(t, widths, value=fill).reshape(split)

    return blocks(lo_src, torch.inf).amin(dim=g.axis + 1), blocks(hi_src, -torch.inf).amax(dim=g.axis + 1)


def from_range(lo: torch.Tensor, hi: torch.Tensor, t: ElementType, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, zero_point)`` mapping ``[min(lo, 0), max(hi, 0)]`` onto type ``t``.

    Symmetric: ``scale = max|x| / qmax`` with zero point 0 for signed and
    float types, and the middle code (128 for uint8) for unsigned ones.
    Asymmetric (integer types): ``scale = (hi - lo) / (qmax - qmin)``,
    ``zero_point = round(qmin - lo / scale)``. Infinite ranges are clipped to
    the largest float32.
    """
    big = torch.finfo(torch.float32).max
    lo = torch.clamp(lo, min=-big, max=0.0)
    hi = torch.clamp(hi, min=0.0, max=big)
    if not t.is_integer:
        scale = torch.maximum(-lo, hi) / t.max_finite
        return torch.clamp(scale, min=_MIN_SCALE), torch.zeros_like(scale)
    if symmetric:
        mid = 0 if t.qmin < 0 else (t.qmin + t.qmax + 1) // 2
        scale = torch.clamp(torch.maximum(-lo, hi) / (t.qmax - mid), min=_MIN_SCALE)
        return scale, torch.full_like(scale, float(mid))
    scale = torch.clamp((hi - lo) / (t.qmax - t.qmin), min=_MIN_SCALE)
    zero_point = torch.clamp(torch.round(t.qmin - lo / scale), t.qmin, t.qmax)
    return scale, zero_point
