"""What calibration keeps of each batch: its reduction (:class:`Observed`), merged in batch order (:class:`CalibrationState`).

A batch is reduced where it ran (this process, a worker process, a Ray
task) and the reductions added in batch order, so the statistics do not
depend on who computed them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qlinear.quantize._patches import Patches, patch_gram
from qlinear.quantize._stats import TensorStats

__all__ = ["CalibrationState", "Observed"]


@dataclass(frozen=True)
class Observed:
    """What calibration keeps of each tensor: which statistics, and where a tensor's channels lie.

    ``tensors``: histogram statistics; ``channel_axes``: per-channel sums
    (bias correction's means); ``gram_tensors``: ``X^T X`` over the last
    axis (GPTQ of a MatMul or Gemm); ``gram_patches``: ``X^T X`` of a Conv's
    input patches (GPTQ of a Conv), kept under :attr:`Patches.key`.
    """

    tensors: tuple[str, ...]
    channel_axes: dict[str, int] = field(default_factory=dict)
    gram_tensors: tuple[str, ...] = ()
    gram_patches: tuple[Patches, ...] = ()

    @property
    def names(self) -> list[str]:
        patched = [p.tensor for p in self.gram_patches]
        return list(dict.fromkeys([*self.tensors, *self.channel_axes, *self.gram_tensors, *patched]))

    @property
    def gram_keys(self) -> list[str]:
        """The names the Gram matrices are kept under: the tensors', then the patches' keys."""
        return [*self.gram_tensors, *(p.key for p in self.gram_patches)]

    def reduce(self, values: list[np.ndarray]) -> dict[str, Any]:
        """One batch's values reduced to what is kept: small, and the same in whichever process it is computed."""
        out: dict[str, Any] = {}
        for name, v in zip(self.names, values, strict=True):
            if name in self.tensors:
                out[f"stats/{name}"] = TensorStats.of(v)
            if name in self.channel_axes:
                v = np.asarray(v)
                channel = self.channel_axes[name] % v.ndim
                # Summed in float64 where it lies: no float64 copy of the batch, no channels-last copy of it.
                out[f"sum/{name}"] = v.sum(axis=tuple(a for a in range(v.ndim) if a != channel), dtype=np.float64)
                out[f"count/{name}"] = v.size // v.shape[channel]
            if name in self.gram_tensors:
                rows = np.asarray(v, np.float64).reshape(-1, np.shape(v)[-1])
                out[f"gram/{name}"] = rows.T @ rows
        if self.gram_patches:
            by_name = dict(zip(self.names, values, strict=True))
            for p in self.gram_patches:
                out[f"gram/{p.key}"], out[f"rows/{p.key}"] = patch_gram(by_name[p.tensor], p)
        return out


@dataclass
class CalibrationState:
    """The statistics so far; batches are added in their order, so the result does not depend on who computed them."""

    observed: Observed
    stats: dict[str, TensorStats] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    grams: dict[str, np.ndarray] = field(default_factory=dict)
    gram_rows: dict[str, int] = field(default_factory=dict)  # the rows each Gram matrix sums
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
            elif kind == "rows":
                self.gram_rows[name] = self.gram_rows.get(name, 0) + value
            else:
                self.grams[name] = self.grams[name] + value if name in self.grams else value
        self.batches += 1
        self.samples += samples

    def extras(self) -> dict[str, np.ndarray]:
        """The sums, counts and Gram matrices as named arrays (for a file a later run continues from)."""
        out = {f"sum/{k}": v for k, v in self.sums.items()}
        out.update({f"count/{k}": np.array(v, np.int64) for k, v in self.counts.items()})
        out.update({f"gram/{k}": v for k, v in self.grams.items()})
        out.update({f"rows/{k}": np.array(v, np.int64) for k, v in self.gram_rows.items()})
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
            elif kind == "rows":
                state.gram_rows[name] = int(value)
        return state
