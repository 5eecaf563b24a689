"""A stage's peak memory is read without touching the process's own peak, which a caller's measurement reads."""

from __future__ import annotations

import time

import numpy as np
import pytest

import qlinear.quantize as qq
from qlinear.quantize._memory import Peak, peak_rss_bytes, rss_bytes
from quantize_models import gated_convs

linux = pytest.mark.skipif(rss_bytes() is None, reason="needs /proc/self/statm (Linux)")


@linux
def test_a_quantizer_run_leaves_the_process_peak_where_it_was():
    # The process's own high mark, set here above anything the small run below takes: a caller's /usr/bin/time or
    # benchmark reads it after the run, and must still find it.
    high = np.ones(512 << 20, np.uint8)
    high[::4096] = 2  # touched: resident
    mark = peak_rss_bytes()
    del high
    model, data = gated_convs("Sigmoid")
    r = qq.quantize_model(model, None, data, promote=False).report
    assert peak_rss_bytes() >= mark - (4 << 20)  # the kernel's counters are per thread, batched: a reading moves by KBs
    # Each stage's peak is its own, below the mark the process set before the run.
    assert all(0 < t.peak_rss_bytes < mark for t in r.profile) and {t.peak_since for t in r.profile} == {"stage"}
    assert 0 < r.calibration.peak_rss_bytes < mark


@linux
def test_a_peak_below_the_process_high_is_sampled_and_a_new_high_is_exact():
    before = rss_bytes()
    with Peak() as below:  # 64 MiB held for 0.1 s: far under the high mark the test above left
        held = np.ones(64 << 20, np.uint8)
        time.sleep(0.1)
        del held
    assert below.bytes >= before + (60 << 20) and below.since == "stage"
    with Peak() as above:  # past every earlier peak: the process's new high is the block's
        held = np.ones(peak_rss_bytes() - rss_bytes() + (96 << 20), np.uint8)
        del held
    assert abs(above.bytes - peak_rss_bytes()) < 4 << 20
