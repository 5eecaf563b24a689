"""Compile the fused cpu kernels ahead of time, into numba's disk cache (for images and CI).

Until a kernel is compiled, calls with the default backend run on the numpy
reference while it compiles in the background; after this command every
process loads the kernels from the cache in under a second. Each
specialization is compiled once, on a tiny array: about 15 s each on a
2-core machine, a few minutes in all.
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np
from rich.console import Console

from qlinear.kernels.cpu import _placement
from qlinear.ops import dequantize_linear, quantize_linear

# One call per specialization of the kernels' argument types: x as float32,
# int32 or 16-bit words; codes of 8 or 16 bits; packed codes; and the one
# DequantizeLinear kernel (it takes every code width at once).
_X = {"float32": np.float32, "int32": np.int32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _calls():
    for x_name, x_type in _X.items():
        x = np.arange(-8, 8, dtype=np.float32).astype(x_type)
        scale = np.asarray(1, np.float32 if x_name in ("float32", "int32") else x_type)
        for out in ("uint8", "int16"):
            yield (
                f"QuantizeLinear {x_name} -> {out}",
                lambda x=x, s=scale, o=out: quantize_linear(x, s, output_dtype=o, backend="cpu"),
            )
        if x_name != "bfloat16":  # its 16-bit words share float16's specialization
            yield (
                f"QuantizeLinear {x_name} -> int4 (packed)",
                lambda x=x, s=scale: quantize_linear(x, s, output_dtype="int4", packed=True, backend="cpu"),
            )
    yield "DequantizeLinear", lambda: dequantize_linear(np.arange(16, dtype=np.uint8), np.float32(1), backend="cpu")
    yield "the finder of numba's worker threads", _find_workers


def _find_workers() -> None:
    # The kernel that finds numba's workers, to keep them off the caller's CPU.
    kernel, args = _placement._finder()
    kernel(*args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="print nothing")


def warm_up(console: Console, *, verbose: bool) -> float:
    """Compile (or load from the cache) every kernel specialization, showing which; returns the seconds it took."""
    total = time.perf_counter()
    for label, call in _calls():
        start = time.perf_counter()
        with console.status(f"cpu kernels: compiling or loading {label} (compiled once per environment, about 15 s each)"):
            call()
        if verbose:
            console.print(f"{label}: {time.perf_counter() - start:.1f} s", highlight=False)
    return time.perf_counter() - total


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True, quiet=args.quiet)
    console.print(f"cpu kernels ready in {warm_up(console, verbose=True):.1f} s", highlight=False)
    return 0
