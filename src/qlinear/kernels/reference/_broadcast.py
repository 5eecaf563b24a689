"""Scales and zero points laid out against ``x``, for each granularity."""

from __future__ import annotations

import numpy as np

from qlinear.spec import Granularity

__all__ = ["expand"]


def expand(param: np.ndarray, granularity: Granularity, x_shape: tuple[int, ...]) -> np.ndarray:
    """``param`` reshaped or repeated so it broadcasts against ``x_shape``.

    Per-tensor gives a 0-d array and per-axis a view; blocked repeats each
    scale ``block_size`` times along the axis and trims the ragged last block.
    """
    if granularity.kind == "per_tensor":
        return param.reshape(())
    axis = granularity.axis
    if granularity.kind == "per_axis":
        dims = [1] * len(x_shape)
        dims[axis] = param.shape[0]
        return param.reshape(dims)
    repeated = np.repeat(param, granularity.block_size, axis=axis)
    return repeated[tuple(slice(0, x_shape[axis]) if i == axis else slice(None) for i in range(len(x_shape)))]
