"""Calibration and evaluation data: read, checked against the model's inputs, batched.

Data is a set of arrays, one per model input and named after it, whose
batch axis counts samples (an ``.npz`` file, or a dict of arrays); or, in
Python, any iterable of ``{input name: array}`` batches. Integer inputs
(token ids, byte values) pass through as they are.

An input's batch axis is its first, unless the model names the batch: the
symbolic first dimension most inputs share (``batch``), found at another
axis of an input, is that input's batch axis (a recurrent state of shape
``(layers, batch, hidden)``). A scalar input (a sample rate, a diffusion
time step) holds no samples: its array is a scalar too, fed whole to every
batch; so is an input of fixed shape whose first dimension is over 1,
beside inputs of an open batch or of a batch fixed at one (a mask, a
table of positions), its array of that shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.quantize._model import FloatModel

__all__ = ["Batch", "Dataset", "InputSpec", "input_specs", "load_dataset", "random_dataset", "samples_in"]


@dataclass(frozen=True)
class InputSpec:
    """A model input: name, numpy dtype, shape (None or a name for symbolic dimensions), and the axis counting samples.

    ``batch_axis`` None: a scalar input, or one of fixed shape beside inputs of an open batch, fed whole to every batch.
    """

    name: str
    dtype: np.dtype
    shape: tuple
    batch_axis: int | None = 0


def input_specs(fm: FloatModel) -> list[InputSpec]:
    raw = []
    for vi in fm.graph.input:
        if vi.name in fm.initializers:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype(np.float32)
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        raw.append((vi.name, dtype, shape, tt.HasField("shape") and not shape))
    named = Counter(shape[0] for _, _, shape, _ in raw if shape and isinstance(shape[0], str))
    batch = named.most_common(1)[0][0] if named else None
    of_one = {name for name, _, shape, _ in raw if shape and shape[0] == 1}  # inputs fixed at a batch of one
    specs = []
    for name, dtype, shape, scalar in raw:
        beside_a_batch = batch is not None or bool(of_one - {name})
        whole = scalar or (beside_a_batch and _fixed_beside_a_batch(shape))
        axis = None if whole else shape.index(batch) if batch is not None and batch in shape else 0
        specs.append(InputSpec(name, dtype, shape, axis))
    return specs


def _fixed_beside_a_batch(shape: tuple) -> bool:
    """Whether an input of ``shape`` beside batched inputs holds no samples: every dimension fixed, the first over 1.

    A mask or a table of positions, fed whole. A fixed first dimension of 1
    is a batch of one (a recurrent state), which takes samples.
    """
    return bool(shape) and all(isinstance(d, int) and d > 0 for d in shape) and shape[0] > 1


class Batch(dict):
    """One batch of model inputs (input name -> array) and how many samples it holds."""

    samples: int = 0


def samples_in(feeds: Mapping[str, np.ndarray]) -> int:
    """The samples in a batch: a :class:`Batch` knows; a plain dict counts along its first array's first axis."""
    if isinstance(feeds, Batch):
        return feeds.samples
    return next((np.shape(v)[0] for v in feeds.values() if np.ndim(v)), 0)


def _take(a: np.ndarray, axis: int | None, part: slice) -> np.ndarray:
    """``a``'s samples ``part`` along ``axis``; a scalar input's array whole."""
    return a if axis is None else a[(slice(None),) * axis + (part,)]


def _count(arrays: dict[str, np.ndarray], axes: dict[str, int | None]) -> int:
    """The samples in ``arrays``: along the batch axis of the first input that has one."""
    return next((a.shape[axes[n]] for n, a in arrays.items() if axes.get(n) is not None), 0)


def _batch(arrays: dict[str, np.ndarray], axes: dict[str, int | None]) -> Batch:
    out = Batch(arrays)
    out.samples = _count(arrays, axes)
    return out


class Dataset:
    """Samples for the model's inputs, walked in batches of a fixed size.

    ``arrays`` maps input names to arrays of ``samples`` along axis 0; a
    dataset made from an iterable of batches has ``arrays=None`` and walks
    those batches as they come.
    """

    def __init__(
        self,
        arrays: dict[str, np.ndarray] | None,
        batches: Iterable[Mapping[str, np.ndarray]] | None,
        source: str,
        axes: dict[str, int | None] | None = None,
    ):
        self.arrays = arrays
        self.axes = axes if axes is not None else dict.fromkeys(arrays or (), 0)  # each input's batch axis
        self._batches = batches
        self.source = source
        self.labels: np.ndarray | None = None
        self.random = False  # uniform random samples: a smoke test
        self.unused: list[str] = []  # arrays of the data that no model input reads (the report names them)

    @property
    def samples(self) -> int | None:
        if self.arrays is None:
            return None
        return _count(self.arrays, self.axes)

    def split(self, held_out: float, multiple: int = 1) -> tuple[Dataset, Dataset]:
        """The first part and the last ``held_out`` share of the samples (at least one each; ``multiple``: a multiple of it each, where it can)."""
        n = self.samples
        if n is None:
            raise QuantizationError("quantize: a stream of batches cannot be split; pass eval data")
        if n < 2:
            raise QuantizationError(
                f"quantize: {self.source} holds {n} sample: too few to hold out a share for the accuracy figures; "
                "give more samples, or eval data"
            )
        k = min(n - 1, max(1, round(n * held_out)))
        if multiple > 1 and n >= 2 * multiple:
            k = min(n - multiple, max(multiple, round(n * held_out / multiple) * multiple))
        axes = self.axes
        first = Dataset(
            {name: _take(a, axes[name], slice(None, n - k)) for name, a in self.arrays.items()},
            None, f"{self.source} samples 0-{n - k - 1}", axes,
        )  # fmt: skip
        last = Dataset(
            {name: _take(a, axes[name], slice(n - k, None)) for name, a in self.arrays.items()},
            None, f"{self.source} samples {n - k}-{n - 1} (held out)", axes,
        )  # fmt: skip
        first.random = last.random = self.random
        first.unused = self.unused  # said once, of the data given
        if self.labels is not None:
            first.labels, last.labels = self.labels[: n - k], self.labels[n - k :]
        return first, last

    def head(self, samples: int) -> Dataset:
        """The first ``samples`` samples (all there are, where fewer; a stream of batches as it is)."""
        n = self.samples
        if n is None or n <= samples:
            return self
        part = Dataset(
            {name: _take(a, self.axes[name], slice(None, samples)) for name, a in self.arrays.items()},
            None, f"{self.source} samples 0-{samples - 1}", self.axes,
        )  # fmt: skip
        part.random = self.random
        if self.labels is not None:
            part.labels = self.labels[:samples]
        return part

    def replayable(self, batch_size: int) -> Dataset:
        """This dataset, walkable more than once: a stream of batches is read into memory (arrays are kept as they are)."""
        if self.arrays is not None:
            return self
        kept = Dataset(None, list(self.batches(batch_size)), self.source, self.axes)
        kept.labels, kept.random = self.labels, self.random
        return kept

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        if self.arrays is None:
            yield from (dict(b) for b in self._batches)  # type: ignore[union-attr]
            return
        n = self.samples or 0
        for start in range(0, n, batch_size):
            part = slice(start, start + batch_size)
            yield _batch({name: _take(a, self.axes[name], part) for name, a in self.arrays.items()}, self.axes)

    def batch_count(self, batch_size: int) -> int | None:
        n = self.samples
        return None if n is None else -(-n // batch_size)


def load_dataset(data: Any, fm: FloatModel, *, what: str, labels: str | None = None) -> Dataset:
    """``data`` (a path to an .npz, a dict of arrays, or an iterable of batches) checked against ``fm``'s inputs.

    Raises:
        QuantizationError: the file cannot be read; an input is missing, or
            an array's dtype or shape does not fit its input (naming the
            input, what was expected and what was given); ``labels`` names
            no array.
    """
    specs = input_specs(fm)
    source = what
    if isinstance(data, (str, PathLike)):
        source = f"{what} {Path(data).name}"
        try:
            with np.load(data, allow_pickle=False) as f:
                data = {k: f[k] for k in f.files}
        except (OSError, ValueError, EOFError) as e:
            raise QuantizationError(f"quantize: {what} {data} cannot be read as an .npz file: {e}") from None
    if isinstance(data, Mapping):
        arrays = {k: np.asarray(v) for k, v in data.items()}
        label_array = None
        if labels is not None:
            if labels not in arrays:
                raise QuantizationError(f"quantize: labels {labels!r} is not an array in the {what}; it holds {sorted(arrays)}")
            label_array = arrays.pop(labels)
        _check(arrays, specs, what)
        fed = {s.name: arrays[s.name] for s in specs}
        axes = {s.name: s.batch_axis for s in specs}
        counts = {name: a.shape[axes[name]] for name, a in fed.items() if axes[name] is not None}
        if len(set(counts.values())) > 1:
            raise QuantizationError(f"quantize: {what} arrays hold different numbers of samples: {counts}")
        n = next(iter(counts.values()), 0)
        if n == 0:
            raise QuantizationError(f"quantize: {what} holds no samples")
        if label_array is not None and label_array.shape[0] != n:
            raise QuantizationError(f"quantize: labels {labels!r} hold {label_array.shape[0]} values for {n} samples")
        ds = Dataset(fed, None, source, axes)
        ds.labels = label_array
        ds.unused = sorted(set(arrays) - set(fed))
        return ds
    if isinstance(data, Iterable):
        return Dataset(None, _checked_batches(data, specs, what), source, {s.name: s.batch_axis for s in specs})
    raise QuantizationError(
        f"quantize: {what} must be an .npz path, a dict of arrays or an iterable of dicts, got {type(data).__name__}"
    )


def _checked_batches(batches: Iterable, specs: list[InputSpec], what: str) -> Iterator[dict[str, np.ndarray]]:
    for i, b in enumerate(batches):
        if not isinstance(b, Mapping):
            raise QuantizationError(f"quantize: {what} batch {i} must be a dict of arrays, got {type(b).__name__}")
        arrays = {k: np.asarray(v) for k, v in b.items()}
        _check(arrays, specs, f"{what} batch {i}")
        yield _batch({s.name: arrays[s.name] for s in specs}, {s.name: s.batch_axis for s in specs})


def _check(arrays: dict[str, np.ndarray], specs: list[InputSpec], what: str) -> None:
    names = [s.name for s in specs]
    for s in specs:
        if s.name not in arrays:
            raise QuantizationError(
                f"quantize: {what} has no array for model input {s.name!r}; the model's inputs are {names}, given {sorted(arrays)}"
            )
        a = arrays[s.name]
        if a.dtype != s.dtype:
            raise QuantizationError(
                f"quantize: {what} array {s.name!r} has dtype {a.dtype}, expected {s.dtype} (the model input's type)"
            )
        if s.batch_axis is None:
            if a.shape != tuple(s.shape):
                expected = f"{tuple(s.shape)}: model input {s.name!r} has that fixed shape" if s.shape else (
                    f"a scalar: model input {s.name!r} is one"
                )  # fmt: skip
                raise QuantizationError(
                    f"quantize: {what} array {s.name!r} has shape {a.shape}, expected {expected}, fed whole to every batch"
                )
            continue
        axis = s.batch_axis
        if s.shape and (
            a.ndim != len(s.shape)
            or any(
                isinstance(d, int) and d > 0 and d != n
                for k, (d, n) in enumerate(zip(s.shape, a.shape, strict=True))
                if k != axis
            )
        ):
            dims = ["samples" if k == axis else str(d) if isinstance(d, int) and d > 0 else "?" for k, d in enumerate(s.shape)]
            expected = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
            raise QuantizationError(
                f"quantize: {what} array {s.name!r} has shape {a.shape}, expected {expected} for model input {s.name!r}"
            )


def random_dataset(fm: FloatModel, samples: int, *, seed: int = 0) -> Dataset:
    """Uniform random samples for every input (a smoke test: real data gives real ranges)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    specs = input_specs(fm)
    for s in specs:
        shape = tuple(samples if k == s.batch_axis else d if isinstance(d, int) and d > 0 else 1 for k, d in enumerate(s.shape))
        if np.issubdtype(s.dtype, np.integer):
            arrays[s.name] = rng.integers(0, 2, shape).astype(s.dtype)
        elif s.dtype == np.bool_:
            arrays[s.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            arrays[s.name] = rng.uniform(-1, 1, shape).astype(s.dtype)
    ds = Dataset(
        arrays, None, f"{samples} random samples (uniform in [-1, 1]; a smoke test, not a calibration)",
        {s.name: s.batch_axis for s in specs},
    )  # fmt: skip
    ds.random = True
    return ds
