"""Calibration statistics: exact, mergeable, independent of how the values were batched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear._errors import QuantizationError
from qlinear.quantize import TensorStats
from qlinear.quantize._stats import load_stats, save_stats
from qlinear.quantize._sums import PARALLEL_VALUES


def _values(seed: int, n: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * scale + rng.uniform(-1, 1) * scale).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000), st.sampled_from([1e-6, 0.1, 3.0, 1e4, 3e30]), st.data())
def test_stats_merged_halves_equal_the_whole(seed, n, scale, data):
    x = _values(seed, n, scale)
    cut = data.draw(st.integers(0, n))
    whole = TensorStats.of(x)
    assert TensorStats.of(x[:cut]).merge(TensorStats.of(x[cut:])) == whole
    assert TensorStats.of(x[cut:]).merge(TensorStats.of(x[:cut])) == whole


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.one_of(st.integers(1, 3000), st.sampled_from([PARALLEL_VALUES, PARALLEL_VALUES + 3, 100_003])),
       st.sampled_from([1e-30, 1e-6, 0.1, 3.0, 1e4, 3e30]), st.sampled_from([np.float32, np.float64]))  # fmt: skip
def test_stats_bins_are_numpys_floor_and_bincount(seed, n, scale, dtype):
    # The oracle: each value scaled by the bins' width in its own type, floored, counted by numpy (from
    # PARALLEL_VALUES values on, counted on every core).
    x = _values(seed, n, scale).astype(dtype)
    s = TensorStats.of(x)
    index = np.floor(x * dtype(2.0**-s.exponent)).astype(np.int64) - s.first
    assert np.array_equal(s.counts, np.bincount(index, minlength=s.counts.size))
    assert s.counts.dtype == np.int64 and (s.min, s.max) == (x.min(), x.max())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 3000), st.sampled_from([np.float32, np.float64, np.float16]))
def test_output_power_sums_the_finite_reference_values_as_numpy_does(seed, n, dtype):
    from qlinear.quantize._output_power import Power

    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal(n) * 10).astype(dtype)
    ref[rng.random(n) < 0.05] = np.nan
    ref[rng.random(n) < 0.05] = np.inf
    got = (ref.astype(np.float64) + rng.standard_normal(n)).astype(np.float32)
    power = Power()
    for half in (slice(0, n // 2), slice(n // 2, n)):  # summed over two batches
        power.add(ref[half], got[half])
    r, g = ref.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(r)
    assert power.signal == pytest.approx(float((r[finite] ** 2).sum()), rel=1e-12, abs=0)
    assert power.noise == pytest.approx(float(((r[finite] - g[finite]) ** 2).sum()), rel=1e-12, abs=0)


def test_a_value_whose_scaled_float32_underflows_lands_in_the_last_bin():
    # The bins of [-3e38, -1e-30] are 2**117 wide: -1e-30 / 2**117 underflows to -0.0 in float32 and floors to 0,
    # one bin past the last (floor of a tiny negative value is -1). It is counted in the last bin, where it lies,
    # and nothing is written past the counts.
    x = np.array([-3e38, -1e-30, -1e-30], np.float32)
    s = TensorStats.of(x)
    assert np.floor(x[1] * np.float32(2.0**-s.exponent)) == 0 and s.first + s.counts.size - 1 == -1
    assert s.counts.sum() == 3 and s.counts[-1] == 2 and s.counts[0] == 1


def test_stats_do_not_depend_on_batching():
    x = np.concatenate([_values(1, 5000, 0.5), _values(2, 300, 40.0), [1e5, -7.0]]).astype(np.float32)
    whole = TensorStats.of(x)
    for batch in (1, 7, 64, 1000):
        merged = TensorStats.empty()
        for start in range(0, x.size, batch):
            merged = merged.merge(TensorStats.of(x[start : start + batch]))
        assert merged == whole


def test_stats_counts_min_max_and_bins_by_hand():
    s = TensorStats.of(np.array([0.0, 0.25, 1.0, -2.0, np.nan, np.inf], np.float32))
    assert (s.count, s.nonfinite, s.min, s.max) == (4, 2, -2.0, 1.0)
    # The narrowest power-of-two width covering [-2, 1] in MAX_BINS (2048) bins: 2**-9 (1536 bins); 2**-10 needs 3072.
    assert s.exponent == -9 and s.first == -1024 and s.counts.size == 1536 + 1
    assert s.counts.sum() == 4
    edges = s.edges
    for v in (0.0, 0.25, 1.0, -2.0):
        k = int(np.searchsorted(edges, v, side="right")) - 1
        assert s.counts[k] >= 1
    assert TensorStats.of(np.array([np.nan], np.float32)).count == 0


def test_stats_quantile_interpolates_within_bins():
    x = np.linspace(0, 1, 100001, dtype=np.float32)
    s = TensorStats.of(x)
    for q in (0.01, 0.5, 0.99, 0.9999):
        assert s.quantile(q) == pytest.approx(q, abs=2 * 2.0**s.exponent)
    assert s.quantile(1.0) == 1.0 and s.quantile(0.0) == 0.0


def test_stats_save_and_load(tmp_path):
    stats = {"a": TensorStats.of(_values(3, 100, 2.0)), "b/c:0": TensorStats.of(np.zeros(3, np.float32))}
    path = str(tmp_path / "s.npz")
    save_stats(stats, path, model_digest="abc")
    assert load_stats(path, model_digest="abc") == stats
    with pytest.raises(QuantizationError, match="another model"):
        load_stats(path, model_digest="xyz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(QuantizationError, match="cannot be read"):
        load_stats(str(tmp_path / "bad.npz"), model_digest="abc")
