"""What a run cost, stage by stage: wall time and peak memory, as the report and ``--profile`` give them."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PartTime", "StageTime"]


@dataclass(frozen=True)
class PartTime:
    """A part of a stage that shows a progress bar of its own (``analysing nodes``), and its wall time."""

    name: str
    seconds: float


@dataclass(frozen=True)
class StageTime:
    """One stage of the run: its wall time and the process's peak resident memory while it ran.

    ``peak_rss_bytes`` is the peak since the stage began where the system
    lets a process reset its peak (Linux), else the peak since the process
    began (the report's ``profile`` says which in ``peak_since``).
    """

    stage: str
    seconds: float
    peak_rss_bytes: int
    peak_since: str = "stage"  # "stage" or "process"
    parts: list[PartTime] = field(default_factory=list)
