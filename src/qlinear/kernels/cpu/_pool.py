"""Large outputs from memory qlinear reuses, so a plain call does not pay the operating system's page zeroing.

A fresh array of tens of megabytes comes from ``mmap``: the kernel zeroes
every page on first touch, which costs more than the quantization itself
(16M float32 elements: 7-9 ms to allocate and fill, 2.2 ms to fill an array
that exists). ONNX Runtime reuses its own arena and never pays it. Outputs
of :data:`MIN_POOLED_BYTES` or more are therefore carved from blocks the
process keeps: each output is an array over a block's memory whose base
is a small owner object; every view of the output keeps that owner alive,
and only when the last of them is gone is the block returned to the pool
(a ``weakref.finalize`` on the owner). So memory is never handed out while
a live array uses it. Free blocks are kept up to :func:`pool_limit` bytes
(default 512 MiB; ``QLINEAR_OUTPUT_POOL_BYTES`` sets it, 0 turns the pool
off); the oldest go first. Only qlinear's own outputs come from it: nothing
changes how the rest of the process allocates.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

__all__ = ["MIN_POOLED_BYTES", "empty", "pool_limit", "set_pool_limit"]

MIN_POOLED_BYTES = 4 << 20  # below this glibc's heap serves repeated sizes without fresh pages
_ROUND = 1 << 20  # block sizes in whole MiB, so that near sizes share blocks
_LINE = 64  # blocks start on a cache line (as _lines.LINE, whose module loads llvmlite, which the pool does not need)

_lock = threading.Lock()
_free: OrderedDict[int, list[np.ndarray]] = OrderedDict()  # size -> free blocks, least recently returned first
_free_bytes = 0
_limit = int(os.environ.get("QLINEAR_OUTPUT_POOL_BYTES", 512 << 20))


class _Owner:
    """Owns one output's claim on a block: arrays over the block reference it, and its end returns the block."""

    __slots__ = ("__array_interface__", "__weakref__", "block")

    def __init__(self, block: np.ndarray, nbytes: int) -> None:
        self.block = block
        # Bytes here; the caller views them as its dtype (the interface's type strings cannot name ml_dtypes' types).
        self.__array_interface__ = {"data": (block.ctypes.data, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def pool_limit() -> int:
    """Bytes of free blocks the pool keeps."""
    return _limit


def set_pool_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` of free blocks (0: no pool); blocks beyond it are freed now."""
    global _limit
    with _lock:
        _limit = max(0, int(nbytes))
        _trim()


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array, from the pool when it is large."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_POOLED_BYTES or _limit == 0 or dtype.hasobject:
        return np.empty(shape, dtype)
    size = -(-nbytes // _ROUND) * _ROUND
    with _lock:
        blocks = _free.get(size)
        block = blocks.pop() if blocks else None
        if block is not None:
            global _free_bytes
            _free_bytes -= size
            if not blocks:
                del _free[size]
    if block is None:
        block = _aligned_block(size)
    owner = _Owner(block, nbytes)
    done = weakref.finalize(owner, _give_back, block)
    done.atexit = False
    return np.asarray(owner).view(dtype).reshape(shape)


def _aligned_block(size: int) -> np.ndarray:
    """``size`` bytes starting on a 64-byte line.

    The kernels stream whole lines; on an output that starts mid-line,
    every row of a per-axis or blocked layout has a partial line at each
    end, written element by element (16M elements of int16 per-axis on the
    last axis, one thread: 2.8-2.9 ms against 1.8 ms on lines).
    """
    raw = np.empty(size + _LINE, np.uint8)
    start = -raw.ctypes.data % _LINE
    return raw[start : start + size]


def _give_back(block: np.ndarray) -> None:
    global _free_bytes
    with _lock:
        if block.nbytes > _limit:
            return
        _free.setdefault(block.nbytes, []).append(block)
        _free.move_to_end(block.nbytes)
        _free_bytes += block.nbytes
        _trim()


def _trim() -> None:
    """Free the least recently returned blocks until the pool holds at most the limit (lock held)."""
    global _free_bytes
    while _free_bytes > _limit and _free:
        size, blocks = next(iter(_free.items()))
        blocks.pop(0)
        _free_bytes -= size
        if not blocks:
            del _free[size]
