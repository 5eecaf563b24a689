"""A Conv's input patches and their Gram matrix, against torch's unfold (an independent im2col)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from qlinear.quantize import _patches
from qlinear.quantize._patches import ROWS_A_SAMPLE, Patches, patch_gram, patches_of

RNG = np.random.default_rng(11)


@pytest.fixture
def every_position(monkeypatch):
    """No sampling: every output position's patch is a row."""
    monkeypatch.setattr(_patches, "ROWS_A_SAMPLE", (10**6, 10**6))


def _unfolded_gram(x: np.ndarray, kernel, strides, pads, dilations, groups) -> tuple[np.ndarray, int]:
    """The Gram matrix of every patch, group by group, from torch's unfold of the zero-padded input, and its rows."""
    rank = len(kernel)
    padded = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[rank + i]) for i in range(rank))])
    if rank == 1:  # unfold takes 2-D images: a 1-D input is one row
        padded, kernel, strides, dilations = padded[:, :, None], (1, *kernel), (1, *strides), (1, *dilations)
    per_group = x.shape[1] // groups
    grams = []
    for g in range(groups):
        part = torch.from_numpy(padded[:, g * per_group : (g + 1) * per_group]).double()
        cols = torch.nn.functional.unfold(part, kernel, dilation=dilations, stride=strides)  # (N, K, positions)
        rows = cols.permute(0, 2, 1).reshape(-1, cols.shape[1]).numpy()
        grams.append(rows.T @ rows)
    return np.stack(grams), len(rows)


@pytest.mark.parametrize(
    "shape, kernel, strides, pads, dilations, groups",
    [
        ((2, 6, 9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
        ((2, 6, 9, 11), (3, 2), (2, 1), (0, 1, 2, 0), (2, 1), 2),  # uneven pads, strides and dilations
        ((2, 6, 9, 11), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 6),  # depthwise
        ((3, 4, 7, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
        ((2, 4, 13), (3,), (2,), (1, 0), (2,), 2),  # a Conv1d
    ],
)
def test_patch_gram_is_the_gram_matrix_of_every_patch(every_position, shape, kernel, strides, pads, dilations, groups):
    x = RNG.standard_normal(shape).astype(np.float32)
    got, rows = patch_gram(x, Patches("x", kernel, strides, pads, dilations, groups))
    want, positions = _unfolded_gram(x, kernel, strides, pads, dilations, groups)
    assert rows == positions
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # a float32 product of float32 inputs


@pytest.mark.parametrize("auto_pad, pads", [("SAME_UPPER", (1, 0, 1, 1)), ("SAME_LOWER", (1, 1, 1, 0)), ("VALID", (0,) * 4)])
def test_auto_pad_pads_as_onnx_says(every_position, auto_pad, pads):
    # 9 x 12 at stride 1 x 3, kernel 3 x 4: SAME gives 9 rows (padding 2, one each side) and ceil(12 / 3) = 4
    # columns, padding (4 - 1) x 3 + 4 - 12 = 1: at the end for SAME_UPPER, at the beginning for SAME_LOWER.
    x = RNG.standard_normal((2, 3, 9, 12)).astype(np.float32)
    node = onnx.helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, strides=[1, 3])
    patches = patches_of(node, (5, 3, 3, 4))
    assert patches.kernel == (3, 4) and patches.auto_pad == auto_pad
    want, _ = _unfolded_gram(x, (3, 4), (1, 3), pads, (1, 1), 1)
    np.testing.assert_allclose(patch_gram(x, patches)[0], want, rtol=1e-5, atol=1e-4)


def test_many_positions_are_sampled_the_same_way_every_time():
    # 64 x 64 positions a sample at K = 9: the rows a sample are bounded below, far fewer than the positions.
    x = RNG.standard_normal((2, 1, 64, 64)).astype(np.float32)
    patches = Patches("x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    got, rows = patch_gram(x, patches)
    assert rows == ROWS_A_SAMPLE[0] * 2
    np.testing.assert_array_equal(got, patch_gram(x.copy(), patches)[0])  # the same rows in any process
    full, _ = _unfolded_gram(x, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    share = ROWS_A_SAMPLE[0] * 2 / (2 * 64 * 64)
    # Each diagonal entry sums the squares of the sampled rows: the full sum's share, within sampling noise.
    np.testing.assert_allclose(np.diag(got[0]), np.diag(full[0]) * share, rtol=0.5)
    assert np.all(np.linalg.eigvalsh(got[0]) > -1e-6)


def test_patches_of_reads_onnx_defaults_and_names_the_shared_matrix():
    plain = patches_of(onnx.helper.make_node("Conv", ["x", "w"], ["y"]), (8, 4, 3, 3))
    assert plain == Patches("x", (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert plain.columns == 9
    other = patches_of(onnx.helper.make_node("Conv", ["x", "w2"], ["z"], pads=[1, 1, 1, 1]), (8, 4, 3, 3))
    assert plain.key != other.key and plain.key == patches_of(onnx.helper.make_node("Conv", ["x", "v"], ["u"]), (2, 4, 3, 3)).key
    assert patches_of(onnx.helper.make_node("MatMul", ["x", "w"], ["y"]), (4, 4)) is None
