"""What refining algorithms share: whether a refined model beats the one before it on the held-out data, and its figures."""

from __future__ import annotations

from typing import Any

__all__ = ["Figures", "better", "figures_dict"]

Figures = tuple[float | None, float | None]  # (output SQNR dB, top-1 agreement) on the held-out data


def better(after: Figures, before: Figures) -> bool:
    """Higher output SQNR, and no lower agreement where there is one."""
    if after[0] is None or before[0] is None:
        return False
    if after[1] is not None and before[1] is not None and after[1] < before[1]:
        return False
    return after[0] > before[0]


def figures_dict(before: Figures, after: Figures) -> dict[str, Any]:
    """The held-out figures before and after, as the report gives them."""
    return {
        "sqnr_db_before": before[0],
        "sqnr_db_after": after[0],
        "agreement_before": before[1],
        "agreement_after": after[1],
    }
