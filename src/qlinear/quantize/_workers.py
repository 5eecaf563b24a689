"""Calibration batches run in several processes: each its own session of the target's runtime, the reductions merged in batch order.

The driver reads the batches and hands batch ``k`` to worker ``k % N``
through a bounded queue (at most two batches waiting a worker, so memory
stays a few batches whatever the data). A worker runs the model, reduces
the batch as the one-process run would (:meth:`Observed.reduce`: a
histogram, channel sums, a Gram matrix; never the activations) and sends
that back; the driver adds the reductions in batch order, so the
statistics, and the model, are those of one process bit for bit. Workers
are started with ``spawn`` (a fork would copy ONNX Runtime's and numba's
threads mid-state) and load the model from a file written once, so a
model over 2 GB goes through its external data, never through a pipe.
Each session gets ``cores // N`` intra-op threads (at least one).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numba
import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import save
from qlinear.quantize._data import samples_in
from qlinear.quantize._observed import Observed
from qlinear.quantize._session import run_batch
from qlinear.quantize.targets import target

__all__ = ["InProcesses"]

_DONE = None
_WAIT_SECONDS = 600  # a batch that takes longer than this means a worker died


@dataclass(frozen=True)
class InProcesses:
    """The batches run by ``workers`` processes (an :class:`~qlinear.quantize._calibration_executors.Executor`)."""

    workers: int
    runtime: str  # the target's name: each worker opens its own session of it

    def run(self, model: onnx.ModelProto, observed: Observed, batches: Iterable[dict]) -> Iterator[tuple[dict[str, Any], int]]:
        """``(reduction, samples)`` of each batch, in batch order, computed by ``workers`` processes."""
        folder = tempfile.mkdtemp(prefix="qlinear-calibration-")
        path = os.path.join(folder, "model.onnx")
        try:
            save(model, path)  # weights in an external file: a model past 2 GB, or one with markers, is written whole
            del model
            ctx = mp.get_context("spawn")
            threads = max(1, (os.cpu_count() or 1) // self.workers)
            inboxes = [ctx.Queue(maxsize=2) for _ in range(self.workers)]
            outbox = ctx.Queue()
            procs = [
                ctx.Process(target=_work, args=(path, self.runtime, observed, threads, inboxes[w], outbox), daemon=True)
                for w in range(self.workers)
            ]
            for p in procs:
                p.start()
            finished = False
            try:
                yield from _drive(batches, inboxes, outbox, procs)
                finished = True
            finally:
                _stop(procs, inboxes, finished)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _stop(procs: list, inboxes: list, finished: bool) -> None:
    """End the workers: told they are done after the last batch; killed at once when the run stopped (Ctrl-C, an error).

    A stopped run's workers may hold batches, their inboxes full: waiting
    for them would keep the user waiting, so they are killed, and every
    one is reaped before the run's error goes on.
    """
    if finished:
        for box in inboxes:
            try:
                box.put(_DONE, timeout=5)
            except queue.Full:
                pass
        for p in procs:
            p.join(timeout=5)
    else:  # a batch half written into a worker's pipe would hold this process at exit, waiting for its reader
        for box in inboxes:
            box.cancel_join_thread()
            box.close()
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def _drive(batches, inboxes, outbox, procs) -> Iterator[tuple[dict[str, Any], int]]:
    """Hand out batches round robin and give back their reductions in order."""
    pending: dict[int, tuple[dict[str, Any], int]] = {}
    sent = done = 0
    stream = iter(batches)
    exhausted = False
    while not exhausted or done < sent:
        # Keep every worker's inbox full while there are batches.
        while not exhausted:
            box = inboxes[sent % len(inboxes)]
            if box.full():
                break
            feeds = next(stream, None)
            if feeds is None:
                exhausted = True
                break
            box.put((sent, feeds))
            sent += 1
        if done < sent:
            try:
                k, result = outbox.get(timeout=_WAIT_SECONDS)
            except queue.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive()]
                raise QuantizationError(f"quantize: a calibration worker stopped (exit codes {dead})") from None
            if isinstance(result, QuantizationError):
                raise result
            pending[k] = result
            while done in pending:
                yield pending.pop(done)
                done += 1


def _work(path: str, runtime: str, observed: Observed, threads: int, inbox, outbox) -> None:
    """A worker: run each batch it is given on ``runtime`` (a target's name) and send back its reduction (or the error, once)."""
    try:
        sess = target(runtime).session(None, threads=threads, path=path, arena=False, spinning=False)
    except QuantizationError as e:
        outbox.put((-1, e))
        return
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # its reductions: this worker's share of cores
    names = observed.names
    while True:
        item = inbox.get()
        if item is _DONE:
            return
        k, feeds = item
        try:
            values = run_batch(sess, names, feeds, f"calibration batch {k}")
            samples = samples_in(feeds)
            outbox.put((k, (observed.reduce(values), samples)))
        except QuantizationError as e:
            outbox.put((k, e))
            return
