"""Where ONNX Runtime's CPU provider spends a run, node by node, from its own profile.

ONNX Runtime names the kernels it makes by fusing after the node they
came from: a QLinearConv fused from ``conv``'s Q/DQ group runs as
``conv_token_85``, a Conv moved to its blocked layout as ``conv_nchwc``.
Those suffixes taken off, a kernel's time is its model node's. Kernels
it adds (layout reorders, Transposes around an NHWC region) name no node
of the model: their time is the run's, not a node's.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from qlinear.quantize._session import session

__all__ = ["PROFILED_RUNS", "node_times"]

# Runs profiled after the warm-up: a few suffice, since a share, not a latency, is read from them.
PROFILED_RUNS = 4
_FUSED_SUFFIX = re.compile(r"(_token_\d+|_nchwc)+$")


def node_times(model: Any, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, float], float] | None:
    """Seconds a run each node of ``model`` takes on ONNX Runtime's CPU provider, and a run's seconds.

    The mean over :data:`PROFILED_RUNS` runs after two that are not
    counted. None where ONNX Runtime cannot load or run the model: the
    caller then does without a profile.
    """
    with tempfile.TemporaryDirectory(prefix="qlinear-profile-") as folder:
        try:
            s = session(model, spinning=False, profile_prefix=os.path.join(folder, "run"))
            for _ in range(2):  # the first runs at a shape plan its memory: not what a run costs
                s.run(None, dict(feeds))
            started = _now_us(s)
            for _ in range(PROFILED_RUNS):
                s.run(None, dict(feeds))
            with open(s.end_profiling()) as f:
                events = json.load(f)
        except Exception:  # ONNX Runtime raises its own exception types (and QuantizationError where it cannot load)
            return None
    measured = [e for e in events if e.get("ts", 0) >= started]
    runs = [e["dur"] for e in measured if e.get("name") == "model_run"]
    if not runs:
        return None
    times: dict[str, float] = {}
    for e in measured:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            node = _FUSED_SUFFIX.sub("", e["name"].removesuffix("_kernel_time"))
            times[node] = times.get(node, 0.0) + e["dur"] * 1e-6 / len(runs)
    return times, float(np.mean(runs)) * 1e-6


def _now_us(s: Any) -> int:
    """The session's profiling clock now: microseconds since its profiling started, as its events' ``ts`` count."""
    return (time.time_ns() - s.get_profiling_start_time_ns()) // 1000
