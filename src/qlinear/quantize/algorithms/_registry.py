"""The algorithm registry: what each algorithm is, when it is on, what it needs and when it runs.

An algorithm (SmoothQuant, AWQ, GPTQ, bias correction, equalization,
fine-tuning, ...) is one module that ends by registering an
:class:`Algorithm`. The quantizer's options take its fields, the command
line its flags, the report its settings and the pipeline its stage from
here; nothing else names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qlinear._errors import QuantizationError

__all__ = ["ALGORITHMS", "STAGES", "Algorithm", "Calibrated", "Facts", "Needs", "check_data_read_twice", "register"]

# When an algorithm runs, in the pipeline's order:
#   float:       rewrites the float model before calibration (apply(fm, options, data, bars) -> its report entries)
#   calibration: needs something calibrated beside the activations' statistics (calibrates(fm, nodes, options) -> Needs),
#                which the conversion hands it as it rounds each weight (rounds) or sets each bias (corrects)
#   refine:      improves the quantized model after the accuracy target is met
#                (apply(fm, qmodel, data, reference, options, bars) -> (qmodel, its result))
STAGES = ("float", "calibration", "refine")


@dataclass(frozen=True)
class Facts:
    """What an algorithm's default and preconditions are decided from, besides the options asked for."""

    calibration_given: bool  # calibration data was given (arrays, an .npz or a stream of batches)
    has_inputs: bool  # calibration inputs are at hand (given or random samples), not saved statistics alone
    arrays: bool  # the calibration data are arrays, which a pass may read before the calibration reads them again


def check_data_read_twice(name: str, facts: Facts) -> None:
    """Refuse ``name``, an algorithm that reads the calibration data before the calibration reads it, without such data."""
    if not facts.has_inputs:
        raise QuantizationError(f"quantize: {name} needs calibration data (not saved statistics)")
    if not facts.arrays and facts.calibration_given:
        raise QuantizationError(f"quantize: {name} reads the calibration data twice; give arrays or an .npz, not a stream")


@dataclass(frozen=True)
class Needs:
    """What a stage-``calibration`` algorithm reads from the calibration data beside the activations' ranges."""

    channel_axes: Mapping[str, int] = field(default_factory=dict)  # tensor -> the axis of its channels, whose means it reads
    gram_tensors: tuple[str, ...] = ()  # tensors whose ``X^T X`` over the last axis it reads
    gram_patches: tuple[Any, ...] = ()  # Convs' input patches (qlinear.quantize._patches.Patches) whose ``X^T X`` it reads


@dataclass(frozen=True)
class Calibrated:
    """What the calibration measured for the stage-``calibration`` algorithms (float64, by tensor)."""

    means: Mapping[str, Any] = field(default_factory=dict)  # per-channel means of the tensors some Needs named
    grams: Mapping[str, Any] = field(default_factory=dict)  # X^T X over the last axis, or of patches (by Patches.key)
    gram_rows: Mapping[str, int] = field(default_factory=dict)  # the rows each of them sums (absent: not counted)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as the registry knows it.

    Attributes:
        name: the option that turns it on, and its key in the report's settings.
        summary: one line for the options reference.
        stage: one of :data:`STAGES`.
        fields: its options, ``(name, type, dataclasses.Field)`` as
            ``dataclasses.make_dataclass`` takes them (each with an
            :class:`~qlinear.quantize._option_fields.Option`); the first is
            ``name`` itself.
        default: the value of ``name`` where the user left it None, from the
            options and :class:`Facts` (None: its field's default stands).
        check: raises QuantizationError, naming the flag, where it is on
            but cannot run on these options and data.
        validate: raises QuantizationError for a value of its options that
            is never valid (run when the options are made).
        calibrates: what it needs calibrated (:class:`Needs`), from the
            float model, the nodes any precision on the target's ladder
            quantizes and the options (stage ``calibration``): only what
            ``rounds`` or ``corrects`` will read under those options.
        rounds: a layer's weight rounded from what it calibrated, as
            ``rounds(fm, node_plan, weight, weight_type, options,
            calibrated)`` gives it: ``(weight as rounded, params, axis,
            block)``, which the parameters quantize to the codes it chose,
            or None where it does not serve the layer (round to nearest).
        corrects: for a layer, ``corrects(fm, node_plan, calibrated)``
            gives a function of its weight's error (dequantized minus
            float, float64) returning ``(shift, site)``, the per-output
            shift to take out of its bias and where that bias is (a
            :class:`~qlinear.quantize.algorithms.bias_correction.BiasSite`),
            or None; or gives None where it does not serve the layer.
        apply: what it does (stages ``float`` and ``refine``).
        reads_data: it reads the calibration or eval data (a run given
            none refuses it, naming it).
        result: the record (:mod:`qlinear.quantize._records`) its
            ``apply`` gives at stage ``refine``, which the report writes
            under its name and reads back.
    """

    name: str
    summary: str
    stage: str
    fields: tuple[tuple[str, Any, dataclasses.Field], ...]
    default: Callable[[Any, Facts], Any] | None = None
    check: Callable[[Any, Facts], None] | None = None
    validate: Callable[[Any], None] | None = None
    calibrates: Callable[[Any, list, Any], Needs] | None = None
    rounds: Callable[..., Any] | None = None
    corrects: Callable[..., Any] | None = None
    apply: Callable[..., Any] | None = None
    reads_data: bool = True
    result: type | None = None

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"Algorithm {self.name}: stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if not self.fields or self.fields[0][0] != self.name:
            raise ValueError(f"Algorithm {self.name}: its first field must be named {self.name!r}")

    def on(self, options: Any) -> bool:
        return bool(getattr(options, self.name))


# Every registered algorithm, in the order each stage runs them.
ALGORITHMS: list[Algorithm] = []


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` to the registry (once: a second algorithm of the same name is refused)."""
    if any(a.name == algorithm.name for a in ALGORITHMS):
        raise ValueError(f"register: an algorithm named {algorithm.name!r} is registered already")
    ALGORITHMS.append(algorithm)
    return algorithm
