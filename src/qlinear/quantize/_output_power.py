"""The outputs' signal and noise power against the float model's: what their SQNR is computed from.

Each judged output (the first, and every other of a float type) keeps its
own sums, and an output made by a Concat of several tensors (a detector's
boxes beside its scores) keeps one a part; the model's SQNR is the worst
one's. Sums carried from batch to batch give the SQNR of all of them, so
a figure on more batches continues one on fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qlinear.quantize._sqnr import sqnr_db
from qlinear.quantize._sums import squared_sums

__all__ = ["OutputsPower", "Power", "judged_outputs"]


@dataclass
class Power:
    """One tensor's signal and noise power summed over the batches seen (its finite reference values only)."""

    signal: float = 0.0
    noise: float = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref, got = _flat(ref), _flat(got)
        if ref.size != got.size:  # the one-pass sum reads both element by element, unchecked
            raise ValueError(f"the reference holds {ref.size} values and the quantized output {got.size}")
        signal, noise = squared_sums(ref, got)
        self.signal += signal
        self.noise += noise

    @property
    def db(self) -> float | None:
        return sqnr_db(self.signal, self.noise)


def _flat(a: np.ndarray) -> np.ndarray:
    """``a`` as the 1-D float32 or float64 array :func:`squared_sums` takes (other types widened to float64)."""
    a = np.asarray(a)
    return np.ravel(a if a.dtype in (np.float32, np.float64) else a.astype(np.float64))


class _OutputPower:
    """The output's signal and noise, and each part's where the output is a Concat of several (:func:`concat_parts`).

    Its SQNR is the worst part's: one SQNR over a detector's boxes (0-320
    pixels) and class scores (0-1) is the boxes' alone, and says nothing of
    scores quantization destroyed.
    """

    def __init__(self, parts: tuple[int, list[slice]] | None) -> None:
        self.whole = Power()
        self.axis, self.slices = parts if parts is not None else (0, [])
        self.parts = [Power() for _ in self.slices]

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        self.whole.add(ref, got)
        for power, part in zip(self.parts, self.slices, strict=True):
            index = (slice(None),) * self.axis + (part,)
            power.add(np.asarray(ref)[index], np.asarray(got)[index])

    @property
    def part_dbs(self) -> list[float | None] | None:
        return [p.db for p in self.parts] if self.parts else None

    @property
    def db(self) -> float | None:
        return _worst(self.part_dbs) if self.parts else self.whole.db


# Output types judged by SQNR.
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE})


def judged_outputs(model: onnx.ModelProto) -> list[str]:
    """The outputs judged by SQNR: the first, and every other of a float type."""
    outputs = list(model.graph.output)
    return [outputs[0].name] + [o.name for o in outputs[1:] if o.type.tensor_type.elem_type in _FLOAT_TYPES]


def _worst(dbs: list[float | None]) -> float | None:
    noisy = [d for d in dbs if d is not None]  # None: an output or part that came out exact
    return min(noisy) if noisy else None


class OutputsPower:
    """Each judged output's power (:class:`_OutputPower`); the worst output's SQNR is the model's."""

    def __init__(self, parts: dict[str, tuple[int, list[slice]] | None]) -> None:
        self.outputs = {name: _OutputPower(p) for name, p in parts.items()}

    def add(self, ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
        for name, power in self.outputs.items():
            power.add(ref[name], got[name])

    @property
    def db(self) -> float | None:
        return _worst([p.db for p in self.outputs.values()])

    @property
    def by_output(self) -> dict[str, float | None] | None:
        """Each output's SQNR, where there are several."""
        return {name: p.db for name, p in self.outputs.items()} if len(self.outputs) > 1 else None
