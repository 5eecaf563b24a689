"""8-bit QuantizeLinear lines that multiply by the scale's reciprocal give the division's bits.

Oracle: ``backend="reference"`` (numpy's float32 division, then rint,
clamp and the zero point). The inputs are chosen where multiplying and
dividing disagree: quotients on and one float either side of every
half-integer, for scales whose reciprocal is inexact, beside NaN, the
infinities and quotients far past the bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

import qlinear
from qlinear.kernels.cpu import _lines
from qlinear.kernels.cpu._reciprocal_lines import NEAR_HALF, avx512_bw_dq, reciprocal_line_args

# Scales whose float32 reciprocal is inexact, so x * r and x / s differ somewhere near every half-integer.
_SCALES = [np.float32(v) for v in (0.1, 1 / 3, 0.007, 2.7, 0.3, 1e-3)]
_ZERO_POINTS = [np.uint8(0), np.uint8(128), np.uint8(255), np.uint8(37), np.int8(0), np.int8(-128), np.int8(127), np.int8(-9)]


def _near_ties(scale: np.float32, n: int, seed: int) -> np.ndarray:
    """``x`` whose quotients by ``scale`` sit on, or a float either side of, half-integers from -300 to 300."""
    rng = np.random.default_rng(seed)
    halves = (rng.integers(-300, 300, n).astype(np.float32) + np.float32(0.5)) * scale
    side = rng.integers(0, 3, n)
    x = np.where(side == 1, np.nextafter(halves, np.float32(np.inf)), halves)
    x = np.where(side == 2, np.nextafter(halves, np.float32(-np.inf)), x).astype(np.float32)
    x[rng.integers(0, n, 40)] = np.nan
    x[rng.integers(0, n, 8)] = np.inf
    x[rng.integers(0, n, 8)] = -np.inf
    x[rng.integers(0, n, 8)] = np.float32(3e38)
    return x


def test_multiplying_and_dividing_disagree_on_these_inputs():
    # Without this the exactness tests below could not fail.
    for scale in _SCALES:
        x = _near_ties(scale, 1 << 14, 0)
        finite = np.isfinite(x) & (np.abs(x) < 1e30)
        with np.errstate(all="ignore"):
            differ = np.rint(x / scale) != np.rint(x * (np.float32(1) / scale))
        assert differ[finite].sum() > 100, scale


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("scale", _SCALES, ids=lambda s: f"{s:.4g}")
def test_near_ties_give_the_division_bits(scale, stream, monkeypatch):
    if stream:
        monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    x = _near_ties(scale, 1 << 17, 1)  # runs of 16384 elements a task: long enough for the lines
    for zero_point in _ZERO_POINTS:
        got = qlinear.quantize_linear(x, scale, zero_point, backend="cpu")
        want = qlinear.quantize_linear(x, scale, zero_point, backend="reference")
        np.testing.assert_array_equal(got, want, err_msg=f"zero point {zero_point!r}")


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
def test_quotients_far_from_ties_and_rare_nans_give_the_division_bits(stream, monkeypatch):
    # Lines with no near-tie take the product; a NaN lane alone sends its line to the division.
    if stream:
        monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    rng = np.random.default_rng(2)
    scale = np.float32(0.05)
    x = (rng.standard_normal(1 << 17) * 4).astype(np.float32)
    x[rng.integers(0, x.size, 30)] = np.nan
    for zero_point in _ZERO_POINTS:
        got = qlinear.quantize_linear(x, scale, zero_point, backend="cpu")
        want = qlinear.quantize_linear(x, scale, zero_point, backend="reference")
        np.testing.assert_array_equal(got, want, err_msg=f"zero point {zero_point!r}")


def test_the_product_is_offered_only_where_its_error_bound_holds():
    f = np.float32
    fits, r, limit = reciprocal_line_args(f(0.1), f(128), f(0), f(255))
    assert fits and r == f(1) / f(0.1)
    assert limit == f(0.5 - 129 * NEAR_HALF)  # M: the wider side of the clamp, |0 - 128|, plus one
    tiny = np.finfo(np.float32).tiny
    assert not reciprocal_line_args(f(tiny / 4), f(0), f(0), f(255))[0]  # a subnormal scale
    assert not reciprocal_line_args(f(2.0**127), f(0), f(0), f(255))[0]  # its reciprocal is subnormal
    assert not reciprocal_line_args(f(0.1), f(0), f(-32768), f(32767))[0]  # 16-bit ranges: near-ties in most lines
    assert not reciprocal_line_args(f(np.inf), f(0), f(0), f(255))[0]


def test_the_packs_are_used_only_on_processors_with_them():
    from llvmlite import binding

    host = binding.get_host_cpu_features()
    assert avx512_bw_dq() == bool(host.get("avx512bw", False) and host.get("avx512dq", False))


_PORTABLE_CHILD = """
import numpy as np, qlinear
from qlinear.kernels.cpu._reciprocal_lines import avx512_bw_dq
assert not avx512_bw_dq()
rng = np.random.default_rng(3)
s = np.float32(1 / 3)
x = ((rng.integers(-300, 300, 1 << 16).astype(np.float32) + np.float32(0.5)) * s).astype(np.float32)
x[::3] = np.nextafter(x[::3], np.float32(np.inf))
x[::1000] = np.nan
for zp in (np.uint8(128), np.int8(-9), np.uint8(0)):
    got = qlinear.quantize_linear(x, s, zp, backend="cpu")
    want = qlinear.quantize_linear(x, s, zp, backend="reference")
    assert np.array_equal(got, want), zp
print("same")
"""


def test_the_portable_lines_give_the_division_bits_too(tmp_path):
    # Compiled for another processor (as NUMBA_CPU_NAME asks), the lines keep
    # to portable vector code; a copy of the package keeps its cache apart.
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    copy = tmp_path / "src"
    shutil.copytree(Path(qlinear.__file__).parent, copy / "qlinear", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-c", _PORTABLE_CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-2000:]
