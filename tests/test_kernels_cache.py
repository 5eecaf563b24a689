"""The cpu kernels' disk cache works when the package directory is read-only.

numba then falls back from ``__pycache__`` beside the sources to its
user-wide cache directory (``$XDG_CACHE_HOME/numba``). The test copies the
package, makes the copy read-only and runs the cheapest kernel
specialization (DequantizeLinear uint8 -> float32, per tensor) in two fresh
processes: the first compiles (a few seconds) and writes the cache, the
second loads it. Root ignores file modes, so as root the processes run
without the capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qlinear

# Runs in the child: checks that it cannot write beside the kernel sources,
# calls the kernel, and reports where numba cached it and whether it loaded it.
_CHILD = """
import json, sys, tempfile
import numpy as np
import qlinear
from numba.core.dispatcher import Dispatcher

sources = qlinear.kernels.cpu.__path__[0]
try:
    tempfile.TemporaryFile(dir=sources).close()
    writable = True
except OSError:
    writable = False
y = qlinear.dequantize_linear(np.arange(256, dtype=np.uint8), np.float32(0.5), np.uint8(128), backend="cpu")
used = [obj.stats for name, module in list(sys.modules.items()) if name.startswith("qlinear.kernels.cpu")
        for obj in vars(module).values() if isinstance(obj, Dispatcher) and obj.stats.cache_hits + obj.stats.cache_misses]
print(json.dumps({
    "package": qlinear.__file__, "writable": writable, "y": y.tolist(),
    "cache_paths": sorted({s.cache_path for s in used}),
    "hits": sum(sum(s.cache_hits.values()) for s in used), "misses": sum(sum(s.cache_misses.values()) for s in used),
}))
"""

# Drops the two capabilities that let root write anywhere, then runs the child.
_AS_ROOT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2
for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
    if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
        sys.exit(77)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


def _set_modes(root: Path, *, writable: bool) -> None:
    extra = stat.S_IWUSR if writable else 0
    for path in [root, *root.rglob("*")]:
        base = 0o555 if path.is_dir() else 0o444
        path.chmod(base | extra)


def _run_child(site: Path, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(site), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-c", _CHILD]
    if os.geteuid() == 0:
        command = [sys.executable, "-c", _AS_ROOT, _CHILD]
    done = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=600)
    if done.returncode == 77:
        pytest.skip("running as root without CAP_SETPCAP: cannot make a directory read-only to this process")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_cache_in_user_dir_when_package_is_read_only(tmp_path):
    site, home = tmp_path / "site", tmp_path / "home"
    home.mkdir()
    package = site / "qlinear"
    shutil.copytree(Path(qlinear.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    _set_modes(site, writable=False)
    want = qlinear.dequantize_linear(np.arange(256, dtype=np.uint8), np.float32(0.5), np.uint8(128), backend="reference")
    # $XDG_CACHE_HOME/numba on Linux; under the (temporary) home elsewhere.
    user_cache = home / ".cache" / "numba" if sys.platform.startswith("linux") else home
    try:
        first = _run_child(site, home)
        second = _run_child(site, home)
    finally:
        _set_modes(site, writable=True)

    for run in (first, second):
        assert Path(run["package"]).parent == package and not run["writable"]
        assert run["y"] == want.tolist()
        assert run["cache_paths"] and all(Path(p).is_relative_to(user_cache) for p in run["cache_paths"])
    assert first["misses"] > 0 and first["hits"] == 0
    assert second["hits"] > 0 and second["misses"] == 0
    assert list(user_cache.rglob("*.nbi")) and not list(package.rglob("*.nbi"))
