"""Fused, multi-threaded CPU kernels (numba), bit-exact with the reference.

One pass over ``x`` per call, parallel over chunks, no temporary the size of
``x``; 2/4/6-bit outputs can be written (and inputs read) straight as ONNX's
packed bytes. numba is imported on the first call, not with qlinear.

Compiled kernels are cached on disk by numba (``cache=True``) through its
own search order: ``NUMBA_CACHE_DIR`` if set, else ``__pycache__`` beside
these sources, else, when the package directory is read-only, numba's
user-wide cache directory (``~/.cache/numba`` on Linux). The first call in a
fresh environment compiles (seconds); later processes load from the cache.
Under ``backend="auto"`` no call waits for that: it runs on the reference
kernels while the cpu kernel compiles in the background (``_warm.py``);
``qlinear warmup`` compiles every kernel ahead of time.
"""

from __future__ import annotations

from qlinear.kernels.cpu._dequantize import dequantize
from qlinear.kernels.cpu._quantize import quantize
from qlinear.kernels.cpu._schedule import make_tbb_loadable
from qlinear.kernels.cpu._warm import compiling

# Before numba starts its threads (kernels/cpu/_schedule.py says why TBB's).
make_tbb_loadable()

__all__ = ["compiling", "dequantize", "quantize"]
