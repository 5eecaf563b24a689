"""The report's types: what ``QuantizeResult.report`` holds, written as JSON and read back from it.

Each part is a record (:mod:`qlinear.quantize._records`): its attribute
names are the JSON keys (``from`` is ``PromotionStep.from_``), so
``report.output.sqnr_db`` in Python is ``output.sqnr_db`` in the JSON and
in docs/reference/report.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from qlinear._errors import QuantizationError
from qlinear.quantize._latency import Latency
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._profile import StageTime
from qlinear.quantize._records import from_plain, plain
from qlinear.quantize._report_text import share_text
from qlinear.quantize._run_settings import RunSetting
from qlinear.quantize._speed import Floated
from qlinear.quantize._tradeoff import Candidate
from qlinear.quantize.algorithms import ALGORITHMS
from qlinear.quantize.algorithms._channel_scaling import ScaledActivation
from qlinear.quantize.algorithms.equalize import Equalized
from qlinear.quantize.algorithms.finetune import FinetuneResult

__all__ = [
    "BeforeAfter",
    "CalibrationSummary",
    "CosineFigures",
    "Decision",
    "EvalSummary",
    "FusionSummary",
    "Interval",
    "LeftFloat",
    "MetricFigure",
    "ModelFiles",
    "NodeAnalysis",
    "NodeRow",
    "OutputFigures",
    "PromotionStep",
    "Promotions",
    "Report",
    "Requested",
    "Settings",
    "TargetSpec",
    "Widened",
    "algorithm_results",
]


def _settings_fields() -> list[tuple[str, Any, Any]]:
    """Each option's field as the report holds it (its plain value, as ``QuantizeOptions.to_dict`` gives it)."""
    out = []
    for f in dataclasses.fields(QuantizeOptions):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        default = list(default) if isinstance(default, tuple) else default
        out.append((f.name, Any, field(default_factory=lambda d=default: d)))
    return out


# The run's options, one attribute each (the options' own names and defaults), the opset the one the model was
# written at (the option's None, the lowest its types need, resolved).
Settings = dataclasses.make_dataclass("Settings", _settings_fields(), frozen=True)
Settings.__module__ = __name__
Settings.__doc__ = "The run's options as plain values (``QuantizeOptions.to_dict()``), ``opset`` the one written."


@dataclass(frozen=True)
class ModelFiles:
    input: str  # the float model's path, or "<ModelProto>"
    output: str | None  # None: not written


@dataclass(frozen=True)
class BeforeAfter:
    before: Any
    after: Any


@dataclass(frozen=True)
class Decision:
    """What a user decides on: faster than float at every batch timed, the target met, and the line that says so."""

    faster: bool | None  # None: not timed
    target_met: bool | None  # None: no target
    line: str


@dataclass(frozen=True)
class CalibrationSummary:
    method: str | None  # None: weight-only
    source: str | None
    batches: int
    batch_size: int  # cut below --batch-size where a batch's tensors are large
    samples: int
    seconds: float
    peak_rss_bytes: int
    from_stats: str | None = None
    batch_fixed_by: str | None = None  # the input whose fixed batch dimension set the batch, if one did


@dataclass(frozen=True)
class EvalSummary:
    source: str | None
    samples: int
    backend: str
    onnxruntime_error: str | None = None


@dataclass(frozen=True)
class Interval:
    """The top-1 agreement's 95% Wilson interval and the decisions it was measured on."""

    low: float
    high: float
    decisions: int


@dataclass(frozen=True)
class MetricFigure:
    name: str
    value: float | None


@dataclass(frozen=True)
class CosineFigures:
    """An embedding's vectors against the float model's, sample by sample: the mean and the lowest cosine similarity."""

    mean: float
    lowest: float


@dataclass(frozen=True)
class OutputFigures:
    sqnr_db: float | None  # None: exact (JSON has no infinity)
    sqnr_db_parts: list[float | None] | None = None
    sqnr_db_outputs: dict[str, float | None] | None = None  # each judged output's, where there are several
    top1_agreement: float | None = None
    top1_agreement_interval: Interval | None = None
    accuracy: BeforeAfter | None = None
    metric: MetricFigure | None = None
    decisions_kept: float | None = None
    detections_kept: float | None = None
    cosine_similarity: CosineFigures | None = None


@dataclass(frozen=True)
class FusionSummary:
    checked: bool
    unfused: list[str] = field(default_factory=list)
    float_by_design: dict[str, str] = field(default_factory=dict)  # unfused nodes without an integer kernel, and why
    qdq_nodes_left: int | None = None
    integer_gates: list[str] = field(default_factory=list)  # gates written for integer kernels


@dataclass(frozen=True)
class NodeRow:
    """One node the plan quantizes, as the model holds it."""

    name: str
    op_type: str
    weight_type: str | None
    activation_type: str | None
    weight_sqnr_db: float | None
    output_sqnr_db: float | None
    sensitivity_db: float | None = None
    activation_sqnr_db: float | None = None
    fused: bool | None = None
    runs_as: str | None = None
    bias_int32: bool = False
    bias_corrected: bool = False
    weight_bytes: BeforeAfter | None = None


@dataclass(frozen=True)
class NodeAnalysis:
    """One node's sensitivity: the output SQNR with only it quantized, and its weight's and input's own."""

    name: str
    sensitivity_db: float | None
    weight_sqnr_db: float | None
    activation_sqnr_db: float | None


@dataclass(frozen=True)
class Requested:
    """The figures at the types asked for, before any promotion."""

    sqnr_db: float | None = None
    top1_agreement: float | None = None


@dataclass(frozen=True)
class TargetSpec:
    metric: str
    value: float
    text: str | None = None  # None: a report saved before it held its text

    def describe(self) -> str:
        if self.text is not None:
            return self.text
        return (
            f"top-1 agreement >= {share_text(self.value)}" if self.metric == "agreement" else f"output SQNR >= {self.value:g} dB"
        )


@dataclass(frozen=True)
class PromotionStep:
    node: str
    from_: str = field(metadata={"key": "from"})
    to: str = ""
    figure_after: float | None = None  # None: not measured at this step
    predicted_cost: float | None = None  # the node's cost in float, a share of a run as asked (the profiles')


@dataclass(frozen=True)
class Promotions:
    target: TargetSpec
    met: bool
    before: float | None
    after: float | None
    evaluations: int
    steps: list[PromotionStep] = field(default_factory=list)
    order: str = "sensitivity"  # the list searched: "sensitivity" (most sensitive first) or "cost" (cheapest first)


@dataclass(frozen=True)
class LeftFloat:
    name: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class Widened:
    """A lookup table stored wider than asked, because the runtime reads no narrower one."""

    name: str
    asked: str
    stored: str
    reason: str


# The report's required parts: JSON without them is not a report.
_REQUIRED = ("model", "settings", "size_bytes", "output", "nodes")


@dataclass(frozen=True)
class Report:
    """What one run did and measured; :meth:`to_json` writes it, :meth:`from_json` reads it back.

    docs/reference/report.md describes every attribute.
    """

    model: ModelFiles
    settings: Settings  # type: ignore[valid-type]
    data_flags: list[str] | None  # None: a report saved before it held them
    size_bytes: BeforeAfter
    decision: Decision | None
    latency_ms: list[Latency]
    tradeoff: list[Candidate]
    float_where_faster: list[Floated]
    calibration: CalibrationSummary
    eval: EvalSummary
    output: OutputFigures
    fusion: FusionSummary
    nodes: list[NodeRow]
    analysis: list[NodeAnalysis] = field(default_factory=list)
    requested: Requested = field(default_factory=Requested)
    promotions: Promotions | None = None
    run_settings: list[RunSetting] = field(default_factory=list)  # the runtime's settings tried for speed
    smoothquant: list[ScaledActivation] = field(default_factory=list)
    awq: list[ScaledActivation] = field(default_factory=list)
    equalized: list[Equalized] = field(default_factory=list)
    left_float: list[LeftFloat] = field(default_factory=list)
    widened: list[Widened] = field(default_factory=list)
    finetune: FinetuneResult | None = None
    # Every other algorithm that ran, its result under its name (the registry's ``result`` record).
    algorithms: dict[str, Any] = field(default_factory=dict, metadata={"flatten": True, "extra": True})
    warnings: list[str] = field(default_factory=list)
    profile: list[StageTime] = field(default_factory=list)  # each stage's wall time and peak memory, in order

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able values (an exact SQNR is still ``inf`` here)."""
        return plain(self)

    def to_json(self) -> str:
        """The report as strict JSON (an infinite SQNR, which no JSON number holds, is written as null)."""
        return json.dumps(_strict(self.to_dict()), indent=2)

    @classmethod
    def from_dict(cls, data: Any) -> Report:
        """The report ``to_dict`` gave, or a report an older qlinear saved; raises QuantizationError where it is not one."""
        missing = [k for k in _REQUIRED if not isinstance(data, dict) or k not in data]
        if missing:
            raise QuantizationError(f"not a qlinear quantize report: it lacks {', '.join(missing)}")
        data = dict(data)
        if isinstance(data.get("latency_ms"), dict):  # saved when one batch was timed: its ratio computed
            one = data["latency_ms"]
            data["latency_ms"] = [{**one, "ratio": one["after"] / one["before"]}]
        for key in ("latency_ms", "tradeoff", "float_where_faster", "run_settings"):
            data[key] = data.get(key) or []
        # Saved when the trade-off was timed at one batch: each row's latency an object, not a list of them.
        data["tradeoff"] = [_batches_listed(row) for row in data["tradeoff"]]
        try:
            extra = {name: from_plain(record, data[name]) for name, record in _RESULTS.items() if data.get(name) is not None}
            return dataclasses.replace(from_plain(cls, data), algorithms=extra)
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # a part of the wrong shape
            raise QuantizationError(f"not a qlinear quantize report: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> Report:
        """The report read back from its JSON; raises QuantizationError where it is not one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise QuantizationError(f"the report is not JSON: {e}") from None
        return cls.from_dict(data)

    def __getitem__(self, key: str) -> Any:
        """The JSON's part ``key``: deprecated, read the attribute of the same name."""
        warnings.warn(f"report[{key!r}] is deprecated: the report is typed, read report.{key}", DeprecationWarning, stacklevel=2)
        return self.to_dict()[key]


# The algorithms whose results the report holds under their names: those that register a result record and have
# no attribute of their own (as finetune has).
_RESULTS = {
    a.name: a.result for a in ALGORITHMS if a.result is not None and a.name not in {f.name for f in dataclasses.fields(Report)}
}


def algorithm_results(done: dict[str, Any]) -> dict[str, Any]:
    """Of what each algorithm that ran gave, by name, the results ``Report.algorithms`` holds."""
    return {name: result for name, result in done.items() if name in _RESULTS}


def _batches_listed(row: Any) -> Any:
    """A trade-off row with its latency as a list over batches (an older report's one batch wrapped)."""
    if isinstance(row, dict) and isinstance(row.get("latency"), dict):
        return {**row, "latency": [row["latency"]]}
    return row


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value
