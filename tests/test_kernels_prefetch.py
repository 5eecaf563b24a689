"""QuantizeLinear's lines of integer codes ask for ``x`` ahead of the line they load, and doing so never reads past what exists.

Oracle for the codes: ``backend="reference"``.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba import njit

from qlinear.kernels.cpu._lines import LINE, PREFETCH_AHEAD, STREAM_MIN_RUN, quantize_cached_line, quantize_line
from qlinear.kernels.cpu._reciprocal_lines import quantize_reciprocal_line, reciprocal_line_args


@njit
def _cached(x, dst, s, z, qmin, qmax, mask):
    quantize_cached_line(x, 0, dst, 0, (s, s, s), (z, z, z), (LINE // dst.itemsize, LINE // dst.itemsize), qmin, qmax, mask)


@njit
def _streamed(x, dst, s, z, qmin, qmax, mask):
    quantize_line(x, 0, dst, 0, (s, s, s), (z, z, z), (LINE // dst.itemsize, LINE // dst.itemsize), qmin, qmax, mask)


@njit
def _reciprocal(x, dst, s, z, qmin, qmax, mask):
    _, r, limit = reciprocal_line_args(s, z, qmin, qmax)  # 0.5 fits
    quantize_reciprocal_line(x, 0, dst, 0, s, r, z, limit, qmin, qmax, False)


def _aligned_line(dtype) -> np.ndarray:
    """A zeroed 64-byte line of ``dtype`` codes starting on a line, as the lines require of ``dst``."""
    raw = np.zeros(2 * LINE, np.uint8)
    start = -raw.ctypes.data % LINE
    return raw[start : start + LINE].view(dtype)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="reads x86 machine code")
# 16-bit codes never take the reciprocal lines.
@pytest.mark.parametrize(
    ("line", "dtype"),
    [(_cached, np.uint8), (_streamed, np.uint8), (_reciprocal, np.uint8), (_cached, np.uint16), (_streamed, np.uint16)],
    ids=["cached-uint8", "streamed-uint8", "reciprocal-uint8", "cached-uint16", "streamed-uint16"],
)
def test_the_lines_ask_for_x_ahead(line, dtype):
    lanes = LINE // np.dtype(dtype).itemsize
    x, dst = np.ones(lanes, np.float32), _aligned_line(dtype)
    qmax = np.float32(np.iinfo(dtype).max)
    line(x, dst, np.float32(0.5), np.float32(0), np.float32(0), qmax, np.int32(np.iinfo(dtype).max))
    assert (dst == 2).all()
    (signature,) = (sig for sig in line.signatures if sig[1].dtype == numba.from_dtype(dtype))
    asm = line.inspect_asm(signature)
    offsets = {int(m) for m in re.findall(r"prefetcht0\s+(\d+)\(", asm)}
    # The line's float32 x, a cache line at a time, PREFETCH_AHEAD further on.
    assert offsets == {PREFETCH_AHEAD + k * LINE for k in range(lanes * 4 // LINE)}, offsets


_GUARDED_CHILD = """
import ctypes, mmap, sys
import numpy as np
import qlinear

x_bytes, guard_bytes = int(sys.argv[1]), int(sys.argv[2])
# x, then memory that cannot be read: the prefetches of the last lines point into it.
region = mmap.mmap(-1, x_bytes + guard_bytes, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(base + x_bytes), ctypes.c_size_t(guard_bytes), 0) == 0
x = np.frombuffer(region, np.float32, count=x_bytes // 4)
x[:] = np.random.default_rng(0).standard_normal(x.size).astype(np.float32) * 40
# uint8 and int8 go by the reciprocal lines, uint16 by the cached ones.
for zp in (np.uint8(128), np.int8(0), np.uint16(0)):
    got = qlinear.quantize_linear(x, np.float32(0.3), zp, backend="cpu")
    want = qlinear.quantize_linear(x, np.float32(0.3), zp, backend="reference")
    assert np.array_equal(got, want), zp
print("same")
"""


def test_x_ending_before_memory_that_cannot_be_read():
    # A prefetch past the end of x is a hint that never faults; a load there would end the process.
    x_bytes = 4 * max(STREAM_MIN_RUN, 16384)  # one run of one scale, long enough for the lines
    guard_bytes = PREFETCH_AHEAD + 4 * LINE
    done = subprocess.run(
        [sys.executable, "-c", _GUARDED_CHILD, str(x_bytes), str(guard_bytes)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip() == "same", (done.returncode, done.stderr[-2000:])
