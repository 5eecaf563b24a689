"""No call waits for numba's compiler: "auto" runs on the reference while a kernel compiles, and the cache is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from qlinear.cli import main

# In a fresh numba cache: the first auto call returns while its kernel compiles in the background.
_FIRST = """
import json, time, numpy as np, qlinear
from qlinear.kernels.cpu import compiling
x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
start = time.perf_counter()
y = qlinear.quantize_linear(x, np.float32(0.1), np.uint8(128))
seconds = time.perf_counter() - start
same = bool((y == qlinear.quantize_linear(x, np.float32(0.1), np.uint8(128), backend="reference")).all())
print(json.dumps({"seconds": seconds, "same": same, "compiling": compiling()}))
"""

# A later process: the kernel comes from the cache the first one wrote at exit.
_LATER = """
import json, numpy as np, qlinear
from qlinear.kernels.cpu import compiling
qlinear.quantize_linear(np.ones(1 << 20, np.float32), np.float32(0.1), np.uint8(128))
print(json.dumps({"compiling": compiling()}))
"""


def _run(code: str, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_first_call_runs_on_the_reference_while_the_kernel_compiles(tmp_path):
    first = _run(_FIRST, str(tmp_path))
    # The kernel that finds numba's workers (kernels/cpu/_placement.py) compiles beside it.
    assert first["same"] and first["compiling"] == ["quantize_kernel", "thread_ids"]
    assert first["seconds"] < 5.0  # a 1 s wait for a cache that is not there, then numpy (a compile takes 10-16 s)
    # Both were written to the disk cache at exit; the next process loads the kernel from there (the
    # finder loads in the background, as no call waits for it).
    cached = {path.name.split("-")[0] for path in tmp_path.rglob("*.nbi")}
    assert {"_quantize_kernel.quantize_kernel", "_worker_ids.thread_ids"} <= cached
    assert _run(_LATER, str(tmp_path))["compiling"] in ([], ["thread_ids"])


def test_warmup_command_loads_every_kernel(capsys):
    assert main(["warmup"]) == 0
    err = capsys.readouterr().err
    assert "cpu kernels ready" in err and "DequantizeLinear" in err and "int4 (packed)" in err and "worker threads" in err


# torch.export rebinds builtins.min and builtins.max to Python wrappers while it
# traces. In a fresh numba cache, three kernel specializations (the codes' width
# and writeability are the kernel's types) compile: the first inside a trace that
# also imports numba, the second outside, the third inside a trace again.
_UNDER_TRACE = """
import builtins, contextlib, functools, json, numpy as np, qlinear

@contextlib.contextmanager
def trace():
    real_min, real_max = builtins.min, builtins.max
    builtins.min = functools.partial(lambda *a, real, **k: real(*a, **k), real=real_min)
    builtins.max = functools.partial(lambda *a, real, **k: real(*a, **k), real=real_max)
    try:
        yield
    finally:
        builtins.min, builtins.max = real_min, real_max

uint8 = np.arange(256, dtype=np.uint8)
read_only_uint8, read_only_int16 = uint8.copy(), np.arange(-8, 8, dtype=np.int16)
read_only_uint8.flags.writeable = read_only_int16.flags.writeable = False
same = []
for codes, traced in [(uint8, True), (read_only_uint8, False), (read_only_int16, True)]:
    zp = codes.dtype.type(3)
    with trace() if traced else contextlib.nullcontext():
        y = qlinear.dequantize_linear(codes, np.float32(0.5), zp, backend="cpu")
    same.append(bool((y == qlinear.dequantize_linear(codes, np.float32(0.5), zp, backend="reference")).all()))
print(json.dumps({"same": same}))
"""


def test_kernels_compile_while_torch_export_rebinds_min_and_max(tmp_path):
    assert _run(_UNDER_TRACE, str(tmp_path)) == {"same": [True, True, True]}
