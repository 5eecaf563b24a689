"""The calibrate pass: ONNX Runtime runs the float model batch by batch; each batch is reduced at once.

The planned activations are added to the model's outputs; every batch's
values are folded into one :class:`TensorStats` per tensor and dropped, so
memory holds one batch's tensors and the statistics, however many batches
there are.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort

from qlinear._errors import QuantizationError
from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel
from qlinear.quantize._stats import TensorStats

__all__ = ["CalibrationRun", "calibrate", "peak_rss_bytes", "run_batch", "session"]


@dataclass
class CalibrationRun:
    """Statistics of each observed tensor and what the run cost."""

    stats: dict[str, TensorStats]
    batches: int
    samples: int
    seconds: float
    peak_rss_bytes: int
    means: dict[str, np.ndarray] = field(default_factory=dict)  # per-channel means (float64) of the tensors asked for
    grams: dict[str, np.ndarray] = field(default_factory=dict)  # X^T X (float64) over the last axis (GPTQ)


# Protobuf cannot serialize a message of 2 GiB or more; such models go to ONNX Runtime through a file.
_PROTOBUF_LIMIT = (2 << 30) - (64 << 20)


def session(
    model: onnx.ModelProto, *, threads: int = 0, optimize: bool = True, optimized_path: str | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session for ``model``.

    Raises:
        QuantizationError: ONNX Runtime cannot load the model (its first line of error).
    """
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    try:
        if model.ByteSize() < _PROTOBUF_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            onnx.save(model, path, save_as_external_data=True, location="model.onnx.data")
            return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # ONNX Runtime raises its own exception types; the user needs the one line
        raise QuantizationError(f"quantize: ONNX Runtime cannot load the model: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def run_batch(sess: ort.InferenceSession, names: list[str] | None, feeds: dict, what: str) -> list:
    """``sess.run``, its failure said in one line naming what was being run."""
    try:
        return sess.run(names, feeds)
    except Exception as e:  # ONNX Runtime raises its own exception types
        raise QuantizationError(f"quantize: ONNX Runtime failed on {what}: {_first_line(e)}") from None


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
    fm: FloatModel,
    tensors: list[str],
    data: Dataset,
    *,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    channel_axes: dict[str, int] | None = None,
    gram_tensors: list[str] | None = None,
) -> CalibrationRun:
    """Statistics of ``tensors`` over ``data``, run on ONNX Runtime in batches of ``batch_size``.

    ``channel_axes``: tensors whose mean along every axis but this one is
    wanted too (bias correction), kept as running sums. ``gram_tensors``:
    tensors whose ``X^T X`` over their last axis is wanted (GPTQ), summed
    batch by batch.
    """
    start = time.perf_counter()
    channel_axes = channel_axes or {}
    gram_tensors = gram_tensors or []
    names = list(dict.fromkeys([*tensors, *channel_axes, *gram_tensors]))
    grams: dict[str, np.ndarray] = {}
    sess = session(with_outputs(fm.model, names))
    stats = {t: TensorStats.empty() for t in tensors}
    sums: dict[str, np.ndarray] = {}
    counts = dict.fromkeys(channel_axes, 0)
    batches = samples = 0
    for feeds in data.batches(batch_size):
        values = run_batch(sess, names, feeds, f"calibration batch {batches}") if names else []
        for name, v in zip(names, values, strict=True):
            if name in stats:
                stats[name] = stats[name].merge(TensorStats.of(v))
            if name in channel_axes:
                moved = np.moveaxis(np.asarray(v, np.float64), channel_axes[name], -1)
                total = moved.reshape(-1, moved.shape[-1]).sum(axis=0)
                sums[name] = sums[name] + total if name in sums else total
                counts[name] += moved.size // moved.shape[-1]
            if name in gram_tensors:
                rows = np.asarray(v, np.float64).reshape(-1, np.shape(v)[-1])
                grams[name] = grams[name] + rows.T @ rows if name in grams else rows.T @ rows
        del values
        batches += 1
        samples += next(iter(feeds.values())).shape[0] if feeds else 0
        if progress:
            progress(1)
    means = {t: sums[t] / counts[t] for t in sums if counts[t]}
    return CalibrationRun(stats, batches, samples, time.perf_counter() - start, peak_rss_bytes(), means, grams)


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
