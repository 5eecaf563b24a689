"""Shared fixtures: ONNX's backend test cases for the three operators."""

from __future__ import annotations

import warnings

import pytest

OPERATORS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


def _collect():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        # Generating every backend case runs casts that overflow on purpose.
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [c for c in cases if c.model.graph.node and c.model.graph.node[0].op_type in OPERATORS]


BACKEND_CASES = _collect()


@pytest.fixture(scope="session")
def backend_cases():
    return BACKEND_CASES
