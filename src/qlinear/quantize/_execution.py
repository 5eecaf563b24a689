"""How one quantizer run executes, apart from what it computes: workers, resuming, the output file, progress bars.

None of this changes the model a run writes: the same options give the
same bytes with one process or many, with bars or without.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import save
from qlinear.quantize._checked import check_quantized

__all__ = ["Bars", "Execution", "checked_output", "write_atomically"]


@dataclass(frozen=True)
class Execution:
    """How the calibration runs and where its state goes.

    Attributes:
        workers: processes that run the calibration batches.
        ray: a Ray cluster's address (``"auto"``, ``"local"``) to run them on, or None.
        stats: statistics saved by an earlier run, used instead of calibrating.
        save_stats_to: where the statistics are written as batches complete.
        resume: a calibration to continue (its batches are skipped).
    """

    workers: int = 1
    ray: str | None = None
    stats: str | PathLike[str] | None = None
    save_stats_to: str | PathLike[str] | None = None
    resume: str | PathLike[str] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise QuantizationError(f"quantize: workers must be an int >= 1, got {self.workers!r}")
        if self.resume is not None and self.stats is not None:
            raise QuantizationError("quantize: give stats (finished statistics) or resume (a calibration to continue), not both")


def checked_output(model: Any, output: Any) -> Path | None:
    """``output`` as a path that can be written and is not the input model (None: nothing is written)."""
    if output is None:
        return None
    out = Path(output)
    if isinstance(model, (str, PathLike)) and Path(model).resolve() == out.resolve():
        raise QuantizationError(f"quantize: output {out} is the input model; choose another path (the input is never modified)")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise QuantizationError(f"quantize: output {out} cannot be written: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise QuantizationError(f"quantize: output {out} cannot be written: permission denied")
    if out.is_dir():
        raise QuantizationError(f"quantize: output {out} is a directory, expected a file path")
    return out


def write_atomically(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` (and its external data file, if any) to a temporary folder beside ``path``, then move it in place."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.resolve().parent))
    except OSError as e:  # the folder went away, or no space is left
        raise QuantizationError(f"quantize: output {path} cannot be written: {e.strerror}") from None
    try:
        try:
            save(model, tmp / path.name)
        except QuantizationError as e:  # say the output's path, not the temporary one
            raise QuantizationError(f"quantize: output {path} cannot be written: {str(e).rsplit(': ', 1)[-1]}") from None
        if large.is_large(model) or large.has_markers(model):  # the full check of the weights, by path
            check_quantized(tmp / path.name)
        for f in sorted(tmp.iterdir()):
            os.replace(f, path.resolve().parent / f.name)
    except OSError as e:  # a full disk, a folder removed while writing
        raise QuantizationError(f"quantize: output {path} cannot be written: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Bars:
    """Progress bars on a console, or nothing."""

    def __init__(self, console: Console | None) -> None:
        # Bars only on a terminal: piped, they would leave blank lines behind.
        self.console = console if console is not None and console.is_terminal else None

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        if self.console is None:
            yield lambda n: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
