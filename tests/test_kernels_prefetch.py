"""QuantizeLinear's lines ask for ``x`` ahead of the line they load, and doing so never reads past what exists.

Oracle for the codes: ``backend="reference"``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np

from qlinear.kernels.cpu._lines import LINE, PREFETCH_AHEAD


def test_the_lines_ask_for_x_ahead():
    from numba import njit

    from qlinear.kernels.cpu._lines import quantize_cached_line

    @njit
    def one_line(x, dst, s, z):
        quantize_cached_line(x, 0, dst, 0, (s, s, s), (z, z, z), (64, 64), np.float32(0), np.float32(255), np.int32(255))

    x, dst = np.ones(64, np.float32), np.empty(64, np.uint8)
    one_line(x, dst, np.float32(0.5), np.float32(0))
    assert (dst == 2).all()
    asm = one_line.inspect_asm(one_line.signatures[0])
    offsets = {int(m) for m in re.findall(r"prefetcht0\s+(\d+)\(", asm)}
    # The line's 256 bytes of x, a cache line at a time, PREFETCH_AHEAD further on.
    assert offsets == {PREFETCH_AHEAD + k * LINE for k in range(4)}, offsets


_GUARDED_CHILD = """
import ctypes, mmap
import numpy as np
import qlinear

page = mmap.PAGESIZE
# 64 KiB of x, then 64 KiB that cannot be read: the lines' prefetches of the
# last lines point into it.
region = mmap.mmap(-1, 128 << 10, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(base + (64 << 10)), ctypes.c_size_t(64 << 10), 0) == 0
x = np.frombuffer(region, np.float32, count=(64 << 10) // 4)
x[:] = np.random.default_rng(0).standard_normal(x.size).astype(np.float32) * 40
for zp in (np.uint8(128), np.int8(0)):
    got = qlinear.quantize_linear(x, np.float32(0.3), zp, backend="cpu")
    want = qlinear.quantize_linear(x, np.float32(0.3), zp, backend="reference")
    assert np.array_equal(got, want), zp
print("same")
"""


def test_x_ending_before_memory_that_cannot_be_read():
    # A prefetch past the end of x is a hint that never faults; a load there would end the process.
    done = subprocess.run([sys.executable, "-c", _GUARDED_CHILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "same", (done.returncode, done.stderr[-2000:])
