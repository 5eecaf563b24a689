"""Calibration on a Ray cluster: shards of batches as Ray tasks, their reductions merged on the driver in batch order.

What moves over the network: the model once (through Ray's object store,
or as a path every node can read for models over 1 GB), each shard's input
batches (object refs), and each batch's reduction back (histograms, channel
sums, Gram matrices: :meth:`Observed.reduce`). Activations never leave the
worker that computes them. Each task holds one CPU and runs ONNX Runtime on
one thread; a worker process keeps its session between tasks. The driver
adds the reductions in batch order, so the model is the one-process model
bit for bit. Ray is an optional extra (``pip install 'qlinear[ray]'``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import save
from qlinear.quantize._data import samples_in
from qlinear.quantize._observed import Observed
from qlinear.quantize._session import run_batch
from qlinear.quantize.targets import target

__all__ = ["SHARD_BATCHES", "OnRay"]

SHARD_BATCHES = 4  # batches a task: enough to pay a task's overhead, few enough to spread a small calibration
_INLINE_LIMIT = 1 << 30  # models up to this size travel through the object store; larger ones by path
_sessions: dict[str, Any] = {}  # a worker process's sessions, by model key


@dataclass(frozen=True)
class OnRay:
    """The batches run as Ray tasks (an :class:`~qlinear.quantize._calibration_executors.Executor`).

    ``address``: ``"auto"`` (the running cluster, or this process's Ray if
    it started one), ``"local"`` (start Ray on this machine) or a cluster
    address. ``model_dir``: where to write a model over 1 GB for the
    workers, a folder every node reads (default: a temporary folder, which
    serves one machine only).
    """

    address: str
    runtime: str  # the target's name: each worker process opens its own session of it
    model_dir: str | None = None

    def run(self, model: onnx.ModelProto, observed: Observed, batches: Iterable[dict]) -> Iterator[tuple[dict[str, Any], int]]:
        """``(reduction, samples)`` of each batch, in batch order, computed by Ray tasks."""
        try:
            import ray
        except ImportError:
            raise QuantizationError("quantize: --ray needs Ray: pip install 'qlinear[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=None if self.address == "local" else self.address, include_dashboard=False, log_to_driver=False)
            except Exception as e:  # Ray raises many types; the user needs the one line
                raise QuantizationError(
                    f"quantize: cannot reach the Ray cluster at {self.address!r}: {str(e).splitlines()[0]}"
                ) from None
        folder = None
        if large.byte_size(model) < _INLINE_LIMIT:
            source: Any = ray.put(large.inline(model).SerializeToString())
        else:
            folder = tempfile.mkdtemp(prefix="qlinear-ray-", dir=self.model_dir)
            source = os.path.join(folder, "model.onnx")
            save(model, source)
        key = f"{os.getpid()}-{id(model)}"
        task = ray.remote(num_cpus=1)(_shard)
        window = max(2, int(ray.available_resources().get("CPU", 1)) * 2)
        in_flight: deque = deque()
        try:
            shard: list[dict] = []
            for feeds in batches:
                shard.append(feeds)
                if len(shard) == SHARD_BATCHES:
                    in_flight.append(task.remote(key, self.runtime, source, observed, ray.put(shard)))
                    shard = []
                    if len(in_flight) >= window:
                        yield from _results(ray, in_flight[0])
                        in_flight.popleft()  # only once its results are in: a run stopped while waiting cancels it
            if shard:
                in_flight.append(task.remote(key, self.runtime, source, observed, ray.put(shard)))
            while in_flight:
                yield from _results(ray, in_flight[0])
                in_flight.popleft()
        finally:
            for ref in in_flight:  # a stopped run (Ctrl-C, an error): its tasks end with it
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # a task already finished, or the cluster gone: nothing is left to end
                    pass
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _results(ray, ref) -> list[tuple[dict[str, Any], int]]:
    try:
        results = ray.get(ref)
    except Exception as e:  # a task's QuantizationError comes back wrapped by Ray
        cause = getattr(e, "cause", None)
        if isinstance(cause, QuantizationError):
            raise cause from None
        raise QuantizationError(f"quantize: a Ray calibration task failed: {str(e).strip().splitlines()[-1]}") from None
    return results


def _shard(key: str, runtime: str, source: Any, observed: Observed, shard: list[dict]) -> list[tuple[dict[str, Any], int]]:
    """A Ray task: each batch of the shard run on ``runtime`` (a target's name) and reduced."""
    if key not in _sessions:
        opened = target(runtime).session
        if isinstance(source, str):
            _sessions[key] = opened(None, threads=1, path=source, arena=False)
        else:
            _sessions[key] = opened(onnx.load_from_string(source), threads=1, arena=False)
    sess = _sessions[key]
    out = []
    for feeds in shard:
        values = run_batch(sess, observed.names, feeds, "a calibration batch on Ray")
        out.append((observed.reduce(values), samples_in(feeds)))
    return out
