"""The report's figures in words: dB, shares, targets, as the console, the HTML page and the warnings write them."""

from __future__ import annotations

from typing import Any

from qlinear.quantize.targets import TARGETS

__all__ = ["db_text", "figure_text", "runtime_name", "share_text"]


def runtime_name(report: Any, *, full: bool = False) -> str:
    """The name of the runtime the report's model was placed for: short, for the tables, or in full."""
    t = TARGETS.get(report.settings.target)  # a report of another qlinear's may name one this one lacks
    if t is None:
        return str(report.settings.target)
    return t.runtime if full else t.label


def db_text(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def share_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def figure_text(value: float | None, metric: str) -> str:
    if metric == "agreement":
        return f"top-1 agreement {share_text(value)}"
    if metric == "metric":
        return f"metric {'-' if value is None else f'{value:.4g}'}"
    if metric == "decisions":
        return f"decisions kept {share_text(value)}"
    return f"output SQNR {db_text(value)} dB"
