"""What the user asked the quantizer for: one frozen configuration, checked once, and its defaults resolved once.

:class:`QuantizeOptions` holds the formats, the calibration method, the
accuracy target and every registered algorithm's options (each
algorithm's module declares its own fields: see
:mod:`qlinear.quantize.algorithms`). Each field's metadata
(:mod:`qlinear.quantize._option_fields`) gives its flag, help and default
to the command line, the report and the options reference. How a run
executes (workers, Ray, resuming, progress) is not here: those are
arguments of :func:`qlinear.quantize.quantize_model`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType, element_type
from qlinear.quantize._metric import load_metric, metric_name
from qlinear.quantize._option_fields import default_of, option, option_fields
from qlinear.quantize.algorithms import ALGORITHMS, Facts
from qlinear.quantize.targets import DEFAULT_TARGET, FORMS, QDQ_FORM, TARGETS, target

__all__ = [
    "ACTIVATION_TYPES",
    "DEFAULT_AGREEMENT",
    "DEFAULT_SQNR_DB",
    "GRANULARITIES",
    "METHODS",
    "WEIGHT_TYPES",
    "QuantizeOptions",
    "resolve",
]

WEIGHT_TYPES = ("int8", "uint8", "int4", "uint4", "int2", "uint2", "float8e4m3fn", "float8e5m2", "float4e2m1")
ACTIVATION_TYPES = ("uint8", "int8", "uint16", "int16", "float8e4m3fn")
METHODS = ("minmax", "percentile", "entropy", "mse")
GRANULARITIES = ("per-tensor", "per-channel", "blocked")
WEIGHT_CLIPS = ("minmax", "mse", "search")
# The target promotions reach when none is given: top-1 agreement for outputs that classify, else output SQNR.
DEFAULT_AGREEMENT = 0.99
DEFAULT_SQNR_DB = 30.0
# The block size granularity="blocked" takes when none is given.
DEFAULT_BLOCK_SIZE = 32

_TARGET = "accuracy target"
# The formats, the calibration method and the accuracy target, in the order the report lists them.
_CORE_FIELDS = (
    (
        "weights",
        str,
        option("int8", choices=WEIGHT_TYPES, metavar="TYPE", shown=True, help="weight type: {choices} (default {default})"),
    ),
    (
        "activations",
        str | None,
        option(
            "uint8",
            choices=ACTIVATION_TYPES,
            metavar="TYPE",
            none_word="none",
            shown=True,
            help="activation type: {choices}, or none for weight-only (default {default})",
        ),
    ),
    (
        "method",
        str,
        option("mse", choices=METHODS, metavar="M", shown=True, help="activation ranges: {choices} (default {default})"),
    ),
    (
        "granularity",
        str,
        option("per-channel", choices=GRANULARITIES, metavar="G", shown=True, help="weights: {choices} (default {default})"),
    ),
    (
        "block_size",
        int,
        option(0, type=int, metavar="N", help=f"elements a block with --granularity blocked (default {DEFAULT_BLOCK_SIZE})"),
    ),
    ("symmetric", bool, option(False, form="switch", help="signed, symmetric activations (zero point 0)")),
    (
        "weight_clip",
        str,
        option(
            "minmax",
            choices=WEIGHT_CLIPS,
            metavar="C",
            shown=True,
            help="weight ranges: minmax, mse (least-error clipping per channel or block) or search (least-error scale and zero point; default {default})",
        ),
    ),
    (
        "exclude",
        tuple[str, ...],
        option(
            default_factory=tuple,
            form="list",
            metavar="PATTERN",
            help="nodes to leave in float: node names, op types, globs over names (/frontend/*), re:EXPRESSION, "
            "or FROM..TO (every node on a path from tensor FROM to node TO)",
        ),
    ),
    (
        "percentile",
        float,
        option(99.999, type=float, metavar="P", help="share of values kept by --method percentile (default {default})"),
    ),
    (
        "opset",
        int | None,
        option(None, type=int, metavar="N", help="the output's opset (default: the model's, raised as far as the types need)"),
    ),
    (
        "batch_size",
        int,
        option(
            16,
            type=int,
            metavar="N",
            group="data",
            shown=True,
            help="samples a batch (default {default}; a model with a fixed batch runs at it); the model does not depend on it",
        ),
    ),
    (
        "target_agreement",
        float | None,
        option(None, type=float, metavar="SHARE", group=_TARGET, help="top-1 agreement to reach, e.g. 0.995"),
    ),
    (
        "target_sqnr_db",
        float | None,
        option(None, type=float, flag="--target-sqnr", metavar="DB", group=_TARGET, help="output SQNR to reach, in dB"),
    ),
    (
        "promote",
        bool,
        option(
            True,
            form="negated",
            flag="--no-promote",
            group=_TARGET,
            help="keep the types asked for everywhere (a target given is judged, not reached for)",
        ),
    ),
    (
        "max_float",
        float,
        option(
            0.25,
            type=float,
            metavar="SHARE",
            group=_TARGET,
            shown=True,
            help="share of the quantized nodes promotions may leave float (default {default})",
        ),
    ),
    (
        "metric",
        Any,
        option(
            None,
            type=str,
            metavar="MODULE:FUNCTION",
            group=_TARGET,
            help="your accuracy measure, metric(float_outputs, quantized_outputs, labels) -> number, higher better, "
            "averaged over the eval batches (MODULE may be a file.py); with --target-metric, the target",
        ),
    ),
    (
        "target_metric",
        float | None,
        option(None, type=float, metavar="VALUE", group=_TARGET, help="the value --metric must reach"),
    ),
    (
        "latency_budget",
        float | None,
        option(
            None,
            type=float,
            metavar="RATIO",
            group=_TARGET,
            help="the most accurate model whose latency is at most RATIO times the float model's at each batch its "
            "users run, e.g. 0.8 (a target given beside it must be met too)",
        ),
    ),
    (
        "float_where_faster",
        bool,
        option(
            True,
            form="negated",
            flag="--no-float-where-faster",
            group=_TARGET,
            help="keep quantized the kinds of node the runtime runs faster in float at the users' batches (timed "
            "after the promotions; the default leaves them float, trading their weights' size for speed)",
        ),
    ),
    (
        "analyze",
        bool,
        option(
            False,
            form="switch",
            group=_TARGET,
            help="measure every node's sensitivity (output SQNR with only that node quantized) and print it; without "
            "it, it is measured only where the search needs its order (the target missed at the types asked for, "
            "or a latency budget)",
        ),
    ),
    (
        "target",
        str,
        option(
            DEFAULT_TARGET,
            choices=tuple(TARGETS),
            metavar="RUNTIME",
            group="target runtime",
            help="the runtime the model is placed for: {choices} (default {default})",
        ),
    ),
    (
        "format",
        str,
        option(
            QDQ_FORM,
            choices=FORMS,
            metavar="FORM",
            group="target runtime",
            help="the model's form: qdq (standard ONNX), or one its target runtime reads: matmulnbits (ort-cpu: blocked "
            "weight-only MatMuls as com.microsoft.MatMulNBits, computing the same) (default {default})",
        ),
    ),
)


class _Checked:
    """The checks and views :class:`QuantizeOptions` adds to its fields."""

    def __post_init__(self) -> None:
        _one_of("weights", self.weights, WEIGHT_TYPES)
        if self.activations is not None:
            _one_of("activations", self.activations, ACTIVATION_TYPES)
        _one_of("method", self.method, METHODS)
        _one_of("granularity", self.granularity, GRANULARITIES)
        _one_of("weight_clip", self.weight_clip, WEIGHT_CLIPS)
        _one_of("target", self.target, tuple(TARGETS))
        target(self.target)  # its runtime missing: refused before any work, in one line naming the extra
        if self.format != QDQ_FORM and self.format not in TARGETS[self.target].forms:
            readers = ", ".join(t.name for t in TARGETS.values() if self.format in t.forms) or "none"
            raise QuantizationError(
                f"quantize: format must be {QDQ_FORM!r} or a form target {self.target!r} reads "
                f"({', '.join(TARGETS[self.target].forms) or 'none'}), got {self.format!r} (read by: {readers})"
            )
        if not isinstance(self.block_size, int) or self.block_size < 0:
            raise QuantizationError(f"quantize: block_size must be an int >= 0, got {self.block_size!r}")
        if self.granularity == "blocked" and self.block_size == 0:
            object.__setattr__(self, "block_size", DEFAULT_BLOCK_SIZE)
        if self.granularity != "blocked" and self.block_size:
            raise QuantizationError(
                f"quantize: block_size needs granularity='blocked', got block_size={self.block_size} with granularity={self.granularity!r}"
            )
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise QuantizationError(f"quantize: batch_size must be an int >= 1, got {self.batch_size!r}")
        if not 50.0 <= float(self.percentile) <= 100.0:
            raise QuantizationError(f"quantize: percentile must be in [50, 100], got {self.percentile!r}")
        if self.opset is not None and not (isinstance(self.opset, int) and 10 <= self.opset):
            raise QuantizationError(f"quantize: opset must be an int >= 10, got {self.opset!r}")
        targets = [t for t in ("target_agreement", "target_sqnr_db", "target_metric") if getattr(self, t) is not None]
        if len(targets) > 1:
            raise QuantizationError(f"quantize: give one target, got {' and '.join(targets)}")
        if self.target_metric is not None and self.metric is None:
            raise QuantizationError("quantize: target_metric is a value of a metric: give metric= too (the function)")
        if self.metric is not None:
            load_metric(self.metric)  # a metric that cannot be imported is refused before any work
            if self.target_metric is None and self.promote and self.latency_budget is None:
                raise QuantizationError(
                    "quantize: metric needs target_metric (the value to reach), or promote=False to only report it"
                )
            if self.target_metric is not None and (
                isinstance(self.target_metric, bool) or not isinstance(self.target_metric, (int, float))
            ):
                raise QuantizationError(f"quantize: target_metric must be a number, got {self.target_metric!r}")
        if self.target_agreement is not None and not 0.0 < float(self.target_agreement) <= 1.0:
            raise QuantizationError(f"quantize: target_agreement must be in (0, 1], got {self.target_agreement!r}")
        if self.target_sqnr_db is not None and not isinstance(self.target_sqnr_db, (int, float)):
            raise QuantizationError(f"quantize: target_sqnr_db must be a number of dB, got {self.target_sqnr_db!r}")
        if self.latency_budget is not None:
            if (
                isinstance(self.latency_budget, bool)
                or not isinstance(self.latency_budget, (int, float))
                or not self.latency_budget > 0
            ):
                raise QuantizationError(
                    f"quantize: latency_budget must be a ratio > 0 of the float model's latency, e.g. 0.8, got {self.latency_budget!r}"
                )
            if not self.promote:
                raise QuantizationError("quantize: latency_budget needs promotion (it picks the promotions); drop promote=False")
        if not 0.0 <= float(self.max_float) <= 1.0:
            raise QuantizationError(f"quantize: max_float must be in [0, 1], got {self.max_float!r}")
        max_float_default = next(default_of(f) for f in dataclasses.fields(self) if f.name == "max_float")
        if not self.promote and self.max_float != max_float_default:
            raise QuantizationError(
                "quantize: max_float needs promotion (it bounds the nodes promoted to float); drop promote=False"
            )
        if self.symmetric and self.activations in ("uint8", "uint16"):
            signed = "int" + self.activations[4:]
            object.__setattr__(self, "activations", signed)
        object.__setattr__(self, "exclude", tuple(self.exclude))
        for algorithm in ALGORITHMS:
            if algorithm.validate is not None:
                algorithm.validate(self)

    @property
    def weight_type(self) -> ElementType:
        return element_type(self.weights)

    @property
    def activation_type(self) -> ElementType | None:
        return None if self.activations is None else element_type(self.activations)

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain values, enough to repeat the run."""
        values = {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in dataclasses.fields(self)}
        if values["metric"] is not None:
            values["metric"] = metric_name(values["metric"])  # a function given in Python, by name
        return values


# The core fields, then each registered algorithm's in the registry's order: an algorithm adds its options by
# registering them, with no line here.
QuantizeOptions = dataclasses.make_dataclass(
    "QuantizeOptions",
    [*_CORE_FIELDS, *(f for a in ALGORITHMS for f in a.fields)],
    bases=(_Checked,),
    frozen=True,
)
QuantizeOptions.__module__ = __name__  # pickled and shown as qlinear.quantize._options.QuantizeOptions
QuantizeOptions.__doc__ = (
    "The quantizer's settings: one field a flag of ``qlinear quantize`` (docs/reference/options.md lists them).\n\n"
    "Attributes:\n"
    + "".join(
        f"    {f.name}: {o.help.format(choices=', '.join(o.choices or ()), default=f.default)}\n"
        for f, o in option_fields(QuantizeOptions)
    )
)


def resolve(options: QuantizeOptions, facts: Facts, *, batch_size: int | None = None) -> QuantizeOptions:
    """``options`` with each algorithm the user left undecided (None) decided from ``facts``, and checked.

    ``batch_size``: the batch the model fixes, where it fixes one (ONNX
    Runtime runs it at no other). Raises QuantizationError where an
    algorithm that is on cannot run on this data, naming it.
    """
    decided: dict[str, Any] = {}
    if batch_size is not None and batch_size != options.batch_size:
        decided["batch_size"] = batch_size
    for algorithm in ALGORITHMS:
        if algorithm.default is not None and getattr(options, algorithm.name) is None:
            decided[algorithm.name] = algorithm.default(options, facts)
    resolved = dataclasses.replace(options, **decided) if decided else options
    for algorithm in ALGORITHMS:
        if algorithm.check is not None and algorithm.on(resolved):
            algorithm.check(resolved, facts)
    return resolved


def given(options: QuantizeOptions | None, values: dict[str, Any]) -> QuantizeOptions:
    """The options of a call: ``options`` with ``values`` (its fields as keywords) over them, or ``values`` alone."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(QuantizeOptions)})
    if unknown:
        raise QuantizationError(f"quantize: unknown options {', '.join(unknown)}; QuantizeOptions has no such fields")
    if options is None:
        return QuantizeOptions(**values)
    if not isinstance(options, QuantizeOptions):
        raise QuantizationError(f"quantize: options must be a QuantizeOptions, got {type(options).__name__}")
    return dataclasses.replace(options, **values) if values else options


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise QuantizationError(f"quantize: {name} must be one of {', '.join(allowed)}, got {value!r}")
