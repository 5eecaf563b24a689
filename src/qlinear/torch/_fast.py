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
from qlinear._builtins import import_numba, max, min
from qlinear.kernels.cpu import _pool as pool
from qlinear.kernels.cpu._placement import keep_workers_off_caller
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
    # From qlinear's output pool: fresh pages of this size would cost their zeroing each step.
    inside = pool.empty((xn.size,), np.dtype(np.bool_))
    clamped = pool.empty((xn.size,), np.dtype(np.float32))
    t = plan.output_type
    _kernels()["mask"](xn, sn, zn, n, *_rows(xn.size, n, inner), np.float32(t.qmin), np.float32(t.qmax), inside, clamped)
    return y, torch.from_numpy(inside.reshape(shape)), torch.from_numpy(clamped.reshape(shape))


def lsq_scale_terms(
    plan: QuantizePlan, x, grad, scale, zero_point, inside, clamped, grad_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """LSQ's per-element scale gradient ``g ((clamped - z) - inside * x / s)`` (NaN as 0), one pass; None: torch path.

    With ``grad_scale``, x's straight-through gradient (:func:`straight_through`)
    comes from the same pass: ``(per-element terms, dx or None)``. The same
    float32 operations in the same order as the torch path, so the tensors,
    and the sum the caller takes, are the torch path's bits.
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
    out = pool.empty((xn.size,), np.dtype(np.float32))
    dx = pool.empty((xn.size if grad_scale is not None else 0,), np.dtype(np.float32))
    kernel = _kernels()["lsq"]
    rows = _rows(xn.size, n, inner)
    gs = np.float32(grad_scale if grad_scale is not None else 1.0)
    kernel(xn, gn, sn, zn, n, *rows, inside.numpy().reshape(-1), clamped.numpy().reshape(-1), out, dx, gs)
    return torch.from_numpy(out.reshape(shape)), (torch.from_numpy(dx.reshape(shape)) if grad_scale is not None else None)


def straight_through(grad: torch.Tensor, inside: torch.Tensor, grad_scale: float) -> torch.Tensor | None:
    """``where(inside, grad, 0) * grad_scale`` in one pass (float32 CPU), or None: the torch path."""
    if not ENABLED or grad.dtype != torch.float32 or grad.device.type != "cpu":
        return None
    gn = grad.detach().contiguous().numpy().reshape(-1)
    out = pool.empty((gn.size,), np.dtype(np.float32))
    _kernels()["ste"](gn, inside.numpy().reshape(-1), np.float32(grad_scale), *_rows(gn.size, 1, 1)[:2], out)
    return torch.from_numpy(out.reshape(grad.shape))


def _rows(total: int, n: int, inner: int) -> tuple[int, int, int]:
    """``(rows, row length, inner)`` the kernels walk, in parallel over rows.

    Runs of one scale (``inner`` 0 below: the scale of row ``r`` is
    ``r % n``) where they are long; one scale's run is cut in rows of 64K
    for the threads. Where runs are short (per axis on the last axes), a row
    is a whole period of ``n`` scales and element ``t`` of it has scale
    ``t // inner``.
    """
    if n == 1:
        return -(-total // 65536), 65536, 0
    if inner >= 256:
        return total // inner, inner, 0
    return total // (n * inner), n * inner, inner


_KERNELS: dict = {}


def _kernels() -> dict:
    """The numba kernels of the training passes (compiled and cached on first use)."""
    if not _KERNELS:
        numba = import_numba()
        njit, prange = numba.njit, numba.prange

        # Each kernel has three loops: rows of one scale (``inner`` 0: the scale read once a row, so the loop
        # vectorizes), rows of a period whose scale steps with the element (``inner`` 1), and rows of a
        # period whose element ``t`` has scale ``t // inner``.
        @njit(parallel=True, cache=True, error_model="numpy")
        def mask(x, s, z, n, rows, length, inner, lo, hi, inside, clamped):  # pragma: no cover - compiled
            total = x.size
            for r in prange(rows):
                base = r * length
                if inner == 0:
                    sk, zk = s[r % n], z[r % n]
                    for j in range(base, min(total, base + length)):
                        p = np.rint(x[j] / sk) + zk
                        inside[j] = p >= lo and p <= hi
                        clamped[j] = p if p != p else min(max(p, lo), hi)
                elif inner == 1:  # per axis on the last axis: the scale steps with the element
                    for j in range(base, min(total, base + length)):
                        p = np.rint(x[j] / s[j - base]) + z[j - base]
                        inside[j] = p >= lo and p <= hi
                        clamped[j] = p if p != p else min(max(p, lo), hi)
                else:
                    for j in range(base, min(total, base + length)):
                        k = (j - base) // inner
                        p = np.rint(x[j] / s[k]) + z[k]
                        inside[j] = p >= lo and p <= hi
                        clamped[j] = p if p != p else min(max(p, lo), hi)

        @njit(parallel=True, cache=True, error_model="numpy")
        def lsq(x, g, s, z, n, rows, length, inner, inside, clamped, out, dx, gs):  # pragma: no cover - compiled
            total = x.size
            zero = np.float32(0.0)
            with_dx = dx.size > 0
            for r in prange(rows):
                base = r * length
                if inner == 0:
                    sk, zk = s[r % n], z[r % n]
                    for j in range(base, min(total, base + length)):
                        v = x[j] / sk if inside[j] else zero
                        e = g[j] * ((clamped[j] - zk) - v)
                        out[j] = zero if e != e else e
                        if with_dx:
                            dx[j] = (g[j] if inside[j] else zero) * gs
                elif inner == 1:
                    for j in range(base, min(total, base + length)):
                        v = x[j] / s[j - base] if inside[j] else zero
                        e = g[j] * ((clamped[j] - z[j - base]) - v)
                        out[j] = zero if e != e else e
                        if with_dx:
                            dx[j] = (g[j] if inside[j] else zero) * gs
                else:
                    for j in range(base, min(total, base + length)):
                        k = (j - base) // inner
                        v = x[j] / s[k] if inside[j] else zero
                        e = g[j] * ((clamped[j] - z[k]) - v)
                        out[j] = zero if e != e else e
                        if with_dx:
                            dx[j] = (g[j] if inside[j] else zero) * gs

        @njit(parallel=True, cache=True, error_model="numpy")
        def ste(g, inside, scale, rows, length, out):  # pragma: no cover - compiled
            total = g.size
            zero = np.float32(0.0)
            for r in prange(rows):
                for j in range(r * length, min(total, (r + 1) * length)):
                    out[j] = (g[j] if inside[j] else zero) * scale

        _KERNELS.update({name: _placed(kernel) for name, kernel in (("mask", mask), ("lsq", lsq), ("ste", ste))})
    return _KERNELS


def _placed(kernel):
    """``kernel``, launched with numba's workers kept off the caller's CPU, as qlinear's own kernels are."""

    def launch(*args):
        if import_numba().get_num_threads() > 1:
            keep_workers_off_caller()
        return kernel(*args)

    return launch
