"""The memory a quantizer run took: this process's peak resident size."""

from __future__ import annotations

import resource

__all__ = ["peak_rss_bytes", "reset_peak_rss"]


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


def reset_peak_rss() -> bool:
    """Set this process's peak resident memory to its present size, where the system lets it (Linux 4.0 and later).

    False where it cannot: :func:`peak_rss_bytes` then stays the peak since
    the process started.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (proc(5))
        return True
    except OSError:
        return False
