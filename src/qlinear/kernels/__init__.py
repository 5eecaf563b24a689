"""Kernels by name; a plan is computed by whichever backend the caller picks.

Every backend is a module with ``quantize(plan, x, scale, zero_point)`` and
``dequantize(plan, x, scale, zero_point)``. The cpu backend also writes into
a caller's buffer and reads and writes ONNX's packed bytes itself (``out=``
and ``packed=``); :func:`quantize` and :func:`dequantize` here give the
reference backend those keywords, doing the packing and copying around it.

``"auto"``, the operators' default, is not a backend of its own: it names
``"reference"`` for calls on fewer than :data:`AUTO_REFERENCE_BELOW`
elements and ``"cpu"`` for the rest, but ``"reference"`` again while the cpu
kernel for the call is not compiled yet (it compiles in the background:
cpu/_warm.py). Both give the same bits, so the choice changes only the
time: a small call is as fast on numpy and does not pay numba's start-up
(0.3-0.5 s in a fresh process, docs/reference/performance.md), and no call waits
for the compiler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import pack, unpack
from qlinear.kernels import cpu, reference
from qlinear.spec import DequantizePlan, QuantizePlan

__all__ = ["AUTO", "AUTO_REFERENCE_BELOW", "BACKENDS", "backend", "quantize", "dequantize"]

BACKENDS: dict[str, ModuleType] = {"cpu": cpu, "reference": reference}
AUTO = "auto"
# Elements of x below which "auto" runs the reference kernels: about the
# size from which the warm cpu kernel is as fast as numpy in the cases
# measured (2-core AVX-512 machine, numba 0.68 on 2 threads; Q from
# float32 and DQ back to float32 for uint8, packed int4 and float8e4m3fn,
# per tensor and blocked 32; docs/reference/performance.md has the table). A cpu call
# costs 13-19 us whatever its size (argument checks, waking numba's
# threads); numpy starts at 9-25 us and grows. Below 2048 elements numpy is
# at most 12 us slower (packed int4); from 2048 up the cpu kernel is as fast
# or faster, but for 8-bit and float8 DQ per tensor, where numpy stays
# 1-3 us ahead up to 4096-8192 elements.
AUTO_REFERENCE_BELOW = 2048


def backend(name: str, *, size: int, caller: str) -> ModuleType:
    """The kernel module for backend ``name`` on an ``x`` of ``size`` elements."""
    if name == AUTO:
        return reference if size < AUTO_REFERENCE_BELOW else cpu
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise QuantizationError(f"{caller}: backend must be one of {sorted([AUTO, *BACKENDS])}, got {name!r}") from None


def _deliver(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return y
    out[...] = y.reshape(out.shape)
    return out


def quantize(
    name: str,
    plan: QuantizePlan,
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    out: np.ndarray | None,
    packed: bool,
    caller: str,
) -> np.ndarray:
    """QuantizeLinear on backend ``name``, into ``out`` and/or packed if asked."""

    def elsewhere(module: ModuleType) -> np.ndarray:
        y = module.quantize(plan, x, scale, zero_point)
        return _deliver(pack(y) if packed else y, out)

    return _run(
        name, plan, caller, lambda wait: cpu.quantize(plan, x, scale, zero_point, out=out, packed=packed, wait=wait), elsewhere
    )


def dequantize(
    name: str,
    plan: DequantizePlan,
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    out: np.ndarray | None,
    packed: bool,
    caller: str,
) -> np.ndarray:
    """DequantizeLinear on backend ``name``; ``x`` is packed bytes if ``packed``."""

    def elsewhere(module: ModuleType) -> np.ndarray:
        codes = unpack(x, plan.input_type, plan.x_shape) if packed else x
        return _deliver(module.dequantize(plan, codes, scale, zero_point), out)

    return _run(
        name, plan, caller, lambda wait: cpu.dequantize(plan, x, scale, zero_point, out=out, packed=packed, wait=wait), elsewhere
    )


def _run(
    name: str,
    plan: QuantizePlan | DequantizePlan,
    caller: str,
    on_cpu: Callable[[bool], np.ndarray | None],
    elsewhere: Callable[[ModuleType], np.ndarray],
) -> np.ndarray:
    """``on_cpu(wait)`` where backend ``name`` resolves to the cpu kernels, else ``elsewhere(backend module)``.

    Under "auto" the cpu kernels do not wait for their compiler: while one
    compiles in the background, ``on_cpu`` gives None and the call runs on
    the reference kernels instead.
    """
    module = backend(name, size=math.prod(plan.x_shape), caller=caller)
    if module is cpu:
        y = on_cpu(name != AUTO)
        if y is not None:
            return y
        module = reference
    return elsewhere(module)
