"""GPTQ: lower output error than rounding to nearest at the same bits, stored through the same codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qlinear
import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._choose import weight_params
from qlinear.quantize.algorithms.gptq import ROWS_A_COLUMN, gptq_conv_weight, gptq_weight

RNG = np.random.default_rng(5)


def _correlated_inputs(rows: int, k: int) -> np.ndarray:
    """Inputs whose channels are correlated, as a layer's inputs are (GPTQ gains nothing on white noise)."""
    mix = RNG.standard_normal((k, k)) * 0.4 + np.eye(k)
    return (RNG.standard_normal((rows, k)) @ mix).astype(np.float32)


def _dequantized(w, params, axis, block, t):
    codes = qlinear.quantize_linear(w, params.scale, params.zero_point, axis=axis, block_size=block, output_dtype=t)
    return qlinear.dequantize_linear(codes, params.scale, params.zero_point, axis=axis, block_size=block)


def _sqnr(ref, got):
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum())


@pytest.mark.parametrize("t", ["int4", "uint4", "int2", "int8"])
@pytest.mark.parametrize("granularity", ["blocked", "per-channel"])
@pytest.mark.parametrize("transposed", [False, True])
def test_gptq_lowers_the_output_error_and_keeps_its_codes(t, granularity, transposed):
    k, n = 96, 40
    x = _correlated_inputs(2000, k)
    w = (RNG.standard_normal((k, n)) * 0.1).astype(np.float32)
    gram = x.astype(np.float64).T @ x
    stored = w.T.copy() if transposed else w  # Gemm with transB keeps the weight as (N, K)
    layout = dict(
        granularity=granularity, channel_axis=0 if transposed else 1, reduction_axis=1 if transposed else 0, block_size=32
    )
    q, params, axis, block = gptq_weight(stored, gram, element_type(t), **layout)
    assert q.shape == stored.shape and q.dtype == np.float32
    # Quantizing GPTQ's weight again with its parameters gives it back: the model stores those codes.
    np.testing.assert_array_equal(_dequantized(q, params, axis, block, t), q)
    rtn_params, rtn_axis, rtn_block = weight_params(stored, element_type(t), clip="minmax", **layout)
    rtn = _dequantized(stored, rtn_params, rtn_axis, rtn_block, t)
    as_kn = (lambda a: a.T) if transposed else (lambda a: a)
    ref = x @ w
    gain = _sqnr(ref, x @ as_kn(q)) - _sqnr(ref, x @ as_kn(rtn))
    # At 2 bits the rows' errors are as large as the weights, and spreading them gains less.
    assert gain > (0.3 if t == "int2" else 1.0), gain


@pytest.mark.parametrize("granularity", ["blocked", "per-channel"])
def test_gptq_takes_the_clipped_ranges_weight_clip_mse_asks_for(granularity):
    k, n = 128, 48
    rng = np.random.default_rng(11)  # its own draws, whatever ran before
    x = (rng.standard_normal((2000, k)) @ (rng.standard_normal((k, k)) * 0.4 + np.eye(k))).astype(np.float32)
    w = rng.laplace(0, 0.05, (k, n)).astype(np.float32)  # heavy tails: the min-max range wastes int4's levels
    gram = x.astype(np.float64).T @ x
    layout = dict(granularity=granularity, channel_axis=1, reduction_axis=0, block_size=32)
    t = element_type("int4")
    q_minmax, p_minmax, *_ = gptq_weight(w, gram, t, **layout)
    q_mse, p_mse, axis, block = gptq_weight(w, gram, t, **layout, clip="mse")
    np.testing.assert_array_equal(_dequantized(q_mse, p_mse, axis, block, "int4"), q_mse)  # still its own codes
    assert (p_mse.scale < p_minmax.scale).sum() > p_mse.scale.size // 2  # most ranges clipped
    ref = x @ w
    assert _sqnr(ref, x @ q_mse) > _sqnr(ref, x @ q_minmax) + 0.5
    # The least-error scales and zero points (--weight-clip search) too: their own codes, and not min-max's ranges.
    q_search, p_search, axis, block = gptq_weight(w, gram, t, **layout, clip="search")
    np.testing.assert_array_equal(_dequantized(q_search, p_search, axis, block, "int4"), q_search)
    assert not np.array_equal(p_search.scale, p_minmax.scale) and _sqnr(ref, x @ q_search) > _sqnr(ref, x @ q_minmax)


def test_gptq_is_not_used_where_it_does_not_apply():
    gram = np.eye(8)
    w = np.ones((8, 4), np.float32)
    assert (
        gptq_weight(w, gram, element_type("float8e4m3fn"), granularity="blocked", channel_axis=1, reduction_axis=0, block_size=4)
        is None
    )
    assert (
        gptq_weight(w, gram, element_type("int4"), granularity="per-tensor", channel_axis=1, reduction_axis=0, block_size=0)
        is None
    )
    assert (
        gptq_weight(w, np.eye(3), element_type("int4"), granularity="blocked", channel_axis=1, reduction_axis=0, block_size=4)
        is None
    )


def _two_layers(k: int, n: int = 32) -> qo.Graph:
    """x (N, 5, k) -> MatMul to n -> MatMul to 10 outputs, weights drawn from the module's RNG."""
    g = qo.Graph("gptq", opset=17)
    x = g.input("x", "float", ("N", 5, k))
    h = g.op("MatMul", [x, (RNG.standard_normal((k, n)) * 0.2).astype(np.float32)], name="layer")
    g.output(g.op("MatMul", [h, (RNG.standard_normal((n, 10)) * 0.2).astype(np.float32)], name="head", output_names=["y"]))
    return g


def test_gptq_in_the_quantizer_lowers_the_models_error():
    k = 64
    g = _two_layers(k)
    data = {"x": _correlated_inputs(400 * 5, k).reshape(400, 5, k)}
    settings = dict(weights="int4", granularity="blocked", activations=None, promote=False, bias_correction=False)
    rtn = qq.quantize_model(g.to_model(), None, data, eval=data, gptq=False, **settings).report
    gptq = qq.quantize_model(g.to_model(), None, data, eval=data, gptq=True, **settings).report
    assert gptq.settings.gptq and gptq.output.sqnr_db > rtn.output.sqnr_db + 1.0
    assert gptq.nodes[0].runs_as == rtn.nodes[0].runs_as  # the same layout, only other codes


def _correlated_images(n: int, channels: int, size: int) -> np.ndarray:
    """Images whose channels mix and whose neighbouring pixels are alike, as a Conv's inputs are."""
    x = RNG.standard_normal((n, channels, size + 2, size + 2))
    smooth = (x[:, :, :-2, :-2] + x[:, :, 1:-1, 1:-1] * 2 + x[:, :, 2:, 2:]) / 4
    mix = RNG.standard_normal((channels, channels)) * 0.5 + np.eye(channels)
    return np.einsum("nchw,cd->ndhw", smooth, mix).astype(np.float32)


@pytest.mark.parametrize("t", ["int8", "int4"])
@pytest.mark.parametrize("groups", [1, 2, 8])  # 8: depthwise
def test_gptq_of_a_conv_lowers_its_output_error_and_keeps_its_codes(t, groups):
    from qlinear.quantize._patches import Patches, patch_gram

    channels, filters = 8, 16
    x = _correlated_images(64, channels, 10)
    w = (RNG.standard_normal((filters, channels // groups, 3, 3)) * 0.2).astype(np.float32)
    gram, _ = patch_gram(x, Patches("x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), groups))
    q, params, axis, block = gptq_conv_weight(w, gram, element_type(t))
    assert q.shape == w.shape and (axis, block) == (0, 0) and params.scale.shape == (filters,)
    np.testing.assert_array_equal(_dequantized(q, params, 0, 0, t), q)
    rtn_params, *_ = weight_params(
        w, element_type(t), granularity="per-channel", channel_axis=0, reduction_axis=1, block_size=0, clip="minmax"
    )
    rtn = _dequantized(w, rtn_params, 0, 0, t)

    def conv(weight):  # torch's convolution: the oracle of what the layer outputs
        return torch.nn.functional.conv2d(
            torch.from_numpy(x).double(), torch.from_numpy(weight).double(), padding=1, groups=groups
        ).numpy()

    ref = conv(w)
    gain = _sqnr(ref, conv(q)) - _sqnr(ref, conv(rtn))
    # A depthwise filter has 9 weights to spread its errors over; a dense one 9 x its channels.
    assert gain > (0.3 if groups == channels else 1.0), gain


def test_gptq_of_a_conv_refuses_what_it_does_not_take():
    w = np.ones((4, 2, 3, 3), np.float32)
    assert gptq_conv_weight(w, np.eye(9)[None], element_type("int8")) is None  # a Gram matrix of another width
    assert gptq_conv_weight(w, np.stack([np.eye(18)] * 3), element_type("int8")) is None  # 4 filters in 3 groups
    assert gptq_conv_weight(w, np.stack([np.eye(18)] * 2), element_type("float8e4m3fn")) is None


def _conv_model():
    g = qo.Graph("gptq_conv", opset=17)
    x = g.input("x", "float", ("N", 8, 10, 10))
    h = g.op("Conv", [x, (RNG.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)], name="conv", pads=[1, 1, 1, 1])
    h = g.op("Conv", [h, (RNG.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32)], name="dw", group=16, pads=[1, 1, 1, 1])
    g.output(g.op("Conv", [h, (RNG.standard_normal((4, 16, 1, 1)) * 0.2).astype(np.float32)], name="head", output_names=["y"]))
    return g.to_model(), {"x": _correlated_images(96, 8, 10)}


def test_gptq_in_the_quantizer_rounds_convs_and_its_statistics_are_saved(tmp_path):
    model, data = _conv_model()
    settings = dict(weights="int4", activations=None, promote=False, bias_correction=False)
    rtn = qq.quantize_model(model, None, data, eval=data, gptq=False, **settings).report
    saved = tmp_path / "stats.npz"
    direct = qq.quantize_model(model, None, data, eval=data, gptq=True, save_stats_to=saved, **settings)
    assert direct.report.settings.gptq and direct.report.output.sqnr_db > rtn.output.sqnr_db + 1.0
    assert [n.runs_as for n in direct.report.nodes] == [n.runs_as for n in rtn.nodes]  # the same layout, only other codes
    # The patches' Gram matrices travel in the saved statistics: quantizing from them gives the same model.
    again = qq.quantize_model(model, None, None, eval=data, stats=saved, gptq=True, **settings)
    assert again.model.SerializeToString(deterministic=True) == direct.model.SerializeToString(deterministic=True)
    without = tmp_path / "without.npz"
    # Statistics saved by a run that calibrated only its bias correction's means hold no Gram matrix.
    qq.quantize_model(model, None, data, eval=data, gptq=False, save_stats_to=without, **{**settings, "bias_correction": True})
    with pytest.raises(QuantizationError, match="GPTQ needs the Gram matrices"):
        qq.quantize_model(model, None, None, eval=data, stats=without, gptq=True, **settings)


def test_gptq_leaves_a_layer_whose_gram_matrix_sums_too_few_rows_to_nearest():
    # A squeeze-and-excitation Conv sees one position a sample: 100 rows for 64 columns would fit the calibration
    # samples, not the layer (ROWS_A_COLUMN).
    g = qo.Graph("se", opset=17)
    x = g.input("x", "float", ("N", 64, 1, 1))
    g.output(g.op("Conv", [x, (RNG.standard_normal((16, 64, 1, 1)) * 0.2).astype(np.float32)], name="se", output_names=["y"]))
    data = {"x": _correlated_images(100, 64, 1)}
    settings = dict(weights="int4", activations=None, promote=False, bias_correction=False)
    rtn = qq.quantize_model(g.to_model(), None, data, gptq=False, **settings).model
    gptq = qq.quantize_model(g.to_model(), None, data, gptq=True, **settings).model
    assert gptq.SerializeToString(deterministic=True) == rtn.SerializeToString(deterministic=True)
    assert ROWS_A_COLUMN * 64 > 100


def test_gptq_leaves_convs_to_nearest_where_bias_correction_is_on():
    # Bias correction's channel means would move GPTQ's errors on kernel positions that read padding into the bias.
    model, data = _conv_model()
    settings = dict(weights="int4", activations=None, promote=False, bias_correction=True)
    rtn = qq.quantize_model(model, None, data, gptq=False, **settings).model
    gptq = qq.quantize_model(model, None, data, gptq=True, **settings).model
    assert gptq.SerializeToString(deterministic=True) == rtn.SerializeToString(deterministic=True)


def test_gptq_rounds_each_weight_once_a_run_however_many_models_the_search_builds(monkeypatch):
    import qlinear.quantize.algorithms.gptq as gptq_module
    from qlinear.quantize._build import ModelBuilder

    k = 64
    g = _two_layers(k)
    data = {"x": _correlated_inputs(200 * 5, k).reshape(200, 5, k)}
    settings = dict(weights="int4", granularity="blocked", activations=None, bias_correction=False, gptq=True)
    calls = []
    real = gptq_module.gptq_weight
    monkeypatch.setattr(gptq_module, "gptq_weight", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    builds = []
    real_build = ModelBuilder.build
    monkeypatch.setattr(ModelBuilder, "build", lambda self, *a, **kw: builds.append(self) or real_build(self, *a, **kw))
    r = qq.quantize_model(g.to_model(), None, data, target_sqnr_db=80.0, **settings)  # promotions: many builds
    # Each of the two weights once at each type the search gives it (int4, then int8), however many builds.
    assert len(builds) > 4 and len(calls) <= 4
    # What is kept is the codes (a byte each), not a float copy of each weight at each type.
    kept = [codes for rounded in builds[0]._rounded.values() if rounded is not None for codes in rounded[:1]]
    assert kept and all(codes.dtype.itemsize == 1 for codes in kept)
    # The same model as rounding anew at each build, which rounds more often.
    calls.clear()
    rounded_anew = ModelBuilder.__init__

    def fresh(self, *a, **kw):
        rounded_anew(self, *a, **kw)
        self._rounded = _Forgetting()

    monkeypatch.setattr(ModelBuilder, "__init__", fresh)
    again = qq.quantize_model(g.to_model(), None, data, target_sqnr_db=80.0, **settings)
    assert r.model.SerializeToString() == again.model.SerializeToString() and len(calls) > 4


class _Forgetting(dict):
    """A cache that keeps nothing: every build rounds again."""

    def __setitem__(self, key, value) -> None:
        pass

    def __contains__(self, key) -> bool:
        return False

    def __getitem__(self, key):
        raise KeyError(key)
