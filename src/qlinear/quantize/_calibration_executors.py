"""Where calibration batches run: here, in worker processes (:mod:`._workers`) or on a Ray cluster (:mod:`._ray`).

Each executor gives back every batch's reduction (:meth:`Observed.reduce`)
and samples, in batch order; the caller merges them into one
:class:`CalibrationState`, so the statistics are the same whichever ran them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import onnx

from qlinear.quantize._data import samples_in
from qlinear.quantize._observed import Observed
from qlinear.quantize._ray import OnRay
from qlinear.quantize._session import run_batch
from qlinear.quantize._workers import InProcesses

__all__ = ["Executor", "Here", "executor"]


class Executor(Protocol):
    """Runs calibration batches of a model and reduces each."""

    def run(self, model: onnx.ModelProto, observed: Observed, batches: Iterable[dict]) -> Iterator[tuple[dict[str, Any], int]]:
        """``(reduction, samples)`` of each batch of ``model`` (which outputs ``observed.names``), in batch order."""
        ...


@dataclass(frozen=True)
class Here:
    """The batches run in this process on ``session`` (None: nothing is observed, each batch only counted).

    ``first``: the first batch's number (a continued calibration's), for the messages.
    """

    session: Any  # the target's session (Target.session), or None
    first: int = 0

    def run(self, model: onnx.ModelProto, observed: Observed, batches: Iterable[dict]) -> Iterator[tuple[dict[str, Any], int]]:
        names = observed.names
        for k, feeds in enumerate(batches, start=self.first):
            values = run_batch(self.session, names, feeds, f"calibration batch {k}") if names else []
            n = samples_in(feeds)
            reduced = observed.reduce(values)
            del values  # one batch's tensors at a time: dropped before the caller saves or reports
            yield reduced, n


def executor(session: Any, *, workers: int, ray_address: str | None, first: int, runtime: str) -> Executor:
    """A Ray cluster at ``ray_address`` if given, else ``workers`` processes if more than one, else :class:`Here`.

    ``session``: the model's session in this process (None: nothing is
    observed, and every batch is only counted here); ``runtime``: the
    target's name, whose sessions the other processes open.
    """
    if session is None:
        return Here(None, first)
    if ray_address is not None:
        return OnRay(ray_address, runtime)
    if workers > 1:
        return InProcesses(workers, runtime)
    return Here(session, first)
