"""Python's own ``min`` and ``max``, as they were when qlinear was imported.

torch.export rebinds ``builtins.min`` and ``builtins.max`` to Python
wrappers while it traces a module, and numba cannot type a wrapper. numba
meets the two names twice: when it is imported (its typing tables key the
objects ``builtins`` holds then) and when it compiles a kernel (it looks the
kernel's global names up then, which may be long after import and on a
background thread, ``kernels/cpu/_warm``). A kernel that compiled during a
trace failed, and numba kept the failure for later calls. So the kernel
modules import the two names from here, and :func:`import_numba` imports
numba with these objects in ``builtins``. ``qlinear/__init__`` imports this
module first, before any trace can run.
"""

from __future__ import annotations

import builtins
import sys
import types

__all__ = ["import_numba", "max", "min"]

min = builtins.min
max = builtins.max


def import_numba() -> types.ModuleType:
    """numba, imported (on the first call) with Python's own ``min`` and ``max`` in ``builtins``."""
    numba = sys.modules.get("numba")
    if numba is not None:
        return numba
    # The import runs on the caller's thread; a trace on it waits for the import, so the swap cannot leak into it.
    outside = builtins.min, builtins.max
    builtins.min, builtins.max = min, max
    try:
        import numba
    finally:
        builtins.min, builtins.max = outside
    return numba
