"""The agreement's 95% interval: Wilson's score interval, against published values and the score test it inverts."""

from __future__ import annotations

import math
from importlib import resources

import pytest

import qlinear.quantize as qq
from qlinear.quantize._interval import Z_95, wilson_interval

DEMO = resources.files("qlinear.quantize") / "_demo"


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    # Newcombe, "Two-sided confidence intervals for the single proportion", Statistics in Medicine 17 (1998),
    # Table I, method 3 (the score interval without continuity correction).
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_the_interval_matches_published_values(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize(("successes", "trials"), [(99, 100), (100, 100), (3, 7), (450, 450), (1, 1), (3498, 3500)])
def test_the_interval_is_where_the_score_test_does_not_reject(successes, trials):
    # Independently: the p whose score statistic |phat - p| / sqrt(p (1 - p) / n) is z, found by bisection.
    phat = successes / trials

    def statistic(p):
        return abs(phat - p) / math.sqrt(p * (1 - p) / trials) - Z_95

    def root(a, b):
        for _ in range(200):
            m = (a + b) / 2
            a, b = (m, b) if (statistic(a) > 0) == (statistic(m) > 0) else (a, m)
        return (a + b) / 2

    low = 0.0 if successes == 0 else root(1e-15, phat if phat < 1 else 1 - 1e-15)
    high = 1.0 if successes == trials else root(max(phat, 1e-15), 1 - 1e-15)
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=1e-9)


def test_the_interval_refuses_counts_that_are_no_share():
    with pytest.raises(ValueError, match="trials must be > 0"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"successes must be in \[0, 10\], got 11"):
        wilson_interval(11, 10)


def test_the_report_gives_the_agreement_with_its_interval():
    r = qq.quantize_model(
        str(DEMO / "digits_cnn.onnx"), None, str(DEMO / "digits_calibration.npz"), eval=str(DEMO / "digits_eval.npz"),
        labels="label", promote=False,
    ).report  # fmt: skip
    out = r.output
    interval = out.top1_agreement_interval
    assert interval.decisions == 450
    agree = round(out.top1_agreement * 450)
    assert (interval.low, interval.high) == wilson_interval(agree, 450)
    assert interval.low <= out.top1_agreement <= interval.high
