"""The report's figures in words: dB, shares, targets, as the console, the HTML page and the warnings write them."""

from __future__ import annotations

from typing import Any

from qlinear.quantize._promotion import TARGET_METRICS, TargetMetric
from qlinear.quantize.targets import TARGETS

__all__ = [
    "cosine_text", "cost_text", "db_text", "figure_text", "figure_value", "measure_rows", "order_text", "runtime_name",
    "share_text", "unloadable_text",
]  # fmt: skip


def runtime_name(report: Any, *, full: bool = False) -> str:
    """The name of the runtime the report's model was placed for: short, for the tables, or in full."""
    t = TARGETS.get(report.settings.target)  # a report of another qlinear's may name one this one lacks
    if t is None:
        return str(report.settings.target)
    return t.runtime if full else t.label


def order_text(order: str) -> str:
    """The promotion list's order (``promotions.order``) as the promotions table's title says it."""
    return "cheapest for the noise they remove first" if order == "cost" else "most sensitive node first"


def cost_text(value: float | None) -> str:
    """A step's predicted cost in float (``predicted_cost``, a share of a run as asked): ``+12.3%``, or ``-``."""
    return "-" if value is None else f"{value:+.1%}"


def db_text(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def share_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def figure_text(value: float | None, metric: str) -> str:
    """A figure of ``metric`` with its name: ``top-1 agreement 99.50%``, ``output SQNR 31.2 dB``."""
    return f"{_metric(metric).name} {figure_value(value, metric)}"


def figure_value(value: float | None, metric: str) -> str:
    """A figure of ``metric`` without its name: a share, a cosine, the user's number, or dB (None: exact SQNR)."""
    form = _metric(metric).form
    if form == "share":
        return share_text(value)
    if form == "number":
        return "-" if value is None else f"{value:.4g}"
    if form == "cosine":
        return cosine_text(value)
    return f"{db_text(value)} dB"


def _metric(metric: str) -> TargetMetric:
    """``metric``'s entry; one this qlinear lacks (a report of another's) reads as the output's SQNR."""
    return TARGET_METRICS.get(metric, TARGET_METRICS["sqnr"])


def cosine_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _share_row(metric: str, value: float) -> tuple[str, str]:
    kind = TARGET_METRICS[metric]
    return kind.name, f"{share_text(value)} ({kind.rule})"


def measure_rows(out: Any) -> list[tuple[str, str]]:
    """The report's rows for the measures beyond SQNR and agreement that ``out`` (its ``output`` figures) holds."""
    rows = []
    if out.decisions_kept is not None:
        rows.append(_share_row("decisions", out.decisions_kept))
    if out.detections_kept is not None:
        rows.append(_share_row("detections", out.detections_kept))
    if out.cosine_similarity is not None:
        cos = out.cosine_similarity
        rows.append(
            ("cosine similarity", f"{cosine_text(cos.mean)} mean, {cosine_text(cos.lowest)} lowest (each sample's vector)")
        )
    return rows


def unloadable_text(opening: str, error: str, options: Any, runtime: Any, backend: str) -> str:
    """What to do about a model ONNX Runtime cannot load: where it runs, and the flags that give one it loads.

    ``opening``: the words the warning starts with; ``runtime``: the target
    the model was placed for; ``backend``: what the evaluation ran on. Run
    on another target's runtime, the figures are that runtime's; else
    qlinear's kernels ran the Q/DQ nodes ONNX Runtime has no kernel for.
    """
    flags = []
    if not (options.weight_type.is_integer and options.weight_type.bits in (4, 8)):
        flags.append("--weights int8 (or int4)")
    if options.activation_type is not None and not options.activation_type.is_integer:
        flags.append("--activations uint8 (or int8)")
    fix = f"; for a model it loads, use {' and '.join(flags)}" if flags else ""
    if backend == runtime.backend != "onnxruntime":
        return f"{opening} ({error}): it runs on {runtime.runtime}, where its figures were measured{fix}"
    return (
        f"{opening} ({error}): the figures are qlinear's, its kernels running the "
        f"Q/DQ nodes between ONNX Runtime's (qlinear.onnx.run(model, feeds, backend='onnxruntime+qlinear')){fix}"
    )
