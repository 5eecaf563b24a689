"""Where ONNX Runtime's CPU provider spends a run, node by node, from its own profile.

ONNX Runtime names the kernels it makes by fusing after the node they
came from: a QLinearConv fused from ``conv``'s Q/DQ group runs as
``conv_token_85``, a Conv moved to its blocked layout as ``conv_nchwc``.
Some it names by the tensor they write (a Conv in the blocked layout:
``/model.0/conv/Conv_output_0``), by the node a fusion started from
(``/model.0/act/Mul/QuickGeluFusion/``), or by the node it fused a Conv
into (a float Conv and its Relu run as ``relu``). Those suffixes taken
off, a tensor's name read as its producer's, and a reader's time given to
the Conv, Gemm or MatMul before it where that has no kernel of its own,
a kernel's time is its model node's. Kernels it adds (layout reorders,
Transposes around an NHWC region) name no node of the model: their times
are under their own names.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from qlinear.onnx._graph import readers
from qlinear.quantize._node_placement import COMPUTE_OPS
from qlinear.quantize._session import session

__all__ = ["PROFILED_RUNS", "WARM_UP_RUNS", "node_times"]

# Runs profiled a batch after two that are not counted: a few suffice, since a share, not a latency, is read.
PROFILED_RUNS = 4
WARM_UP_RUNS = 2
# The profile's durations are whole microseconds, rounded down: each kernel is counted 1 us more, so that a share
# read from them is not below the kernels' own.
_ROUNDING_S = 1e-6
_FUSED_SUFFIX = re.compile(r"(_token_\d+|_nchwc)+$")


def node_times(model: Any, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[tuple[dict[str, float], float]] | None:
    """For each batch of ``feeds``: the seconds a run of ``model`` takes in each of its nodes, and a run's seconds.

    One session for every batch, its runs in turn: :data:`PROFILED_RUNS`
    counted a batch, after two that are not. None where ONNX Runtime cannot
    load or run the model: the caller then does without a profile.
    """
    with tempfile.TemporaryDirectory(prefix="qlinear-profile-", ignore_cleanup_errors=True) as folder:
        s = None
        try:
            s = session(model, spinning=False, profile_prefix=os.path.join(folder, "run"))
            for batch in feeds:
                for _ in range(WARM_UP_RUNS + PROFILED_RUNS):
                    s.run(None, dict(batch))
            with open(s.end_profiling()) as f:
                events = json.load(f)
        except Exception:  # ONNX Runtime raises its own exception types (and QuantizationError where it cannot load)
            return None
        finally:
            del s  # the session writes nothing more into the folder once it is gone
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(runs) != len(feeds) * (WARM_UP_RUNS + PROFILED_RUNS):
        return None
    kernels = sorted((e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")),
                     key=lambda e: e["ts"])  # fmt: skip
    node_of = _node_names(model)
    out = []
    for b in range(len(feeds)):
        counted = runs[b * (WARM_UP_RUNS + PROFILED_RUNS) + WARM_UP_RUNS : (b + 1) * (WARM_UP_RUNS + PROFILED_RUNS)]
        start, end = counted[0]["ts"], counted[-1]["ts"] + counted[-1]["dur"]
        times: dict[str, float] = {}
        for e in kernels:
            if start <= e["ts"] <= end:
                node = node_of(_FUSED_SUFFIX.sub("", e["name"].removesuffix("_kernel_time")))
                times[node] = times.get(node, 0.0) + (e["dur"] * 1e-6 + _ROUNDING_S) / len(counted)
        out.append((_fused_into_readers(model, times), float(np.mean([r["dur"] for r in counted])) * 1e-6))
    return out


def _node_names(model: Any) -> Callable[[str], str]:
    """A profiled kernel's name to the name of the model node it came from (the kernel's own where none)."""
    nodes = {n.name for n in model.graph.node}
    producer = {t: n.name for n in model.graph.node for t in n.output if t}

    def node_of(kernel: str) -> str:
        if kernel in nodes:
            return kernel
        if kernel in producer:
            return producer[kernel]
        started = kernel.rstrip("/").rpartition("/")[0]  # "<node>/<Name>Fusion/"
        return started if kernel.endswith("/") and started in nodes else kernel

    return node_of


def _fused_into_readers(model: Any, times: dict[str, float]) -> dict[str, float]:
    """``times`` with a compute node that ran no kernel of its own given the time of its one reader, which took it in.

    ONNX Runtime fuses a Conv, Gemm or MatMul into the node after it (an
    activation, a residual Add) and names the kernel by that one.
    """
    reading = readers(model.graph)
    for node in model.graph.node:
        if node.op_type not in COMPUTE_OPS or node.name in times or not node.output:
            continue
        after = reading.get(node.output[0], [])
        if len(after) == 1 and after[0].name in times:
            times[node.name] = times.pop(after[0].name)
    return times
