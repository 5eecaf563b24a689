"""How far an agreement measured on a few samples can be trusted: its 95% interval.

99% agreement on 100 held-out samples is one disagreement; the share the
model keeps on new data can well be 95%. The Wilson score interval (Wilson,
1927) holds its coverage for shares near 0 or 1 and small counts, where the
normal approximation gives an interval past 100%; it is what the report
gives beside every agreement.
"""

from __future__ import annotations

import math

__all__ = ["Z_95", "wilson_interval"]

Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95% interval


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a share ``successes / trials`` (two-sided 95% by default)."""
    if trials <= 0:
        raise ValueError(f"wilson_interval: trials must be > 0, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval: successes must be in [0, {trials}], got {successes}")
    p, z2 = successes / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)
