"""The quantized model's speed against the float model's, at the batches its users run.

People quantize to make a model faster, at the batch they run it at: the
one the model's inputs fix; otherwise one sample (a stream, a request)
and the calibration batch (a batch job), which can differ by 1.5x in the
ratio (a small CNN's Q/DQ boundaries cost little beside a batch of 16's
convolutions, much beside one sample's). Times are taken on the target's
runtime in alternating pairs with the float model on the same cores, and
the ratio is the median of the pairs' ratios, so a burst of other work
slows both sides of the pairs it falls in.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx._parts import WHOLE_BYTES, runs_in_parts
from qlinear.quantize._data import Dataset, _take, samples_in
from qlinear.quantize._session import run_batch

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = [
    "QUICK_PAIRS",
    "UNTIMED_IN_PARTS",
    "Latency",
    "PairTimer",
    "UserBatchTimer",
    "batch_feeds",
    "mean_ratio",
    "user_batches",
    "worst_ratio",
]

# Each side's runs a timing takes at most, and about how long it may take (seconds, both sides together).
_MOST_PAIRS = 25
_FEWEST_PAIRS = 5
_SECONDS = 1.0
# Pairs a batch of a timing that may be given up on (UserBatchTimer.time's give_up_above): the first look.
QUICK_PAIRS = 3
# Why a model run in parts is not timed.
UNTIMED_IN_PARTS = f"it runs in parts, a session a part, as a model of {WHOLE_BYTES >> 30} GiB or more and those made from it do"


@dataclass(frozen=True)
class Latency:
    """One batch's median times (ms) on the runtime, float and quantized, and the median of the pairs' ratios."""

    batch: int
    before: float  # the float model's ms a batch
    after: float  # the quantized model's
    ratio: float


def user_batches(fixed_batch: int | None, batch_size: int) -> tuple[int, ...]:
    """The batches the model's users run: the one its inputs fix, else 1 and the calibration batch."""
    if fixed_batch:
        return (fixed_batch,)
    return tuple(dict.fromkeys((1, batch_size)))


def batch_feeds(data: Dataset, batch: int) -> dict[str, np.ndarray]:
    """The first ``batch`` samples of ``data`` as feeds (fewer where it holds fewer; a stream's first batch cut down)."""
    first = next(iter(data.batches(batch)), None)
    if first is None:
        raise QuantizationError("quantize: the eval data holds no batch to time the models on")
    if samples_in(first) <= batch:
        return dict(first)
    return {name: _take(np.asarray(a), data.axes.get(name, 0), slice(0, batch)) for name, a in first.items()}


class PairTimer:
    """Times models against one float model at one batch on ``runtime``, in alternating pairs; the float session is made once."""

    def __init__(self, float_model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], runtime: Target) -> None:
        self.feeds = dict(feeds)
        self.batch = samples_in(feeds)
        self.runtime = runtime
        # Neither side's idle threads spin: they would take the cores from the other side's turn.
        self._float = runtime.session(float_model, spinning=False)
        start = time.perf_counter()
        self._float.run(None, self.feeds)  # warm-up: the first run allocates and picks kernels
        self._float.run(None, self.feeds)
        once = (time.perf_counter() - start) / 2
        self.pairs = int(min(_MOST_PAIRS, max(_FEWEST_PAIRS, _SECONDS / max(2 * once, 1e-6))))

    def time(self, model: onnx.ModelProto, session: Any = None, pairs: int | None = None) -> Latency | None:
        """``model``'s latency beside the float model's; None where the runtime cannot load it.

        A model it loads but cannot run raises QuantizationError: the
        search, the trials and the model written all stop there, as the
        model could not be run by its users either.

        ``session``: the runtime's session of ``model`` where the caller made
        one (one serves every batch); ``pairs``: this many pairs instead of
        the timer's own count.
        """
        candidate = session
        if candidate is None:
            try:
                candidate = self.runtime.session(model, spinning=False)
            except QuantizationError:  # no kernels for its types on this runtime: no latency to give
                return None
        # Warm-up at this batch (the first run at a shape plans its memory), and the run that finds a model the runtime
        # loads but cannot run (a kernel refusing its parameters): one line, not the runtime's exception.
        run_batch(candidate, None, self.feeds, f"a model timed at a batch of {self.batch}", self.runtime.runtime)
        before, after = [], []
        for _ in range(pairs or self.pairs):
            for times, s in ((before, self._float), (after, candidate)):
                start = time.perf_counter()
                s.run(None, self.feeds)
                times.append(time.perf_counter() - start)
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        return Latency(self.batch, 1e3 * statistics.median(before), 1e3 * statistics.median(after), ratio)


class UserBatchTimer:
    """Times models against the float model at each batch its users run (one :class:`PairTimer` a batch).

    A kind of node can be faster in float at one batch and not at another
    (ONNX Runtime's int8 5x5 depthwise convolution: on par at one sample,
    several times its float kernel's time at 16), so what the quantizer
    decides on speed it decides on every batch the users run.

    A model is loaded once for all its batches (a session costs as much as
    a few of its runs), and each model's latest timing is kept: the stages
    that show a model already timed (the trade-off's row of the model
    written, the evaluation's latency) read it instead of timing it again;
    a caller that wants a second opinion (a decision confirmed) asks
    ``again``.

    A model that runs in parts (:func:`qlinear.onnx._parts.runs_in_parts`)
    makes a session a part and a run (so its memory follows a
    part, not the model), which times the sessions, not the model: it is
    not timed (``untimed`` says why).
    """

    def __init__(self, float_model: onnx.ModelProto, data: Dataset, batches: tuple[int, ...], runtime: Target) -> None:
        self.untimed = UNTIMED_IN_PARTS if runs_in_parts(float_model) else None
        self._timers = [] if self.untimed else [PairTimer(float_model, batch_feeds(data, b), runtime) for b in batches]
        self._runtime = runtime
        self._timed: dict[bytes, tuple[Latency, ...] | None] = {}  # by the model's digest: its latest timing

    @property
    def feeds(self) -> list[dict[str, np.ndarray]]:
        """The feeds of each batch timed, in order."""
        return [timer.feeds for timer in self._timers]

    def time(
        self, model: onnx.ModelProto, *, again: bool = False, give_up_above: float | None = None, glance: bool = False
    ) -> tuple[Latency, ...] | None:
        """``model``'s latency beside the float model's at each batch; None where the runtime cannot load it.

        ``again``: timed even where this model was timed before (the new
        timing is the one kept). ``give_up_above``: a ratio (the geometric
        mean over the batches) past which the caller has no use for the
        model; :data:`QUICK_PAIRS` pairs a batch are timed first, and where
        they already pass it, that quick timing is the answer (not kept).
        ``glance``: :data:`QUICK_PAIRS` pairs a batch and no more, where the
        model was not timed before (not kept): a figure to show, not to
        decide on.
        """
        if self.untimed:
            return None
        key = _digest(model)
        if not again and key is not None and key in self._timed:
            return self._timed[key]
        try:
            session = self._runtime.session(model, spinning=False)
        except QuantizationError:  # no kernels for its types on this runtime: no latency to give
            session = None
        if session is not None and glance:
            return self._each_batch(model, session, QUICK_PAIRS)
        if session is not None and give_up_above is not None:
            quick = self._each_batch(model, session, QUICK_PAIRS)
            if quick is None or mean_ratio(quick) > give_up_above:
                return quick
        found = None if session is None else self._each_batch(model, session, None)
        if key is not None:
            self._timed[key] = found
        return found

    def _each_batch(self, model: onnx.ModelProto, session: Any, pairs: int | None) -> tuple[Latency, ...] | None:
        timings = [timer.time(model, session, pairs) for timer in self._timers]
        return None if any(t is None for t in timings) else tuple(timings)  # type: ignore[arg-type]


def _digest(model: onnx.ModelProto) -> bytes | None:
    """A digest of everything ``model`` holds (None for a model past protobuf's 2 GB, which is never timed twice)."""
    if large.is_large(model):
        return None
    return hashlib.sha256(model.SerializeToString(deterministic=True)).digest()


def worst_ratio(latencies: Sequence[Latency]) -> float:
    """The largest latency ratio over the batches timed: what a latency budget bounds, at every batch."""
    return max(t.ratio for t in latencies)


def mean_ratio(latencies: Sequence[Latency]) -> float:
    """The geometric mean of the latency ratios over the batches timed: each batch's share of time saved counts alike."""
    return math.exp(statistics.fmean(math.log(t.ratio) for t in latencies))
