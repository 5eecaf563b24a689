"""The report's figures in words: dB, shares, targets, as the console, the HTML page and the warnings write them."""

from __future__ import annotations

__all__ = ["db_text", "figure_text", "share_text"]


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
