"""AWQ: scale up the weight rows that meet large inputs before rounding them, for low-bit weight-only layers.

A weight row ``j`` meets input channel ``j``; where that channel's values
are large (the salient channels), the row's rounding error costs the output
most. Multiplying the row by ``s_j > 1`` (and the input by ``1 / s_j``, a
``Mul`` after the activation, the same rewrite as SmoothQuant) makes its
error relatively smaller at the cost of the other rows in its scale group
(Lin et al., "AWQ", 2023). ``s = mean|x|^alpha``, normalized so that
``max(s) min(s) = 1``, with ``alpha`` searched per activation on 0, 0.1,
..., 1 by the output error of the layers with their weights quantized as
asked (activations float) on a sample of the calibration inputs; alpha 0
is no scaling, so the search never makes the sample worse.
"""

from __future__ import annotations

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType, element_type
from qlinear.quantize._choose import scale_and_zero_point, symmetric_weights
from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel, index
from qlinear.quantize._option_fields import option
from qlinear.quantize.algorithms._channel_scaling import ScaledActivation, observe, rewrite, rows_first, sites
from qlinear.quantize.algorithms._registry import Algorithm, Facts, register
from qlinear.quantize.targets import Target, target

__all__ = ["ALPHAS", "scale_for_weights"]

ALPHAS = tuple(k / 10 for k in range(1, 11))
SAMPLE_ROWS = 1024


def scale_for_weights(
    fm: FloatModel,
    data: Dataset,
    *,
    batch_size: int,
    excluded: set[str],
    weights: str,
    block_size: int,
    runtime: Target,
    weights_per_tensor: bool = False,
) -> list[ScaledActivation]:
    """Scale every MatMul/Gemm activation's channels for its layers' ``weights`` (``fm`` rewritten in place).

    ``block_size``: the weights' blocks along the input channels (0: one
    scale per output channel). ``weights_per_tensor``: one scale a weight,
    so the division goes into no layer's weight (see :func:`rewrite`).
    ``runtime``: the target the activations are observed on.
    """
    wt = element_type(weights)
    if not wt.is_integer:
        return []
    found = sites(fm, excluded)
    if not found:
        return []
    _, absmean, rows = observe(fm, list(found), data, batch_size, SAMPLE_ROWS, runtime)
    done = []
    for tensor, nodes in found.items():
        if tensor not in absmean:
            continue
        layer_weights = [rows_first(fm, n) for n in nodes]
        x = rows[tensor].astype(np.float64)
        refs = [x @ w for w in layer_weights]
        plain = _error(x, layer_weights, refs, np.ones(x.shape[1]), wt, block_size)
        best_alpha, best = None, plain
        for alpha in ALPHAS:
            err = _error(x, layer_weights, refs, _scales(absmean[tensor], alpha), wt, block_size)
            if err < best:
                best_alpha, best = alpha, err
        done.append(ScaledActivation(tensor, tuple(n.name for n in nodes), best_alpha, plain, best))
        if best_alpha is not None:
            rewrite(fm, tensor, nodes, _scales(absmean[tensor], best_alpha), "AWQ", into_weights=not weights_per_tensor)
    index(fm)
    return done


def _scales(absmean: np.ndarray, alpha: float) -> np.ndarray:
    s = np.power(np.maximum(absmean.astype(np.float64), 1e-4), alpha)
    return s / np.sqrt(s.max() * s.min())


def _error(x: np.ndarray, weights: list[np.ndarray], refs: list[np.ndarray], s: np.ndarray, wt: ElementType, block: int) -> float:
    """Squared output error of the layers with ``s W`` quantized as ``wt`` (blocks along the rows) and ``x / s`` exact."""
    total = 0.0
    for w, ref in zip(weights, refs, strict=True):
        ws = w * s[:, None]
        back = _round_trip(ws, wt, block) / s[:, None]
        total += float(((x @ back - ref) ** 2).sum())
    return total


def _round_trip(w: np.ndarray, t: ElementType, block: int) -> np.ndarray:
    """``w`` (K, N) through ``t``: blocks of ``block`` rows per column, or one scale per column."""
    k, n = w.shape
    b = block or k
    pad = -k % b
    groups = np.concatenate([w, np.zeros((pad, n))]).reshape(-1, b, n)  # (blocks, b, N)
    scale, zp = scale_and_zero_point(groups.min(axis=1), groups.max(axis=1), t, symmetric_weights(t, weight_only=True))
    scale, zp = scale[:, None, :].astype(np.float64), zp[:, None, :]
    q = (np.clip(np.rint(groups / scale) + zp, t.qmin, t.qmax) - zp) * scale
    return q.reshape(-1, n)[:k]


def _default(options, facts: Facts) -> bool:
    low_bits = options.weight_type.is_integer and options.weight_type.bits <= 4
    return facts.has_inputs and low_bits and options.activations is None and facts.arrays


def _check(options, facts: Facts) -> None:
    if options.activations is not None:
        raise QuantizationError("quantize: awq scales weight-only layers; with quantized activations use smoothquant")
    if not facts.arrays or not facts.has_inputs:
        raise QuantizationError("quantize: awq reads the calibration data twice; give arrays or an .npz (not a stream or stats)")


def _apply(fm: FloatModel, options, data: Dataset, bars) -> list[ScaledActivation]:
    with bars.task("scaling weights (AWQ)", 1) as step:
        done = scale_for_weights(
            fm, data, batch_size=options.batch_size, excluded=set(options.exclude), weights=options.weights,
            block_size=options.block_size, weights_per_tensor=options.granularity == "per-tensor",
            runtime=target(options.target),
        )  # fmt: skip
        step(1)
    return done


ALGORITHM = register(
    Algorithm(
        name="awq",
        summary="weight-only: scale up the weight rows that meet large inputs before rounding (alpha searched per activation)",
        stage="float",
        fields=(
            (
                "awq",
                bool | None,
                option(
                    None,
                    group="algorithms",
                    form="either",
                    help="scale up weight rows that meet large inputs before rounding (default: on for 2/4-bit weight-only "
                    "with calibration arrays)",
                ),
            ),
        ),
        default=_default,
        check=_check,
        apply=_apply,
    )
)
