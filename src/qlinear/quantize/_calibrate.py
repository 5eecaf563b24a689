"""The calibrate pass: ONNX Runtime runs the float model batch by batch; each batch is reduced at once.

The planned activations are added to the model's outputs; every batch's
values are folded into one :class:`TensorStats` per tensor and dropped, so
memory holds one batch's tensors and the statistics, however many batches
there are.
"""

from __future__ import annotations

import os
import re
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.quantize._data import Dataset, samples_in
from qlinear.quantize._model import FloatModel
from qlinear.quantize._stats import TensorStats, load_calibration, save_stats

__all__ = [
    "MATMUL_NBITS_ACCURACY_LEVEL",
    "CalibrationRun",
    "CalibrationState",
    "Observed",
    "calibrate",
    "peak_rss_bytes",
    "run_batch",
    "session",
]


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
    batch_size: int = 0  # the samples a batch it ran (the one asked for, or fewer: HELD_BYTES)


# How often a calibration writes its statistics so far (state_path), in seconds.
SAVE_EVERY_SECONDS = 5.0
# ONNX Runtime returns a batch's observed tensors together: batches of arrays are cut so that these take at most
# this many bytes (about twice that at the peak, with the reductions' temporaries). A detector on large images
# observes gigabytes a batch of 16: YOLOv8n at 640 x 640 peaked at 5.5 GiB.
HELD_BYTES = 128 * 2**20
# ONNX Runtime's session setting for the precision of the MatMulNBits it fuses from blocked DequantizeLinear + MatMul.
MATMUL_NBITS_ACCURACY_LEVEL = "session.qdq_matmulnbits_accuracy_level"


def session(
    model: onnx.ModelProto | None,
    *,
    threads: int = 0,
    optimize: bool = True,
    optimized_path: str | None = None,
    path: str | None = None,
    basic: bool = False,
    arena: bool = True,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session for ``model``, or for the model file at ``path`` (its external data beside it).

    ``basic``: only ONNX Runtime's basic graph optimizations (constant
    folding, redundant node removal, fusions such as MatMul + Add -> Gemm).
    ``arena``: ONNX Runtime's memory arena, which keeps what its largest
    run took for the session's life. Off for sessions that return many
    tensors (calibration, the per-node comparisons): each would keep a
    batch's worth of them (the orientation classifier's whole run: 1.64 ->
    1.23 GiB at the peak, in the same time).

    Raises:
        QuantizationError: ONNX Runtime cannot load the model (its first line of error).
    """
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    levels = ort.GraphOptimizationLevel
    so.graph_optimization_level = (
        (levels.ORT_ENABLE_BASIC if basic else levels.ORT_ENABLE_ALL) if optimize else levels.ORT_DISABLE_ALL
    )
    # ONNX Runtime fuses a 2/4/8-bit blocked DequantizeLinear into its MatMul (MatMulNBits) and, by default
    # (level 4), quantizes that MatMul's float input to int8 in blocks: not what the QDQ model says, and on
    # small layers slower (the character transformer's int4 MatMuls, batch 16: 1.78 ms at level 4, 1.15 ms
    # at 0, float 1.0). Level 0 keeps the input float, so the figures qlinear reports are the model's own.
    so.add_session_config_entry(MATMUL_NBITS_ACCURACY_LEVEL, "0")
    so.enable_cpu_mem_arena = arena
    if optimized_path:
        so.optimized_model_filepath = optimized_path
        # Its weights in a file beside it: an optimized model past 2 GB cannot be one protobuf file.
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
    try:
        if path is not None:
            return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return large.session(model, so, ["CPUExecutionProvider"])
    except Exception as e:  # ONNX Runtime raises its own exception types; the user needs the one line
        raise QuantizationError(f"quantize: ONNX Runtime cannot load the model: {_first_line(e)}{_hint(e)}") from None


def optimized_graph(model: onnx.ModelProto, *, basic: bool = False) -> onnx.ModelProto | None:
    """The graph ONNX Runtime makes of ``model`` (its weights left out), or None where it cannot load the model.

    ``basic``: after its basic optimizations only (see :func:`session`).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        try:
            session(model, optimized_path=path, basic=basic)
        except QuantizationError:  # no kernels for its types, or a model it refuses: the caller goes on without
            return None
        return onnx.load(path, load_external_data=False)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _hint(e: Exception) -> str:
    """What to do about a load error the user can fix in one line."""
    newest = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", str(e))
    if newest:  # onnx.helper.make_model stamps the onnx package's newest IR version, which ONNX Runtime may not read yet
        return (
            f"; set model.ir_version = {newest.group(2)} (or lower, down to what its opsets need) before saving it: "
            f"IR version {newest.group(1)} is newer than this ONNX Runtime {ort.__version__} reads"
        )
    return ""


def held_batch_size(sess: ort.InferenceSession, names: list[str], data: Dataset, batch_size: int) -> int:
    """The batch size, at most ``batch_size``, whose tensors ``names`` take at most :data:`HELD_BYTES`.

    Their size a sample is read from one run on the data's first sample. A
    stream of batches is walked as it comes, whatever its size.
    """
    if data.arrays is None or batch_size <= 1:
        return batch_size
    first = next(data.batches(1), None)
    if first is None:
        return batch_size
    per_sample = sum(np.asarray(v).nbytes for v in run_batch(sess, names, first, "the first calibration sample"))
    return max(1, min(batch_size, HELD_BYTES // max(per_sample, 1)))


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


@dataclass(frozen=True)
class Observed:
    """What calibration keeps of each tensor: which statistics, and where a tensor's channels lie.

    ``tensors``: histogram statistics; ``channel_axes``: per-channel sums
    (bias correction's means); ``gram_tensors``: ``X^T X`` over the last
    axis (GPTQ).
    """

    tensors: tuple[str, ...]
    channel_axes: dict[str, int] = field(default_factory=dict)
    gram_tensors: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.tensors, *self.channel_axes, *self.gram_tensors]))

    def reduce(self, values: list[np.ndarray]) -> dict[str, Any]:
        """One batch's values reduced to what is kept: small, and the same in whichever process it is computed."""
        out: dict[str, Any] = {}
        for name, v in zip(self.names, values, strict=True):
            if name in self.tensors:
                out[f"stats/{name}"] = TensorStats.of(v)
            if name in self.channel_axes:
                moved = np.moveaxis(np.asarray(v, np.float64), self.channel_axes[name], -1)
                out[f"sum/{name}"] = moved.reshape(-1, moved.shape[-1]).sum(axis=0)
                out[f"count/{name}"] = moved.size // moved.shape[-1]
            if name in self.gram_tensors:
                rows = np.asarray(v, np.float64).reshape(-1, np.shape(v)[-1])
                out[f"gram/{name}"] = rows.T @ rows
        return out


@dataclass
class CalibrationState:
    """The statistics so far; batches are added in their order, so the result does not depend on who computed them."""

    observed: Observed
    stats: dict[str, TensorStats] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    grams: dict[str, np.ndarray] = field(default_factory=dict)
    batches: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        for t in self.observed.tensors:
            self.stats.setdefault(t, TensorStats.empty())

    def add(self, reduced: dict[str, Any], samples: int) -> None:
        for key, value in reduced.items():
            kind, name = key.split("/", 1)
            if kind == "stats":
                self.stats[name] = self.stats[name].merge(value)
            elif kind == "sum":
                self.sums[name] = self.sums[name] + value if name in self.sums else value
            elif kind == "count":
                self.counts[name] = self.counts.get(name, 0) + value
            else:
                self.grams[name] = self.grams[name] + value if name in self.grams else value
        self.batches += 1
        self.samples += samples

    def extras(self) -> dict[str, np.ndarray]:
        """The sums, counts and Gram matrices as named arrays (for a file a later run continues from)."""
        out = {f"sum/{k}": v for k, v in self.sums.items()}
        out.update({f"count/{k}": np.array(v, np.int64) for k, v in self.counts.items()})
        out.update({f"gram/{k}": v for k, v in self.grams.items()})
        out["samples"] = np.array(self.samples, np.int64)
        return out

    @classmethod
    def resumed(cls, observed: Observed, stats: dict[str, TensorStats], extras: dict[str, np.ndarray], batches: int):
        state = cls(observed, {t: stats[t] for t in observed.tensors}, batches=batches, samples=int(extras.get("samples", 0)))
        for key, value in extras.items():
            kind, _, name = key.partition("/")
            if kind == "sum":
                state.sums[name] = np.asarray(value, np.float64)
            elif kind == "count":
                state.counts[name] = int(value)
            elif kind == "gram":
                state.grams[name] = np.asarray(value, np.float64)
        return state


def calibrate(
    fm: FloatModel,
    tensors: list[str],
    data: Dataset,
    *,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    channel_axes: dict[str, int] | None = None,
    gram_tensors: list[str] | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    state_path: str | None = None,
    resume: str | None = None,
    fixed_batch: bool = False,
) -> CalibrationRun:
    """Statistics of ``tensors`` over ``data``, run on ONNX Runtime in batches of ``batch_size`` or fewer.

    Batches of arrays are cut to fewer samples where the observed tensors
    of ``batch_size`` samples would take more than :data:`HELD_BYTES`
    (:func:`held_batch_size`), unless ``fixed_batch`` (the model runs at
    no other size). The statistics do not depend on the cut: histograms of
    power-of-two bins merge exactly.

    ``progress`` is called with each batch's samples. ``channel_axes``:
    tensors whose mean along every axis but this one is
    wanted too (bias correction), kept as running sums. ``gram_tensors``:
    tensors whose ``X^T X`` over their last axis is wanted (GPTQ), summed
    batch by batch. ``workers``: processes that run the batches (each its
    own ONNX Runtime session with its share of the cores); each batch is
    reduced where it ran and added in batch order, so the result is the
    one-process result bit for bit. ``ray_address``: run the batches as
    tasks on a Ray cluster instead (``"auto"``, ``"local"`` or an address;
    :mod:`._ray`), with the same result. ``state_path``: the statistics are
    written there as batches complete (at most every
    :data:`SAVE_EVERY_SECONDS`, and at the end; ``--save-stats``); ``resume``: a file
    so written, whose batches are skipped and counted as they were.
    """
    start = time.perf_counter()
    observed = Observed(tuple(tensors), dict(channel_axes or {}), tuple(gram_tensors or []))
    names = observed.names
    model = with_outputs(fm.model, names)
    sess = session(model, arena=False) if names else None
    if sess is not None and not fixed_batch:
        batch_size = held_batch_size(sess, names, data, batch_size)
    if resume is not None:
        stats, extras, done = load_calibration(resume, model_digest=fm.digest)
        if done is None:
            raise QuantizationError(f"quantize: {resume} holds finished statistics, not a calibration to continue; use stats=")
        missing = [t for t in observed.tensors if t not in stats]
        if missing:
            raise QuantizationError(f"quantize: {resume} holds no statistics for {missing[:3]}; calibrate again")
        state = CalibrationState.resumed(observed, stats, extras, done)
    else:
        state = CalibrationState(observed)
    skip = state.batches

    last_save = [time.perf_counter()]

    def save(final: bool = False) -> None:
        # At most every SAVE_EVERY_SECONDS, and at the end: a Gram matrix can be tens of megabytes.
        if state_path is not None and (final or time.perf_counter() - last_save[0] >= SAVE_EVERY_SECONDS):
            save_stats(state.stats, state_path, model_digest=fm.digest, extras=state.extras(), batches=state.batches)
            last_save[0] = time.perf_counter()

    batches = (b for k, b in enumerate(data.batches(batch_size)) if k >= skip)
    if (workers > 1 or ray_address is not None) and names:
        sess = None  # it only measured the first sample: each worker holds a session of its own
        if ray_address is not None:
            from qlinear.quantize._ray import run_on_ray

            results = run_on_ray(model, observed, batches, ray_address)
        else:
            from qlinear.quantize._workers import run_in_processes

            results = run_in_processes(model, observed, batches, workers)
        for reduced, n in results:
            state.add(reduced, n)
            save()
            if progress:
                progress(n)
    else:
        for feeds in batches:
            values = run_batch(sess, names, feeds, f"calibration batch {state.batches}") if names else []
            n = samples_in(feeds)
            state.add(observed.reduce(values), n)
            del values
            save()
            if progress:
                progress(n)
    save(final=True)
    means = {t: state.sums[t] / state.counts[t] for t in state.sums if state.counts.get(t)}
    return CalibrationRun(
        state.stats,
        state.batches,
        state.samples,
        time.perf_counter() - start,
        peak_rss_bytes(),
        means,
        state.grams,
        batch_size,
    )


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
