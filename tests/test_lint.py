"""ruff's lint and format checks, as part of the test run: a lint or format error fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "examples"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed; it is part of the test extra: pip install -e '.[test]'")
    return [exe]


@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(check):
    proc = subprocess.run([*_ruff(), *check, *PATHS], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_a_format_error_fails(tmp_path):
    # The check is real: a badly formatted file makes ruff exit 1.
    bad = tmp_path / "bad.py"
    bad.write_text("x = [ 1,2 ]\n")
    proc = subprocess.run([*_ruff(), "format", "--check", str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
