"""The memory a quantizer run took: this process's peak resident size, over the run and over each stage.

A stage's peak is read without touching the process's own peak (Linux's
``VmHWM``, ``ru_maxrss``): those are what a caller's measurement reads
(``/usr/bin/time``, a benchmark's own figure), and resetting them to
measure a stage left the caller the last stage's peak instead of the
run's. A stage that sets a new high for the process has that high as its
peak, exactly; otherwise its peak is the largest resident size sampled
while it ran (every :data:`SAMPLE_SECONDS`).
"""

from __future__ import annotations

import os
import resource
import threading
from types import TracebackType

__all__ = ["SAMPLE_SECONDS", "Peak", "peak_rss_bytes", "rss_bytes"]

# How often a stage's resident size is read while it runs: a peak shorter than this may be missed where it is not
# the process's new high.
SAMPLE_SECONDS = 0.005


def peak_rss_bytes() -> int:
    """This process's peak resident memory.

    Linux's ``VmHWM`` where there is one: ``ru_maxrss`` is carried across
    ``exec``, so a process started by a large one would report its parent's
    peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux's ``/proc/self/statm``); None where the system does not say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Peak:
    """The peak resident memory of this process while a ``with`` block runs, the process's own peak left alone.

    ``bytes``: the process's new high where the block set one, else the
    largest resident size sampled while it ran. ``since``: "stage" where
    that is the block's own peak, "process" where the system gives only
    the peak since the process began (no ``/proc``).
    """

    def __init__(self) -> None:
        self._high_before = 0
        self._sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bytes = 0
        self.since = "stage"

    def __enter__(self) -> Peak:
        self._high_before = peak_rss_bytes()
        now = rss_bytes()
        if now is None:
            self.since = "process"
            return self
        self._sampled = now
        self._thread = threading.Thread(target=self._sample, name="qlinear-peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            now = rss_bytes()
            if now is None:
                return
            self._sampled = max(self._sampled, now)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        high = peak_rss_bytes()
        if self.since == "process" or high > self._high_before:  # a new high: the block's own, exactly
            self.bytes = high
        else:
            self.bytes = max(self._sampled, rss_bytes() or 0)
