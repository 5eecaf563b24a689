"""What the kernels' hand-written LLVM shares: calls of LLVM intrinsics, and which instructions the target allows.

Kept apart from the line functions so that a module of lines can use
processor-specific instructions where :func:`host_has` says so, and
portable vector code elsewhere.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

__all__ = ["call_intrinsic", "host_has", "prefetch"]


def host_has(*features: str) -> bool:
    """Whether line functions may use instructions of all these LLVM features (``"avx512bw"``, ...).

    numba compiles for the host processor unless told otherwise
    (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``); told otherwise, the line
    functions keep to portable vector code, which LLVM lowers for any
    processor.
    """
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return False
    host = binding.get_host_cpu_features()
    return all(host.get(name, False) for name in features)


def call_intrinsic(builder, name, result_type, args):
    """Call the LLVM intrinsic ``name`` on ``args`` (declared on first use in the module)."""
    function_type = ir.FunctionType(result_type, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, function_type, name), args)


def prefetch(builder, pointer, nbytes, line):
    """Ask for the ``line``-byte cache lines of ``nbytes`` from ``pointer`` into every cache level (PREFETCHT0).

    A hint: it never faults, so it may point past an array's end.
    """
    i8 = ir.IntType(8)
    i32 = ir.IntType(32)
    start = builder.bitcast(pointer, i8.as_pointer())
    for offset in range(0, nbytes, line):
        at = builder.gep(start, [ir.Constant(ir.IntType(64), offset)])
        # read (0), keep in every level (3), data cache (1)
        call_intrinsic(
            builder, "llvm.prefetch.p0i8", ir.VoidType(), [at, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        )
