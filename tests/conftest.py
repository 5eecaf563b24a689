"""Test-wide settings: hypothesis runs the same examples every time in CI; the tests' helper modules import."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import settings

# The tests' shared model builders (quantize_models.py) import by name; --import-mode=importlib adds no path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# QLINEAR_MODEL_DIGESTS=path.jsonl: record each quantized model's digest (benchmarks/same_models.py compares them).
import _model_digests  # noqa: E402

_model_digests.install()
