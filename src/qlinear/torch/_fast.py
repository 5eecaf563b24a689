"""CPU float32 tensors through qlinear's fused kernels: the forward calls that need no gradient.

A contiguous CPU float32 tensor is a numpy array over the same memory
(``Tensor.numpy()`` copies nothing), so QuantizeLinear and
DequantizeLinear run on qlinear's kernels (numba, multi-threaded) instead
of as a chain of PyTorch element-wise operations, and the result comes back
as a tensor over the kernel's output (``torch.from_numpy``). The results are
the torch path's bit for bit: both are the specification's (tested against
each other on every integer and float8 type and granularity). Used when no
gradient is recorded; training keeps the torch path, whose backward needs
the saturation mask the kernels do not produce.
"""

from __future__ import annotations

import numpy as np
import torch

import qlinear
from qlinear.spec import QuantizePlan

__all__ = ["ENABLED", "applies", "fake_quantize", "quantize"]

ENABLED = True  # tests turn it off to compare with the torch path


def applies(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None) -> bool:
    """Whether this call can run on the kernels: CPU float32 tensors, float32 precision, a type numpy holds."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and scale.dtype == torch.float32
        and scale.device.type == "cpu"
        and (zero_point is None or zero_point.device.type == "cpu")
        and np.dtype(plan.precision) == np.float32
    )


def _arrays(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None):
    xn = x.detach().contiguous().numpy()
    sn = scale.detach().contiguous().numpy()
    zn = None if zero_point is None else zero_point.detach().contiguous().numpy().astype(plan.output_type.dtype)
    return xn, sn, zn


def quantize(
    plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, axis: int, block_size: int
) -> torch.Tensor:
    """QuantizeLinear's values as a float32 tensor (as the torch path returns them)."""
    xn, sn, zn = _arrays(plan, x, scale, zero_point)
    q = qlinear.quantize_linear(
        xn, sn, zn, axis=axis, block_size=block_size, output_dtype=plan.output_type.name, saturate=plan.saturate
    )
    return torch.from_numpy(np.asarray(q).astype(np.float32))


def fake_quantize(
    plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, axis: int, block_size: int
) -> torch.Tensor:
    """DequantizeLinear(QuantizeLinear(x)) as a float32 tensor."""
    xn, sn, zn = _arrays(plan, x, scale, zero_point)
    q = qlinear.quantize_linear(
        xn, sn, zn, axis=axis, block_size=block_size, output_dtype=plan.output_type.name, saturate=plan.saturate
    )
    return torch.from_numpy(qlinear.dequantize_linear(q, sn, zn, axis=axis, block_size=block_size))
