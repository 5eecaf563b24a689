"""Digests of every model the test suite quantizes, for the byte-for-byte check of a restructuring.

With ``QLINEAR_MODEL_DIGESTS=path.jsonl`` in the environment, conftest.py
wraps ``qlinear.quantize.quantize_model`` and
``qlinear.quantize.quantize_weights_streaming``: each call appends a line
``{"test": nodeid, "call": k, "sha256": ...}`` to the file (the model as
returned, and the written file where there is one). Without the variable
nothing is wrapped. ``benchmarks/same_models.py compare`` reads two such
files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

_calls: Counter = Counter()


def _input_digest(model) -> str | None:
    """The float model's digest: a test whose input differs between two runs (an exporter that writes source paths
    into the model's metadata) is not a comparison of the quantizer."""
    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        return hashlib.sha256(Path(model).read_bytes()).hexdigest()
    if hasattr(model, "SerializeToString"):
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    return None


def _digest_of(result, output) -> dict:
    out = {}
    model = getattr(result, "model", None)
    if model is not None:
        out["sha256"] = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    if output is not None and Path(output).is_file():
        out["file_sha256"] = hashlib.sha256(Path(output).read_bytes()).hexdigest()
    return out


def _recorded(fn, path: Path):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        _calls[test] += 1
        output = args[1] if len(args) > 1 else kwargs.get("output")
        line = {"test": test, "call": _calls[test], "function": fn.__name__, **_digest_of(result, output)}
        if args and (source := _input_digest(args[0])) is not None:
            line["input_sha256"] = source
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        return result

    return wrapper


def install() -> None:
    """Wrap the quantizer's entry points where ``QLINEAR_MODEL_DIGESTS`` names a file."""
    target = os.environ.get("QLINEAR_MODEL_DIGESTS")
    if not target:
        return
    import qlinear.quantize as qq

    for name in ("quantize_model", "quantize_weights_streaming"):
        setattr(qq, name, _recorded(getattr(qq, name), Path(target)))
