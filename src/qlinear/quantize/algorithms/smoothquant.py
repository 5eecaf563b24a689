"""SmoothQuant: move the outlier channels of a MatMul's or Gemm's input into its weight before quantizing both.

An activation with a few channels far larger than the rest loses the rest
under one per-tensor 8-bit scale. Dividing input channel ``j`` by ``s_j``
and multiplying the weight's row ``j`` by it leaves the product unchanged
(``x W = (x / s) (s W)``) and evens out the activation, while per-channel
weight scales absorb the larger rows (Xiao et al., "SmoothQuant", 2022):
``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)``.

Here the division is a ``Mul`` by ``1 / s`` inserted after the activation
(one for all the layers that read it, whose weights all take ``s``).
Only activations with outlier channels are smoothed (a channel's maximum
at least :data:`OUTLIER_RATIO` times the median channel's), and ``alpha``
is searched per activation: among 0.3-0.8 and no smoothing, the
one whose quantization (activation per tensor, weights per output channel,
at the types asked for) of the layers' output has the least squared error
on a sample of the calibration inputs, the activation's range taken from
one half of the sample and the error from the other (a large model's
wide layer: the error of a sample of its output channels, over their
share, :func:`_judged`). It rewrites the float model before the plan, from
a first pass over the calibration data that keeps each activation's
per-channel maximum and its first rows; the model's function is unchanged
up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._choose import scale_and_zero_point, symmetric_weights
from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel, index
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._channel_scaling import ScaledActivation, observe, rewrite, rows_first, sites
from qlinear.quantize.algorithms._registry import Algorithm, Facts, check_data_read_twice, register
from qlinear.quantize.targets import Target, target

__all__ = ["ALPHAS", "smooth"]

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
SAMPLE_ROWS = 1024  # calibration rows each activation keeps for the alpha search
# Smoothed only where some channel's largest value is this many times the median channel's: elsewhere the
# channels are alike, smoothing gains little, and its range rests on each channel's maximum, which a small
# calibration set estimates badly (held-out values then clip).
OUTLIER_RATIO = 4.0
_U8, _I8 = element_type("uint8"), element_type("int8")


def smooth(
    fm: FloatModel,
    data: Dataset,
    *,
    batch_size: int,
    excluded: set[str],
    weights: str = "int8",
    activations: str = "uint8",
    symmetric: bool = False,
    weights_per_tensor: bool = False,
    runtime: Target,
) -> list[ScaledActivation]:
    """Smooth every activation read by MatMul/Gemm layers with constant weights (``fm`` rewritten in place).

    ``weights_per_tensor``: the model's weights have one scale each, so the
    division by ``s`` goes into no layer's weight (see :func:`rewrite`).

    ``weights``/``activations``: the types the search simulates (integer
    weights per output channel, the activation per tensor, signed ones
    symmetric only with ``symmetric``, as the plan makes them). ``runtime``:
    the target the activations are observed on.
    """
    wt, at = element_type(weights), element_type(activations)
    if not (wt.is_integer and at.is_integer):
        wt, at = _I8, _U8
    elif at.qmin < 0 and not symmetric:  # asymmetric int8 has uint8's levels, shifted
        at = element_type("u" + activations)
    found = sites(fm, excluded)
    if not found:
        return []
    absmax, _, rows = observe(fm, list(found), data, batch_size, SAMPLE_ROWS, runtime)
    done = []
    for tensor, nodes in found.items():
        if tensor not in absmax or absmax[tensor].max() < OUTLIER_RATIO * max(float(np.median(absmax[tensor])), 1e-30):
            continue
        weights = [rows_first(fm, n) for n in nodes]
        best = _search(rows[tensor], absmax[tensor], weights, wt, at, sampled=fm.store is not None)
        done.append(ScaledActivation(tensor, tuple(n.name for n in nodes), *best))
        if best[0] is not None:
            rewrite(
                fm, tensor, nodes, _scales(absmax[tensor], weights, best[0]), "SmoothQuant", into_weights=not weights_per_tensor
            )
    index(fm)
    return done


def _scales(absmax: np.ndarray, weights: list[np.ndarray], alpha: float, wmax: np.ndarray | None = None) -> np.ndarray:
    """SmoothQuant's division of each input channel at ``alpha``; ``wmax``: the weights' largest magnitude a channel."""
    wmax = _weight_max(weights) if wmax is None else wmax
    s = np.power(np.maximum(absmax.astype(np.float64), 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    return np.where(np.isfinite(s) & (s > 0), s, 1.0)


def _weight_max(weights: list[np.ndarray]) -> np.ndarray:
    return np.max([np.abs(w).max(axis=1) for w in weights], axis=0)


def _search(x: np.ndarray, absmax: np.ndarray, weights: list[np.ndarray], wt, at, *,
            sampled: bool = False) -> tuple[float | None, float, float]:  # fmt: skip
    """``(alpha, error without, error with)``: the alpha of least simulated output error (None: none beats no smoothing).

    ``sampled`` (a large model's layers): a wide layer's error is that of a
    sample of its output channels (see :func:`_judged`); its scales come
    from all of them.
    """
    x = x.astype(np.float64)
    wmax = _weight_max(weights)  # each alpha's scales read it: once, not once an alpha (a pass over every weight)
    judged, shares = zip(*(_judged(w) if sampled else (w, 1.0) for w in weights), strict=True)
    refs = [x @ w for w in judged]
    plain = _error(x, judged, refs, np.ones(x.shape[1]), wt, at, shares)
    best_alpha, best = None, plain
    for alpha in ALPHAS:
        err = _error(x, judged, refs, _scales(absmax, weights, alpha, wmax), wt, at, shares)
        if err < best:
            best_alpha, best = alpha, err
    return best_alpha, plain, best


# Float64 elements of a large model's layer the alpha search simulates: a wider layer (an 8192 x 8192 one has 64M)
# is judged on evenly spaced output channels (1024 of its 8192). Each output channel's weights are quantized on their own and add
# their own error, so the sample's error, over its share of the channels, estimates the layer's, and every alpha is
# compared on the same sample. Simulated whole, each 8192 x 8192 layer took seven float64 passes of 512 MB an alpha
# (138 s of a 3 GB model's 169 s run).
_SIMULATED_ELEMENTS = 1 << 23


def _judged(w: np.ndarray) -> tuple[np.ndarray, float]:
    """``(w, 1.0)`` (a layer's rows first), or evenly spaced columns of it (output channels) of at most
    ``_SIMULATED_ELEMENTS`` and the share of its columns they are."""
    rows, cols = w.shape
    if rows * cols <= _SIMULATED_ELEMENTS:
        return w, 1.0
    keep = np.unique(np.linspace(0, cols - 1, max(1, _SIMULATED_ELEMENTS // rows)).round().astype(np.int64))
    return np.ascontiguousarray(w[:, keep]), keep.size / cols


def _error(x: np.ndarray, weights: Sequence[np.ndarray], refs: list[np.ndarray], s: np.ndarray, wt, at,
           shares: Sequence[float] | None = None) -> float:  # fmt: skip
    """Squared output error of the layers with ``x / s`` quantized as ``at`` and ``s W`` as ``wt``.

    ``shares``: the share of its layer's output channels each of ``weights``
    holds (a wide layer's sample, :func:`_judged`); its error counts for
    the layer's.

    Two-fold: the activation's range comes from the even rows and the error
    from the odd ones, then the other way round, so an alpha whose range
    holds only for the rows it was taken from (a smoothed activation's
    maximum rests on fewer values) pays for its clipping.
    """
    xs = x / s
    wq = []
    for w in weights:
        ws = w * s[:, None]
        wscale, wzp = scale_and_zero_point(ws.min(axis=0), ws.max(axis=0), wt, symmetric_weights(wt, weight_only=False))
        wq.append((np.clip(np.rint(ws / wscale) + wzp, wt.qmin, wt.qmax) - wzp) * wscale)
    folds = (slice(0, None, 2), slice(1, None, 2)) if xs.shape[0] > 1 else (slice(None), slice(None))
    total = 0.0
    for fit, test in (folds, folds[::-1]):
        scale, zp = scale_and_zero_point(np.array([xs[fit].min()]), np.array([xs[fit].max()]), at, at.qmin < 0)
        xq = (np.clip(np.rint(xs[test] / scale[0]) + zp[0], at.qmin, at.qmax) - zp[0]) * scale[0]
        for q, ref, share in zip(wq, refs, shares or [1.0] * len(wq), strict=True):
            error = float(((xq @ q - ref[test]) ** 2).sum())
            total += error if share == 1.0 else error / share
    return total


def _default(options, facts: Facts) -> bool:
    return facts.has_inputs and options.activations in ("uint8", "int8") and facts.arrays


def _check(options, facts: Facts) -> None:
    if options.activations is None:
        raise QuantizationError("quantize: smoothquant moves activation outliers into weights; it needs quantized activations")
    check_data_read_twice("smoothquant", facts)


def _apply(fm: FloatModel, options, data: Dataset, bars) -> list[ScaledActivation]:
    batches = data.batch_count(options.batch_size)
    with bars.task("smoothing", batches) as step:
        done = smooth(
            fm, data, batch_size=options.batch_size, excluded=set(options.exclude), weights=options.weights,
            activations=options.activations, symmetric=options.symmetric,
            weights_per_tensor=options.granularity == "per-tensor", runtime=target(options.target),
        )  # fmt: skip
        step(batches or 1)
    return done


ALGORITHM = register(
    Algorithm(
        name="smoothquant",
        summary="move outlier input channels of MatMul/Gemm layers into their weights (alpha searched per activation)",
        stage="float",
        fields=(
            (
                "smoothquant",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="move outlier input channels of MatMul/Gemm layers into their weights (default: on for 8-bit "
                    "activations with calibration arrays)",
                ),
            ),
        ),
        default=_default,
        check=_check,
        apply=_apply,
    )
)
