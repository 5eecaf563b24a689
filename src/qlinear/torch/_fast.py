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


def _codes(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, axis: int, block_size: int):
    """``(codes, scale, zero point)`` as arrays: QuantizeLinear by the kernels on the tensors' own memory."""
    sn = scale.detach().contiguous().numpy()
    zn = None if zero_point is None else zero_point.detach().contiguous().numpy().astype(plan.output_type.dtype)
    q = qlinear.quantize_linear(
        x.detach().contiguous().numpy(), sn, zn, axis=axis, block_size=block_size, output_dtype=plan.output_type.name,
        saturate=plan.saturate,
    )  # fmt: skip
    return q, sn, zn


def quantize(
    plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, axis: int, block_size: int
) -> torch.Tensor:
    """QuantizeLinear's values as a float32 tensor (as the torch path returns them)."""
    q, _, _ = _codes(plan, x, scale, zero_point, axis, block_size)
    return torch.from_numpy(np.asarray(q).astype(np.float32))


def fake_quantize(
    plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, axis: int, block_size: int
) -> torch.Tensor:
    """DequantizeLinear(QuantizeLinear(x)) as a float32 tensor."""
    q, sn, zn = _codes(plan, x, scale, zero_point, axis, block_size)
    return torch.from_numpy(qlinear.dequantize_linear(q, sn, zn, axis=axis, block_size=block_size))


def training_forward(
    plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, axis: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """FakeQuantize's training forward on the kernels: ``(y, inside, clamped)`` as the torch path gives them, or None.

    For integer types per tensor or per axis: ``y`` by the Q and DQ kernels,
    and in one more parallel pass the backward's saturation mask and the
    clamped pre-saturation values (``clamp(round(x / s) + z)``, NaN where
    ``x`` is NaN), which for integer types is exactly the torch path's
    ``where(inside, q, clamp(pre))``.
    """
    g = plan.granularity
    if not plan.output_type.is_integer or g.kind not in ("per_tensor", "per_axis"):
        return None
    y = fake_quantize(plan, x, scale, zero_point, axis=axis, block_size=block_size)
    xn = x.detach().contiguous().numpy().reshape(-1)
    sn = scale.detach().contiguous().numpy().reshape(-1).astype(np.float32)
    zn = (
        np.zeros(sn.size, np.float32)
        if zero_point is None
        else zero_point.detach().contiguous().numpy().reshape(-1).astype(np.float32)
    )
    shape = tuple(x.shape)
    if g.kind == "per_axis":
        n, inner = shape[g.axis], int(np.prod(shape[g.axis + 1 :], dtype=np.int64))
    else:
        n, inner = 1, 1
    inside = np.empty(xn.size, np.bool_)
    clamped = np.empty(xn.size, np.float32)
    t = plan.output_type
    _kernels()["mask"](xn, sn, zn, n, *_rows(xn.size, n, inner), np.float32(t.qmin), np.float32(t.qmax), inside, clamped)
    return y, torch.from_numpy(inside.reshape(shape)), torch.from_numpy(clamped.reshape(shape))


def lsq_scale_terms(plan: QuantizePlan, x, grad, scale, zero_point, inside, clamped) -> torch.Tensor | None:
    """LSQ's per-element scale gradient ``g ((clamped - z) - inside * x / s)`` (NaN as 0), one pass; None: torch path.

    The same float32 operations in the same order as the torch path, so the
    tensor, and the sum the caller takes of it, are the torch path's bits.
    """
    g = plan.granularity
    tensors = (x, grad, scale, inside, clamped) + (() if zero_point is None else (zero_point,))
    if not ENABLED or g.kind not in ("per_tensor", "per_axis") or any(t.device.type != "cpu" for t in tensors):
        return None
    if x.dtype != torch.float32 or grad.dtype != torch.float32 or scale.dtype != torch.float32:
        return None
    xn = x.detach().contiguous().numpy().reshape(-1)
    gn = grad.detach().contiguous().numpy().reshape(-1)
    sn = scale.detach().contiguous().numpy().reshape(-1)
    zn = (
        np.zeros(sn.size, np.float32)
        if zero_point is None
        else zero_point.detach().contiguous().numpy().reshape(-1).astype(np.float32)
    )
    shape = tuple(x.shape)
    n, inner = (shape[g.axis], int(np.prod(shape[g.axis + 1 :], dtype=np.int64))) if g.kind == "per_axis" else (1, 1)
    out = np.empty(xn.size, np.float32)
    kernel = _kernels()["lsq"]
    kernel(xn, gn, sn, zn, n, *_rows(xn.size, n, inner), inside.numpy().reshape(-1), clamped.numpy().reshape(-1), out)
    return torch.from_numpy(out.reshape(shape))


def straight_through(grad: torch.Tensor, inside: torch.Tensor, grad_scale: float) -> torch.Tensor | None:
    """``where(inside, grad, 0) * grad_scale`` in one pass (float32 CPU), or None: the torch path."""
    if not ENABLED or grad.dtype != torch.float32 or grad.device.type != "cpu":
        return None
    gn = grad.detach().contiguous().numpy().reshape(-1)
    out = np.empty(gn.size, np.float32)
    _kernels()["ste"](gn, inside.numpy().reshape(-1), np.float32(grad_scale), -(-gn.size // 65536), 65536, out)
    return torch.from_numpy(out.reshape(grad.shape))


def _rows(total: int, n: int, inner: int) -> tuple[int, int]:
    """``(rows, row length)``: runs of one scale; a single scale's run is cut in rows of 64K for the threads."""
    if n == 1:
        return -(-total // 65536), 65536
    return total // inner, inner


_KERNELS: dict = {}


def _kernels() -> dict:
    """The numba kernels of the training passes (compiled and cached on first use)."""
    if not _KERNELS:
        from numba import njit, prange

        @njit(parallel=True, cache=True, error_model="numpy")
        def mask(x, s, z, n, rows, length, lo, hi, inside, clamped):  # pragma: no cover - compiled
            total = x.size
            for r in prange(rows):
                k = r % n
                sk, zk = s[k], z[k]
                for j in range(r * length, min(total, (r + 1) * length)):
                    p = np.rint(x[j] / sk) + zk
                    inside[j] = p >= lo and p <= hi
                    clamped[j] = p if p != p else min(max(p, lo), hi)

        @njit(parallel=True, cache=True, error_model="numpy")
        def lsq(x, g, s, z, n, rows, length, inside, clamped, out):  # pragma: no cover - compiled
            total = x.size
            zero = np.float32(0.0)
            for r in prange(rows):
                k = r % n
                sk, zk = s[k], z[k]
                for j in range(r * length, min(total, (r + 1) * length)):
                    v = x[j] / sk if inside[j] else zero
                    e = g[j] * ((clamped[j] - zk) - v)
                    out[j] = zero if e != e else e

        @njit(parallel=True, cache=True, error_model="numpy")
        def ste(g, inside, scale, rows, length, out):  # pragma: no cover - compiled
            total = g.size
            zero = np.float32(0.0)
            for r in prange(rows):
                for j in range(r * length, min(total, (r + 1) * length)):
                    out[j] = (g[j] if inside[j] else zero) * scale

        _KERNELS.update(mask=mask, lsq=lsq, ste=ste)
    return _KERNELS
