"""qlinear.torch's calls without gradients on CPU float32 run on the fused kernels: the torch path's results, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qlinear.torch as qt
from qlinear.torch import _fast

TYPES = ["uint8", "int8", "uint16", "int16", "int4", "uint4", "int2", "float8e4m3fn", "float8e5m2", "float4e2m1"]
LAYOUTS = [dict(), dict(axis=1), dict(axis=0, block_size=4), dict(axis=2, block_size=3)]


def _qparams(t: str, layout: dict, shape: tuple[int, ...], rng) -> tuple[torch.Tensor, torch.Tensor | None]:
    if "block_size" in layout:
        s_shape = list(shape)
        s_shape[layout["axis"]] = -(-shape[layout["axis"]] // layout["block_size"])
    elif "axis" in layout:
        s_shape = [shape[layout["axis"]]]
    else:
        s_shape = []
    scale = torch.from_numpy(rng.uniform(0.01, 0.5, s_shape).astype(np.float32))
    if t.startswith("float"):
        return scale, None
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}.get(t, (0, 3))
    zp = torch.from_numpy(rng.integers(lo, hi + 1, s_shape).astype(np.float32)) if t[0] == "u" else torch.zeros(s_shape)
    return scale, zp


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "per_tensor")
@pytest.mark.parametrize("t", TYPES)
def test_kernels_give_the_torch_paths_bits(t, layout, monkeypatch):
    rng = np.random.default_rng(0)
    # 5440 elements: above the 2048 below which the default backend runs numpy, so the numba kernels serve.
    x = torch.from_numpy((rng.standard_normal((16, 20, 17)) * 40).astype(np.float32))
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    scale, zp = _qparams(t, layout, tuple(x.shape), rng)
    calls = {
        "fake_quantize": lambda: qt.fake_quantize(x, scale, zp, output_dtype=t, **layout),
        "quantize_linear": lambda: qt.quantize_linear(x, scale, zp, output_dtype=t, **layout),
    }
    for name, call in calls.items():
        fast = call()
        monkeypatch.setattr(_fast, "ENABLED", False)
        slow = call()
        monkeypatch.setattr(_fast, "ENABLED", True)
        assert fast.dtype == slow.dtype and fast.shape == slow.shape, name
        assert fast.numpy().tobytes() == slow.numpy().tobytes(), (name, t, layout)


def test_kernels_serve_only_calls_without_gradients():
    x = torch.randn(64, requires_grad=True)
    y = qt.fake_quantize(x, torch.tensor(0.1), output_dtype="int8")
    assert y.grad_fn is not None  # the torch path, which records the saturation mask for backward
    with torch.no_grad():
        assert qt.fake_quantize(x, torch.tensor(0.1), output_dtype="int8").grad_fn is None


# Axis 0: runs of one scale (340 elements); axis 1: periods of 20 scales 17 apart; axis 2: a scale an element.
@pytest.mark.parametrize(
    "layout", [dict(), dict(axis=0), dict(axis=1), dict(axis=2)], ids=["per_tensor", "axis0", "axis1", "axis2"]
)
@pytest.mark.parametrize("t", ["uint8", "int8", "int4", "uint16", "int2"])
def test_training_forward_and_its_gradients_match_the_torch_path(t, layout, monkeypatch):
    # Ties at .5 (round half to even), both saturation edges, NaN, infinities, -0.
    rng = np.random.default_rng(1)
    shape = (16, 20, 17)
    scale, zp = _qparams(t, layout, shape, rng)
    s_full = scale.reshape([-1 if (layout and d == layout["axis"]) else 1 for d in range(3)]) if layout else scale
    halves = torch.from_numpy(rng.integers(-300, 300, shape).astype(np.float32)) + 0.5
    x = torch.where(
        torch.from_numpy(rng.random(shape) < 0.3),
        halves * s_full,
        torch.from_numpy((rng.standard_normal(shape) * 60).astype(np.float32)),
    )
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(_fast, "ENABLED", enabled)
        xg, sg = x.clone().requires_grad_(True), scale.clone().requires_grad_(True)
        zg = None if zp is None else zp.clone().requires_grad_(True)
        y = qt.fake_quantize(xg, sg, zg, output_dtype=t, **layout)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        results.append([y.detach(), xg.grad, sg.grad, None if zg is None else zg.grad])
    for fast, slow in zip(*results, strict=True):
        if slow is None:
            assert fast is None
            continue
        assert fast.numpy().tobytes() == slow.numpy().tobytes(), (t, layout)


def test_training_kernels_keep_numbas_workers_off_the_callers_cpu(monkeypatch):
    import numba

    from qlinear.kernels.cpu import _placement

    if not _placement.enabled() or numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("worker placement is Linux's, and needs numba threads")
    placed = []
    monkeypatch.setattr(_fast, "keep_workers_off_caller", lambda: placed.append(True))
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        grad = torch.ones(1 << 16)
        out = _fast.straight_through(grad, torch.ones(1 << 16, dtype=torch.bool), 0.5)
    finally:
        numba.set_num_threads(before)
    assert placed == [True] and bool((out == 0.5).all())
