"""A user's own accuracy measure: what they decide on, given as a function, that the target search and the report use.

The measure is ``metric(float_outputs, quantized_outputs, labels)``: the
float and quantized models' judged outputs for one eval batch (output
name -> array) and that batch's labels (None without them), returning a
number, higher better (a detector's mAP against the float model's
detections, a word error rate negated, a share of decisions kept). The
run's figure is its mean over the eval batches, weighted by their samples.
On the command line it is ``--metric module:function`` (a module on the
path or in the working directory) or ``--metric path/to/file.py:function``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from qlinear._errors import QuantizationError

__all__ = ["Metric", "checked_figure", "load_metric", "metric_name"]

Metric = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray], "np.ndarray | None"], float]


def metric_name(metric: str | Callable) -> str:
    """How the report names ``metric``: its ``module:function`` text, or a function's qualified name."""
    if isinstance(metric, str):
        return metric
    return f"{getattr(metric, '__module__', '?')}:{getattr(metric, '__qualname__', repr(metric))}"


def load_metric(metric: str | Callable) -> Metric:
    """The function ``metric`` names (or ``metric`` itself, where it is one).

    Raises:
        QuantizationError: not ``module:function``, the module cannot be
            imported, or it has no such callable.
    """
    if callable(metric):
        return metric
    if not isinstance(metric, str) or metric.count(":") != 1 or not all(metric.split(":")):
        raise QuantizationError(f"quantize: metric must be 'module:function' or 'file.py:function', got {metric!r}")
    where, name = metric.split(":")
    try:
        module = _module_from_file(where) if where.endswith(".py") or "/" in where else _module(where)
    except QuantizationError:
        raise
    except Exception as e:  # the user's module failed on import: its own error, in one line
        raise QuantizationError(f"quantize: metric {metric!r}: importing {where!r} failed: {type(e).__name__}: {e}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise QuantizationError(f"quantize: metric {metric!r}: {where!r} has no function {name!r}")
    return function


def checked_figure(metric: Metric, name: str, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                   labels: np.ndarray | None) -> float:  # fmt: skip
    """``metric`` on one batch, as a float; a raise or a value that is not a finite number is the user's error, named."""
    try:
        value = metric(ref, got, labels)
    except Exception as e:
        raise QuantizationError(f"quantize: metric {name!r} raised {type(e).__name__}: {e}") from None
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise QuantizationError(f"quantize: metric {name!r} must return a finite number, returned {value!r}")
    return float(value)


def _module(name: str):
    try:
        if str(Path.cwd()) not in sys.path:  # a module beside the user's files, as a script would find it
            sys.path.append(str(Path.cwd()))
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise QuantizationError(f"quantize: metric module {name!r} cannot be imported: {e}") from None


def _module_from_file(path: str):
    file = Path(path)
    if not file.is_file():
        raise QuantizationError(f"quantize: metric file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"qlinear_metric_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
