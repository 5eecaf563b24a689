"""The calibrate pass: ONNX Runtime runs the float model batch by batch; each batch is reduced at once.

The planned activations are added to the model's outputs; every batch's
values are folded into one :class:`TensorStats` per tensor and dropped, so
memory holds one batch's tensors and the statistics, however many batches
there are.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnxruntime as ort

from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel
from qlinear.quantize._stats import TensorStats

__all__ = ["CalibrationRun", "calibrate", "peak_rss_bytes", "session"]


@dataclass
class CalibrationRun:
    """Statistics of each observed tensor and what the run cost."""

    stats: dict[str, TensorStats]
    batches: int
    samples: int
    seconds: float
    peak_rss_bytes: int


def session(
    model: onnx.ModelProto, *, threads: int = 0, optimize: bool = True, optimized_path: str | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session for ``model``."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs the tensors ``names``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return out


def calibrate(
    fm: FloatModel, tensors: list[str], data: Dataset, *, batch_size: int, progress: Callable[[int], None] | None = None
) -> CalibrationRun:
    """Statistics of ``tensors`` over ``data``, run on ONNX Runtime in batches of ``batch_size``."""
    start = time.perf_counter()
    sess = session(with_outputs(fm.model, tensors))
    stats = {t: TensorStats.empty() for t in tensors}
    batches = samples = 0
    for feeds in data.batches(batch_size):
        values = sess.run(tensors, feeds) if tensors else []
        for name, v in zip(tensors, values, strict=True):
            stats[name] = stats[name].merge(TensorStats.of(v))
        del values
        batches += 1
        samples += next(iter(feeds.values())).shape[0] if feeds else 0
        if progress:
            progress(1)
    return CalibrationRun(stats, batches, samples, time.perf_counter() - start, peak_rss_bytes())


def peak_rss_bytes() -> int:
    """This process's peak resident memory.

    Linux's ``VmHWM`` where there is one: ``ru_maxrss`` is carried across
    ``exec``, so a process started by a large one would report its parent's
    peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
