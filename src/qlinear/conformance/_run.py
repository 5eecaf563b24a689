"""Conformance: ONNX's backend cases and the generated edge-case matrix,
run through qlinear and the other implementations, compared with the spec.

For a backend case the expected outputs are the ones ONNX ships with it; for
a generated case they come from qlinear's element-by-element transcription
of the specification (``_spec_model``). Every implementation is compared
with that expectation bit for bit (any NaN matches any NaN).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qlinear.conformance._edge_cases import generated_cases
from qlinear.conformance._oracles import Unsupported, run_onnx_reference, run_onnxruntime, run_spec_model, same
from qlinear.kernels import BACKENDS
from qlinear.onnx._node_case import NodeCase, node_case_from_model, run_qlinear

__all__ = ["Outcome", "ConformanceReport", "backend_cases", "run_conformance"]

_OPERATORS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


def backend_cases() -> list[NodeCase]:
    """ONNX's own backend test cases for the three operators, with expected outputs."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # Generating every backend case runs casts that overflow on purpose.
        warnings.simplefilter("ignore")
        collected = collect_testcases(None)
    cases = []
    for c in collected:
        if not c.model.graph.node or c.model.graph.node[0].op_type not in _OPERATORS:
            continue
        for inputs, outputs in c.data_sets:
            cases.append(node_case_from_model(c.name, c.model, inputs, outputs))
    return cases


@dataclass
class Outcome:
    """One implementation on one case: ``agree``, ``disagree``, ``unsupported`` or ``error``.

    ``kind`` classes a disagreement by the input that exposed it (``x=nan``,
    ``x=inf``, ``x beyond int32``, ``x=-0``, ``zero point``, ``output type``,
    ``rounding``), so a report can list each kind once.
    """

    case: str
    suite: str
    implementation: str
    status: str
    detail: str = ""
    kind: str = ""


@dataclass
class ConformanceReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def implementations(self) -> list[str]:
        return list(dict.fromkeys(o.implementation for o in self.outcomes))

    def counts(self, implementation: str, suite: str | None = None) -> dict[str, int]:
        counts = {"agree": 0, "disagree": 0, "unsupported": 0, "error": 0}
        for o in self.outcomes:
            if o.implementation == implementation and (suite is None or o.suite == suite):
                counts[o.status] += 1
        return counts

    def disagreement_kinds(self, implementation: str) -> list[tuple[str, int, Outcome]]:
        """Each (operator, quantized type, kind) of disagreement once, with its count and first example."""
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            if o.implementation == implementation and o.status in ("disagree", "error"):
                parts = o.case.split("/")
                operator = parts[0].split("-")[0]
                groups.setdefault(f"{operator} {parts[1] if len(parts) > 1 else ''}: {o.kind}", []).append(o)
        return [(key, len(v), v[0]) for key, v in groups.items()]

    def qlinear_conforms(self) -> bool:
        """Every qlinear backend agrees with the spec on every case."""
        return all(o.status == "agree" for o in self.outcomes if o.implementation.startswith("qlinear"))

    def to_json(self) -> dict:
        return {
            "conforms": self.qlinear_conforms(),
            "summary": {
                impl: {suite: self.counts(impl, suite) for suite in ("backend", "generated")} for impl in self.implementations()
            },
            "disagreements": [o.__dict__ for o in self.outcomes if o.status in ("disagree", "error")],
            "unsupported": [o.__dict__ for o in self.outcomes if o.status == "unsupported"],
        }


def _kind(x: object) -> str:
    v = float(np.asarray(x).astype(np.float64))
    if np.isnan(v):
        return "x=nan"
    if np.isinf(v):
        return "x=inf"
    if abs(v) >= 2.0**31:
        return "x beyond int32"
    if v == 0 and np.signbit(v):
        return "x=-0"
    return "rounding"


def _first_difference(case: NodeCase, got: list[np.ndarray], want: list[np.ndarray]) -> tuple[str, str]:
    """A description of the first differing element, and its kind."""
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {k}: got {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}", "output type"
        gf, wf = g.reshape(-1), w.reshape(-1)
        for i in range(gf.size):
            if not same(gf[i : i + 1], wf[i : i + 1]):
                if case.op == "DynamicQuantizeLinear" and k > 0:
                    return f"output {k}: got {gf[i]} expected {wf[i]}", "computed scale or zero point"
                x = case.inputs[0].reshape(-1)[i]
                zero_point = case.inputs[2] if len(case.inputs) > 2 else None
                kind = _kind(x)
                if (
                    kind == "rounding"
                    and zero_point is not None
                    and zero_point.dtype.kind not in "iu"
                    and np.any(zero_point.astype(np.float32) != 0)
                ):
                    kind = "float zero point"
                return f"output {k}[{i}]: x={x} got {gf[i]} expected {wf[i]}", kind
    return "", ""


def _judge(case: NodeCase, suite: str, name: str, run: Callable[[NodeCase], list[np.ndarray]], want: list[np.ndarray]) -> Outcome:
    try:
        with np.errstate(all="ignore"):
            got = run(case)
    except Unsupported as e:
        return Outcome(case.name, suite, name, "unsupported", str(e))
    except Exception as e:  # an implementation failing on a valid case is a result, not a crash
        return Outcome(case.name, suite, name, "error", f"{type(e).__name__}: {str(e)[:200]}", "raises")
    if len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True)):
        return Outcome(case.name, suite, name, "agree")
    return Outcome(case.name, suite, name, "disagree", *_first_difference(case, got, want))


def run_conformance(
    *,
    onnxruntime: bool = True,
    reference: bool = True,
    generated: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> ConformanceReport:
    """Run every case through every implementation and compare with the spec.

    Args:
        onnxruntime: include ONNX Runtime (when installed).
        reference: include ``onnx.reference.ReferenceEvaluator``.
        generated: include the generated matrix besides ONNX's backend cases.
        progress: called with (cases done, cases in all).
    """
    implementations: list[tuple[str, Callable[[NodeCase], list[np.ndarray]]]] = [
        (f"qlinear[{b}]", lambda c, b=b: run_qlinear(c, backend=b)) for b in BACKENDS
    ]
    if reference:
        implementations.append(("onnx.reference", run_onnx_reference))
    if onnxruntime:
        implementations.append(("onnxruntime", run_onnxruntime))
    suites = [("backend", c) for c in backend_cases()]
    if generated:
        suites += [("generated", c) for c in generated_cases()]
    report = ConformanceReport()
    for done, (suite, case) in enumerate(suites, start=1):
        want = case.expected if case.expected is not None else run_spec_model(case)
        if suite == "backend":
            report.outcomes.append(_judge(case, suite, "spec model", run_spec_model, want))
        for name, run in implementations:
            report.outcomes.append(_judge(case, suite, name, run, want))
        if progress:
            progress(done, len(suites))
    return report
