"""Calibration statistics: mergeable, batch-order-free summaries of one tensor's values.

A :class:`TensorStats` holds the count, the minimum and maximum and a
histogram of the finite values seen. The histogram's bins are
``[k * 2**e, (k + 1) * 2**e)`` for integers ``k``: anchored at zero and a
power of two wide, so a coarser grid is always made by merging whole bins
(``k -> k >> j``), exactly. The width is always the narrowest power of two
whose bins cover ``[min, max]`` in at most :data:`MAX_BINS`, a function of
the range alone; so the statistics of a set of values do not depend on how
they were split into batches or in which order the batches were merged.
Nothing of the values themselves is kept.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.quantize._sums import bin_counts

__all__ = ["MAX_BINS", "TensorStats", "load_calibration", "load_stats", "save_stats"]

MAX_BINS = 2048
# Bins are never narrower than this (2**-100): below it every float32 range that
# quantization could use is resolved far better than its levels.
_MIN_EXPONENT = -100


@dataclass(frozen=True)
class TensorStats:
    """Statistics of the finite values of one tensor (NaN and infinities are counted apart).

    Attributes:
        count: finite values seen.
        nonfinite: NaN and infinite values seen (left out of everything else).
        min, max: the smallest and largest finite value (0 when ``count`` is 0).
        exponent: the bins are ``2**exponent`` wide.
        first: the index ``k`` of the first bin.
        counts: values in bins ``first, first + 1, ...`` (int64).
    """

    count: int
    nonfinite: int
    min: float
    max: float
    exponent: int
    first: int
    counts: np.ndarray

    @classmethod
    def empty(cls) -> TensorStats:
        return cls(0, 0, 0.0, 0.0, _MIN_EXPONENT, 0, np.zeros(0, np.int64))

    @classmethod
    def of(cls, values: np.ndarray) -> TensorStats:
        """The statistics of ``values`` (any shape, any float type)."""
        flat = np.asarray(values).reshape(-1)
        if flat.dtype not in (np.float32, np.float64):
            flat = flat.astype(np.float32)
        if flat.size == 0:
            return cls(0, 0, 0.0, 0.0, _MIN_EXPONENT, 0, np.zeros(0, np.int64))
        nonfinite = 0
        low, high = flat.min(), flat.max()
        if not (np.isfinite(low) and np.isfinite(high)):  # NaN makes both NaN: only then look element by element
            finite = np.isfinite(flat)
            nonfinite = int(flat.size - np.count_nonzero(finite))
            flat = flat[finite]
            if flat.size == 0:
                return cls(0, nonfinite, 0.0, 0.0, _MIN_EXPONENT, 0, np.zeros(0, np.int64))
            low, high = flat.min(), flat.max()
        low, high = float(low), float(high)
        exponent = _exponent(low, high)
        first = _bin(low, exponent)
        # x * 2**-e is exact in x's own type (e keeps it below 2**62, and a result too small to be
        # exact floors to 0 or -1 all the same), so no wider copy of the values is made.
        counts = bin_counts(flat, flat.dtype.type(math.ldexp(1.0, -exponent)), first, _bin(high, exponent) - first + 1)
        return cls(int(flat.size), nonfinite, low, high, exponent, first, counts)

    def merge(self, other: TensorStats) -> TensorStats:
        """The statistics of the values of both."""
        if other.count == 0 or self.count == 0:
            base = other if self.count == 0 else self
            return TensorStats(
                base.count, self.nonfinite + other.nonfinite, base.min, base.max, base.exponent, base.first, base.counts
            )
        low, high = min(self.min, other.min), max(self.max, other.max)
        exponent = max(_exponent(low, high), self.exponent, other.exponent)
        first = _bin(low, exponent)
        counts = np.zeros(_bin(high, exponent) - first + 1, np.int64)
        for s in (self, other):
            shift = exponent - s.exponent
            if shift == 0:
                counts[s.first - first : s.first - first + s.counts.size] += s.counts
                continue
            k = (np.arange(s.first, s.first + s.counts.size, dtype=np.int64) >> shift) - first
            counts += np.bincount(k, weights=s.counts, minlength=counts.size).astype(np.int64)
        return TensorStats(self.count + other.count, self.nonfinite + other.nonfinite, low, high, exponent, first, counts)

    @property
    def edges(self) -> np.ndarray:
        """The bins' edges, ``counts.size + 1`` of them."""
        return np.ldexp(np.arange(self.first, self.first + self.counts.size + 1, dtype=np.float64), self.exponent)

    def quantile(self, q: float) -> float:
        """The value below which a fraction ``q`` of the values lie, interpolated within its bin."""
        if self.count == 0:
            return 0.0
        target = q * self.count
        cumulative = np.cumsum(self.counts)
        i = int(np.searchsorted(cumulative, target, side="left"))
        i = min(i, self.counts.size - 1)
        before = cumulative[i - 1] if i else 0
        inside = (target - before) / self.counts[i] if self.counts[i] else 0.0
        edges = self.edges
        return float(np.clip(edges[i] + inside * (edges[i + 1] - edges[i]), self.min, self.max))

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The statistics as named arrays, for ``np.savez``."""
        head = np.array([self.count, self.nonfinite, self.exponent, self.first], np.int64)
        return {f"{prefix}/head": head, f"{prefix}/range": np.array([self.min, self.max]), f"{prefix}/counts": self.counts}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> TensorStats:
        count, nonfinite, exponent, first = (int(v) for v in arrays[f"{prefix}/head"])
        low, high = (float(v) for v in arrays[f"{prefix}/range"])
        return cls(count, nonfinite, low, high, exponent, first, np.asarray(arrays[f"{prefix}/counts"], np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorStats):
            return NotImplemented
        head = (self.count, self.nonfinite, self.min, self.max, self.exponent, self.first)
        return head == (other.count, other.nonfinite, other.min, other.max, other.exponent, other.first) and np.array_equal(
            self.counts, other.counts
        )

    __hash__ = None  # type: ignore[assignment]


def _bin(value: float, exponent: int) -> int:
    return math.floor(math.ldexp(value, -exponent))


def _exponent(low: float, high: float) -> int:
    """The narrowest power-of-two bin width (as its exponent) whose bins cover ``[low, high]`` in MAX_BINS."""
    span = high - low
    # Bin indices stay within int64: |value| / 2**e below 2**62.
    floor = max(_MIN_EXPONENT, math.frexp(max(abs(low), abs(high)))[1] - 62)
    e = floor if span <= 0 else max(floor, math.frexp(span / MAX_BINS)[1] - 1)
    while _bin(high, e) - _bin(low, e) + 1 > MAX_BINS:
        e += 1
    return e


def save_stats(
    stats: dict[str, TensorStats],
    path: str,
    *,
    model_digest: str,
    extras: dict[str, np.ndarray] | None = None,
    batches: int | None = None,
) -> None:
    """Write calibration statistics to an ``.npz``, with the digest of the model they belong to.

    ``extras``: more named arrays (input means' sums, Gram matrices), and
    ``batches``: the calibration batches counted so far, for a run that is
    continued later. Written to a temporary file and renamed into place, so
    the file is always whole even if the run is stopped while writing.
    """
    arrays: dict[str, np.ndarray] = {"__model_digest__": np.array(model_digest), "__names__": np.array(list(stats), dtype=str)}
    for i, s in enumerate(stats.values()):
        arrays.update(s.to_arrays(str(i)))
    for name, value in (extras or {}).items():
        arrays[f"__extra__/{name}"] = value
    if batches is not None:
        arrays["__batches__"] = np.array(batches, np.int64)
    tmp = f"{path}.partial"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise QuantizationError(f"quantize: cannot write statistics to {path}: {e.strerror}") from None


def load_stats(path: str, *, model_digest: str) -> dict[str, TensorStats]:
    """Read statistics written by :func:`save_stats` for the model of ``model_digest``.

    Raises:
        QuantizationError: the file cannot be read, is no statistics file,
            or belongs to another model.
    """
    return load_calibration(path, model_digest=model_digest)[0]


def load_calibration(
    path: str, *, model_digest: str, what: str = "stats"
) -> tuple[dict[str, TensorStats], dict[str, np.ndarray], int | None]:
    """``(statistics, extras, batches counted)`` as :func:`save_stats` wrote them (batches None: not recorded).

    ``what``: the argument that named the file (``stats``, ``resume``), as the errors say it.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = dict(f.items())
    except (OSError, ValueError) as e:
        raise QuantizationError(f"quantize: {what} {path} cannot be read as calibration statistics: {e}") from None
    if "__names__" not in arrays or "__model_digest__" not in arrays:
        raise QuantizationError(f"quantize: {what} {path} is not a statistics file written by --save-stats")
    if str(arrays["__model_digest__"]) != model_digest:
        raise QuantizationError(f"quantize: {what} {path} were computed for another model (digest differs); calibrate again")
    stats = {str(name): TensorStats.from_arrays(arrays, str(i)) for i, name in enumerate(arrays["__names__"])}
    extras = {k.removeprefix("__extra__/"): v for k, v in arrays.items() if k.startswith("__extra__/")}
    batches = int(arrays["__batches__"]) if "__batches__" in arrays else None
    return stats, extras, batches
