"""The runtime's settings for a finished model, chosen by speed: each kept where the model runs faster and still meets the target.

A runtime may run one QDQ model several ways its graph leaves open. ONNX
Runtime fuses a blocked weight-only MatMul into a MatMulNBits whose
``accuracy_level`` a session setting picks: 0 keeps its input float, as
the QDQ model says; 4, its default, quantizes the input to int8 in blocks
and multiplies with integer dot products. On a decoder's 2048-wide layers
level 4 ran 0.18x the float model's latency at one token where level 0
ran 0.43x, at the same output SQNR; on a character transformer's small
layers at a batch of 16 level 4 was the slower one. So the choice is the
model's, measured.

A target lists the settings a model could use (:attr:`Target.setting_trials`),
each a pass that writes it into the model's metadata, which qlinear's
sessions of the model read (and a form that holds it, such as the
MatMulNBits nodes' own attribute, writes). Each is timed against the model
without it at the batches the users run, twice where it looks faster, and
kept where it is faster by more than the pairs' noise (:data:`MARGIN`)
both times and the accuracy target still holds with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from qlinear.quantize._latency import Latency, mean_ratio
from qlinear.quantize._speed import MARGIN

__all__ = ["RunSetting", "settings_where_faster"]


@dataclass(frozen=True)
class RunSetting:
    """One setting tried: the model's latency over the float model's without it and with it, and whether it was kept.

    The ratios are the geometric means over the batches the users run;
    ``after`` is None where the runtime could not run the model with it.
    """

    setting: str
    before: float
    after: float | None
    kept: bool


def settings_where_faster(
    model: onnx.ModelProto,
    trials: Sequence[tuple[str, Callable[[onnx.ModelProto], object]]],
    timed: Callable[[onnx.ModelProto, bool], Sequence[Latency] | None],
    meets_target: Callable[[onnx.ModelProto], bool],
) -> tuple[list[Callable[[onnx.ModelProto], object]], list[RunSetting]]:
    """The settings of ``trials`` to write into ``model`` (their passes, in order), and each trial.

    ``model``: the finished model as it will be written; ``timed``: a
    model's latency beside the float model's at each batch (``True``:
    timed anew, a decision's confirmation); ``meets_target``: whether a
    model still meets the accuracy target.
    """
    kept, tried = [], []
    current = model
    for setting, write in trials:
        start = timed(current, False)
        if start is None:
            return kept, tried
        before = mean_ratio(start)
        trial = onnx.ModelProto()
        trial.CopyFrom(current)
        write(trial)
        first = timed(trial, False)
        after = None if first is None else mean_ratio(first)
        faster = after is not None and after < before * (1 - MARGIN)
        if faster:  # confirmed by a second timing of both
            again, now = timed(trial, True), timed(current, True)
            faster = again is not None and now is not None and mean_ratio(again) < mean_ratio(now) * (1 - MARGIN)
        faster = faster and meets_target(trial)
        tried.append(RunSetting(setting, before, after, faster))
        if faster:
            kept.append(write)
            current = trial
    return kept, tried
