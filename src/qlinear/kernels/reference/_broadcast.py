"""Scales and zero points laid out against ``x``, for each granularity."""

from __future__ import annotations

import numpy as np

from qlinear.spec import Granularity

__all__ = ["expand"]


def expand(param: np.ndarray, granularity: Granularity, x_shape: tuple[int, ...]) -> np.ndarray:
    """``param`` reshaped or repeated so it broadcasts against ``x_shape``.

    Per-tensor gives a 0-d array and per-axis a view; blocked takes, for
    each index ``d`` along the axis, the scale of block ``d // block_size``,
    so the result is the size of ``x`` along the axis whatever the block
    size (a block far longer than the axis costs nothing).
    """
    if granularity.kind == "per_tensor":
        return param.reshape(())
    axis = granularity.axis
    if granularity.kind == "per_axis":
        dims = [1] * len(x_shape)
        dims[axis] = param.shape[0]
        return param.reshape(dims)
    return np.take(param, np.arange(x_shape[axis]) // granularity.block_size, axis=axis)
