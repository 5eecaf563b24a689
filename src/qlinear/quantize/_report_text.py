"""The report's figures in words: dB, shares, targets, as the console, the HTML page and the warnings write them."""

from __future__ import annotations

from typing import Any

__all__ = ["db_text", "figure_text", "latencies_of", "share_text", "target_text"]


def db_text(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def share_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def target_text(target: dict[str, Any]) -> str:
    """A report's target in words (a report saved before it held its text: from the metric and value)."""
    if "text" in target:
        return target["text"]
    value = target["value"]
    return f"top-1 agreement >= {share_text(value)}" if target["metric"] == "agreement" else f"output SQNR >= {value:g} dB"


def figure_text(value: float | None, metric: str) -> str:
    if metric == "agreement":
        return f"top-1 agreement {share_text(value)}"
    if metric == "metric":
        return f"metric {'-' if value is None else f'{value:.4g}'}"
    if metric == "decisions":
        return f"decisions kept {share_text(value)}"
    return f"output SQNR {db_text(value)} dB"


def latencies_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's timed batches (a report saved before it timed several: its one batch, its ratio computed)."""
    found = report.get("latency_ms") or []
    if isinstance(found, dict):
        found = [{**found, "ratio": found["after"] / found["before"]}]
    return found
