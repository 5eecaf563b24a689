"""ONNX's own backend test cases, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.conformance import backend_cases
from qlinear.kernels import BACKENDS
from qlinear.onnx._node_case import run_qlinear

CASES = backend_cases()


def test_every_operator_has_backend_cases():
    assert {c.op for c in CASES} == {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
    assert len(CASES) >= 30


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backend_case_bit_exact(case, backend):
    got = run_qlinear(case, backend=backend)
    assert len(got) == len(case.expected)
    for g, e in zip(got, case.expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        # Backend cases carry no NaN, so every bit must match.
        assert np.array_equal(
            np.ascontiguousarray(g).reshape(-1).view(np.uint8), np.ascontiguousarray(e).reshape(-1).view(np.uint8)
        ), f"{case.name}: got {g}, expected {e}"
