"""What refining algorithms share: whether a refined model beats the one before it on the held-out data, and its figures."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Figures", "HeldOut", "better"]

Figures = tuple[float | None, float | None]  # (output SQNR dB, top-1 agreement) on the held-out data


def better(after: Figures, before: Figures) -> bool:
    """Higher output SQNR, and no lower agreement where there is one."""
    if after[0] is None or before[0] is None:
        return False
    if after[1] is not None and before[1] is not None and after[1] < before[1]:
        return False
    return after[0] > before[0]


@dataclass(frozen=True)
class HeldOut:
    """The held-out figures before and after a refinement (a record: the report writes its fields)."""

    sqnr_db_before: float | None
    sqnr_db_after: float | None
    agreement_before: float | None
    agreement_after: float | None

    @classmethod
    def of(cls, before: Figures, after: Figures) -> HeldOut:
        return cls(before[0], after[0], before[1], after[1])
