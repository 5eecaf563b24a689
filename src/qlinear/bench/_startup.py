"""Start-up and compile times, each measured in a fresh Python process.

A process that imports qlinear pays for the import; its first call on
``backend="auto"`` below the threshold runs numpy only; its first call that
reaches the cpu kernels imports numba and loads the compiled kernels from
numba's disk cache, or compiles them when the cache is empty (measured with
a fresh, empty ``NUMBA_CACHE_DIR``). Each step but the cold compile is the
median over ``repeats`` processes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from qlinear._table import Table
from qlinear.kernels import AUTO_REFERENCE_BELOW

__all__ = ["SMALL", "LARGE", "run_child", "run_startup", "startup_table"]

# Elements of x: the small call runs on numpy under backend="auto"; the
# large one reaches the cpu kernels and is small enough that the kernel's
# own time (well under a millisecond) does not count.
SMALL = 1024
LARGE = 1 << 16
assert SMALL < AUTO_REFERENCE_BELOW <= LARGE

# QuantizeLinear float32 -> uint8 and DequantizeLinear back, per tensor: the
# first specialization of each kernel most programs compile.
_CHILD = """
import json, sys, time
start = time.perf_counter()
import qlinear
imported = time.perf_counter()
import numpy as np
numba_s = 0.0
if {import_numba}:
    before = time.perf_counter()
    import numba
    numba_s = time.perf_counter() - before
x = np.linspace(-4, 4, {size}, dtype=np.float32)
scale, zero_point = np.float32(1 / 32), np.uint8(128)
t0 = time.perf_counter()
q = qlinear.quantize_linear(x, scale, zero_point, backend={backend!r})
t1 = time.perf_counter()
qlinear.dequantize_linear(q, scale, zero_point, backend={backend!r})
t2 = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "numba_import_s": numba_s, "q_s": t1 - t0, "dq_s": t2 - t1,
                  "numba_loaded": "numba" in sys.modules}}))
"""


def run_child(backend: str, size: int, *, import_numba: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Times of one fresh process: import qlinear, then a first Q and a first DQ call.

    Returns ``import_s``, ``numba_import_s`` (numba imported on its own
    before the calls when ``import_numba``, else 0), ``q_s``, ``dq_s`` and
    ``numba_loaded`` (whether numba was imported by the end).
    """
    code = _CHILD.format(size=size, backend=backend, import_numba=import_numba)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"start-up measurement failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def _import_wall() -> float:
    """Seconds of ``python -c "import qlinear"``, the process's whole life."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import qlinear"], check=True)
    return time.perf_counter() - start


def run_startup(*, repeats: int = 5, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Measure start-up and compile times in fresh processes; seconds.

    Returns ``{"repeats", "steps"}``; each step has ``step``, ``seconds`` and
    ``detail``.
    """
    total, done = 3 * repeats + 2, 0

    def tick(value):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)
        return value

    def repeat(measure: Callable[[], Any]) -> list[Any]:
        return [tick(measure()) for _ in range(repeats)]

    imports = repeat(_import_wall)
    small = repeat(lambda: run_child("auto", SMALL))
    tick(run_child("cpu", LARGE))  # fills the cache if it is empty
    warm = repeat(lambda: run_child("cpu", LARGE, import_numba=True))
    with tempfile.TemporaryDirectory(prefix="qlinear-numba-cache-") as cache:
        cold = tick(run_child("cpu", LARGE, env={**os.environ, "NUMBA_CACHE_DIR": cache}))

    def mid(runs: list[dict[str, Any]], *keys: str) -> float:
        return statistics.median(sum(r[k] for k in keys) for r in runs)

    steps = [
        (
            "import qlinear",
            statistics.median(imports),
            f'python -c "import qlinear", the whole process; in-process import {mid(small, "import_s") * 1e3:.0f} ms',
        ),
        (
            "first call, small (auto)",
            mid(small, "q_s"),
            f"QuantizeLinear uint8 per tensor, {SMALL:,} elements, on numpy; numba imported: "
            f"{'yes' if any(r['numba_loaded'] for r in small) else 'no'}",
        ),
        (
            "first call on numba, warm cache",
            mid(warm, "numba_import_s", "q_s"),
            f"QuantizeLinear uint8 per tensor, {LARGE:,} elements, backend='cpu': import numba "
            f"{mid(warm, 'numba_import_s') * 1e3:.0f} ms + first call {mid(warm, 'q_s') * 1e3:.0f} ms; first DequantizeLinear "
            f"after it {mid(warm, 'dq_s') * 1e3:.0f} ms",
        ),
        (
            "cold compile, first Q",
            cold["q_s"],
            "QuantizeLinear float32 -> uint8 per tensor, empty NUMBA_CACHE_DIR; includes importing numba",
        ),
        ("cold compile, first DQ", cold["dq_s"], "DequantizeLinear uint8 -> float32 per tensor, in the same process after the Q"),
    ]
    return {"repeats": repeats, "steps": [{"step": s, "seconds": v, "detail": d} for s, v, d in steps]}


def startup_table(report: dict[str, Any]) -> Table:
    """The start-up report as a table."""
    table = Table(title=f"qlinear start-up, fresh processes (median of {report['repeats']}; cold compile once)")
    table.add_column("step")
    table.add_column("ms", justify="right")
    table.add_column("detail")
    for step in report["steps"]:
        table.add_row(step["step"], f"{step['seconds'] * 1e3:,.2f}", step["detail"])
    return table
