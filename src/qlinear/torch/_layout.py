"""Scales and zero points laid out against ``x``, and gradients folded back.

:func:`expand` is :func:`qlinear.kernels.reference._broadcast.expand` in
torch; :func:`reduce` is its adjoint (the sum of each scale's elements), which
the backward pass needs, and :func:`counts` the number of elements per scale.
"""

from __future__ import annotations

import torch

from qlinear.spec import Granularity

__all__ = ["expand", "reduce", "counts"]


def expand(param: torch.Tensor, g: Granularity, x_shape: tuple[int, ...]) -> torch.Tensor:
    """``param`` reshaped or repeated so it broadcasts against ``x_shape``.

    Blocked parameters repeat ``block_size`` times along the axis and the
    ragged last block is trimmed.
    """
    if g.kind == "per_tensor":
        return param.reshape(())
    if g.kind == "per_axis":
        dims = [1] * len(x_shape)
        dims[g.axis] = param.shape[0]
        return param.reshape(dims)
    repeated = torch.repeat_interleave(param, g.block_size, dim=g.axis)
    return repeated.narrow(g.axis, 0, x_shape[g.axis])


def reduce(t: torch.Tensor, g: Granularity, param_shape: tuple[int, ...]) -> torch.Tensor:
    """Sum of ``t`` (shaped like ``x``) over the elements of each parameter."""
    if g.kind == "per_tensor":
        return t.sum().reshape(param_shape)
    if g.kind == "per_axis":
        dims = [d for d in range(t.dim()) if d != g.axis]
        return t.sum(dim=dims).reshape(param_shape) if dims else t.reshape(param_shape)
    blocks = param_shape[g.axis]
    pad = blocks * g.block_size - t.shape[g.axis]
    if pad:
        # Zeros fill the ragged last block so every block has block_size elements.
        filler_shape = list(t.shape)
        filler_shape[g.axis] = pad
        t = torch.cat([t, t.new_zeros(filler_shape)], dim=g.axis)
    split = [*t.shape[: g.axis], blocks, g.block_size, *t.shape[g.axis + 1 :]]
    return t.reshape(split).sum(dim=g.axis + 1)


def counts(g: Granularity, x_shape: tuple[int, ...], param_shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Number of elements of ``x`` each parameter applies to (float32)."""
    ones = torch.ones((), dtype=torch.float32, device=device).expand(x_shape)
    return reduce(ones, g, param_shape)
