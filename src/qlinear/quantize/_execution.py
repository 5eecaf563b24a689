"""How one quantizer run executes, apart from what it computes: workers, resuming, the output file, progress, cost.

None of this changes the model a run writes: the same options give the
same bytes with one process or many, with bars or without.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
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
from qlinear.quantize._memory import Peak
from qlinear.quantize._profile import PartTime, StageTime

__all__ = ["Bars", "Execution", "checked_output", "unwritable", "write_atomically"]


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
    why = unwritable(out)
    if why is not None:
        raise QuantizationError(f"quantize: output {out} {why}")
    return out


def unwritable(path: Path) -> str | None:
    """Why a file cannot be written at ``path``, as the end of a sentence naming it; None where it can."""
    parent = path.resolve().parent
    if not parent.is_dir():
        return f"cannot be written: folder {parent} does not exist"
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "cannot be written: permission denied"
    if path.is_dir():
        return "is a directory, expected a file path"
    return None


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
    """Progress bars on a console (or nothing), one a stage and one a part of it, and each stage's cost.

    Each :meth:`stage` is timed and its peak memory read into ``stages``;
    each :meth:`task` within it is a bar of its own and a part of it.
    """

    def __init__(self, console: Console | None) -> None:
        # Bars only on a terminal: piped, they would leave blank lines behind.
        self.console = console if console is not None and console.is_terminal else None
        self.stages: list[StageTime] = []
        self._live: Progress | None = None  # the running stage's bars
        self._parts: list[PartTime] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time ``name`` and read its peak memory; on a console, its name and elapsed time from its first second."""
        start, self._parts = time.perf_counter(), []
        if self.console is not None:
            self._live = Progress(*_COLUMNS, console=self.console, transient=True)
            self._live.add_task(name, total=None)
            self._live.start()
        peak = Peak()
        try:
            with peak:
                yield
        finally:
            if self._live is not None:
                self._live.stop()
                self._live = None
            self.stages.append(StageTime(name, time.perf_counter() - start, peak.bytes, peak.since, self._parts))

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        start = time.perf_counter()
        try:
            if self._live is not None:  # a bar under the stage's
                task = self._live.add_task(f"  {description}", total=total)
                try:
                    yield lambda n: self._live.advance(task, n)
                finally:
                    self._live.remove_task(task)
            elif self.console is not None:
                with Progress(*_COLUMNS, console=self.console, transient=True) as bar:
                    task = bar.add_task(description, total=total)
                    yield lambda n: bar.advance(task, n)
            else:
                yield lambda n: None
        finally:
            self._parts.append(PartTime(description, time.perf_counter() - start))


_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
