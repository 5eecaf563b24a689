"""Compiling the fused kernels without making a call wait for the compiler.

numba compiles a kernel for each combination of argument types the first
time it meets it, 13-16 s each on this machine, and caches the result on
disk (``cache=True``), from where later processes load it in well under a
second. A call that ``backend="auto"`` sends to the cpu kernels asks
:func:`ready` first: a specialization already compiled, or loaded from the
disk cache within :data:`LOAD_WAIT_S`, runs at once; otherwise it keeps
compiling in a background thread and :func:`ready` says no, so the call
runs on the numpy reference (the same bits) until the kernel is there.
``backend="cpu"`` always waits. The threads are not daemons: a process that
ends while one compiles waits for it at exit, so the disk cache is written
and the next process starts warm. ``qlinear warmup`` compiles every
specialization ahead of time, for images and CI.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LOAD_WAIT_S", "compiling", "ready"]

# Long enough to load a cached specialization from disk (0.05-0.4 s measured), far shorter than a compile.
LOAD_WAIT_S = 1.0

_lock = threading.Lock()
_done: set[tuple] = set()
_running: dict[tuple, threading.Thread] = {}


def _key(kernel: Any, args: Sequence[Any]) -> tuple:
    # The kernels take flat C-contiguous arrays: dtype and writeability decide numba's types.
    return (kernel.__name__, *((a.dtype.str, a.flags.writeable) if isinstance(a, np.ndarray) else type(a) for a in args))


def ready(kernel: Any, args: Sequence[Any], wait_s: float = LOAD_WAIT_S) -> bool:
    """Whether ``kernel`` can run on ``args`` now; if not, it is being compiled in the background.

    The call that starts the compile waits up to ``wait_s`` for it.
    """
    key = _key(kernel, args)
    if key in _done:
        return True
    with _lock:
        if key in _running:  # compiling already: no call waits for it
            return False
        thread = threading.Thread(target=_compile, args=(kernel, args, key), name=f"qlinear-compile-{kernel.__name__}")
        _running[key] = thread
        thread.start()
    # The call that starts it waits as long as a load from the disk cache takes.
    thread.join(wait_s)
    return key in _done


def _compile(kernel: Any, args: Sequence[Any], key: tuple) -> None:
    import numba

    try:
        kernel.compile(tuple(numba.typeof(a) for a in args))
    finally:
        with _lock:
            _done.add(key)  # failed or not: a call then compiles (and raises) on its own thread
            _running.pop(key, None)


def compiling() -> list[str]:
    """The kernels being compiled in the background now."""
    with _lock:
        return sorted({k[0] for k in _running})
