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

import pytest  # noqa: E402

import qlinear.quantize._node_cost as _node_cost  # noqa: E402
import qlinear.quantize._speed as _speed  # noqa: E402
import qlinear.quantize._stages as _stages  # noqa: E402


def _every_node_kept(fm, quantized, precision, timed, shares=None, float_shares=None):
    return precision, []


def _no_profile(model, feeds, runtime):
    return None


@pytest.fixture(scope="session", autouse=True)
def _placement_by_timing_only_where_asked():
    """Keep every node the types allow quantized, as ``float_where_faster=False`` does, unless a test is marked ``timed``.

    And give the promotion search no profile, so that it searches the sensitivity order alone (``timed``: as shipped).

    Which kinds of node run faster in float is a timing on the machine at hand, so a test of anything else would
    see a node float on one machine and quantized on another. ``tests/test_quantize_speed.py`` tests the pass with
    deterministic timers, and its tests marked ``timed`` run it as shipped. Session-wide, so that module-scoped
    fixtures quantize the same way.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_stages, "float_where_faster", _every_node_kept)
        # No profile either: the promotion search's cheap order, like the speed trials, rests on the machine's timings.
        patch.setattr(_stages, "node_seconds", _no_profile)
        yield


@pytest.fixture(autouse=True)
def _timed_placement_where_marked(request, monkeypatch):
    if request.node.get_closest_marker("timed") is not None:
        monkeypatch.setattr(_stages, "float_where_faster", _speed.float_where_faster)
        monkeypatch.setattr(_stages, "node_seconds", _node_cost.node_seconds)
