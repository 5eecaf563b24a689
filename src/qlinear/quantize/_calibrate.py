"""The calibrate pass: ONNX Runtime runs the float model batch by batch; each batch is reduced at once.

The planned activations are added to the model's outputs; every batch's
values are folded into one :class:`TensorStats` per tensor and dropped, so
memory holds one batch's tensors and the statistics, however many batches
there are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.quantize._calibration_executors import executor
from qlinear.quantize._data import Dataset
from qlinear.quantize._memory import Peak
from qlinear.quantize._model import FloatModel
from qlinear.quantize._observed import CalibrationState, Observed
from qlinear.quantize._patches import Patches
from qlinear.quantize._session import only_outputs, run_batch
from qlinear.quantize._stats import TensorStats, load_calibration, save_stats

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = ["CalibrationRun", "calibrate"]


@dataclass
class CalibrationRun:
    """Statistics of each observed tensor and what the run cost."""

    stats: dict[str, TensorStats]
    batches: int
    samples: int
    seconds: float
    peak_rss_bytes: int
    means: dict[str, np.ndarray] = field(default_factory=dict)  # per-channel means (float64) of the tensors asked for
    # X^T X (float64) over the last axis, or of a Conv's input patches under Patches.key (GPTQ)
    grams: dict[str, np.ndarray] = field(default_factory=dict)
    batch_size: int = 0  # the samples a batch it ran (the one asked for, or fewer: HELD_BYTES)
    gram_rows: dict[str, int] = field(default_factory=dict)  # the rows each Gram matrix sums (saved before: absent)


# How often a calibration writes its statistics so far (state_path), in seconds.
SAVE_EVERY_SECONDS = 5.0
# ONNX Runtime returns a batch's observed tensors together: batches of arrays are cut so that these take at most
# this many bytes (about twice that at the peak, with the reductions' temporaries). A detector on large images
# observes gigabytes a batch of 16: YOLOv8n at 640 x 640 peaked at 5.5 GiB.
HELD_BYTES = 128 * 2**20


def held_batch_size(sess: Any, names: list[str], data: Dataset, batch_size: int) -> int:
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


def calibrate(
    fm: FloatModel,
    tensors: list[str],
    data: Dataset,
    *,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    channel_axes: dict[str, int] | None = None,
    gram_tensors: list[str] | None = None,
    gram_patches: list[Patches] | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    state_path: str | None = None,
    resume: str | None = None,
    fixed_batch: bool = False,
    runtime: Target,
) -> CalibrationRun:
    """Statistics of ``tensors`` over ``data``, run on ``runtime`` (the target's) in batches of ``batch_size`` or fewer.

    Batches of arrays are cut to fewer samples where the observed tensors
    of ``batch_size`` samples would take more than :data:`HELD_BYTES`
    (:func:`held_batch_size`), unless ``fixed_batch`` (the model runs at
    no other size). The statistics do not depend on the cut: histograms of
    power-of-two bins merge exactly.

    ``progress`` is called with each batch's samples. ``channel_axes``:
    tensors whose mean along every axis but this one is
    wanted too (bias correction), kept as running sums. ``gram_tensors``:
    tensors whose ``X^T X`` over their last axis is wanted (GPTQ), summed
    batch by batch; ``gram_patches``: the same of Convs' input patches. ``workers``: processes that run the batches (each its
    own session of the runtime with its share of the cores); each batch is
    reduced where it ran and added in batch order, so the result is the
    one-process result bit for bit. ``ray_address``: run the batches as
    tasks on a Ray cluster instead (``"auto"``, ``"local"`` or an address;
    :mod:`._ray`), with the same result. ``state_path``: the statistics are
    written there as batches complete (at most every
    :data:`SAVE_EVERY_SECONDS`, and at the end; ``--save-stats``); ``resume``: a file
    so written, whose batches are skipped and counted as they were.
    """
    with Peak() as peak:  # the calibration's own peak, the process's left alone
        start = time.perf_counter()
        observed = Observed(tuple(tensors), dict(channel_axes or {}), tuple(gram_tensors or []), tuple(gram_patches or []))
        names = observed.names
        model = only_outputs(fm.model, names)  # no node past the last tensor observed runs (a float tail, post-processing)
        sess = runtime.session(model, arena=False, spinning=False) if names else None
        if sess is not None and not fixed_batch:
            batch_size = held_batch_size(sess, names, data, batch_size)
        if resume is not None:
            stats, extras, done = load_calibration(resume, model_digest=fm.digest, what="resume")
            if done is None:
                raise QuantizationError(
                    f"quantize: {resume} holds finished statistics, not a calibration to continue; use stats="
                )
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
        runner = executor(sess, workers=workers, ray_address=ray_address, first=skip, runtime=runtime.name)
        del sess  # on workers or Ray it only measured the first sample: each worker holds a session of its own
        for reduced, n in runner.run(model, observed, batches):
            state.add(reduced, n)
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
        peak.bytes,
        means,
        state.grams,
        batch_size,
        state.gram_rows,
    )
