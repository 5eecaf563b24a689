"""The target interface: what one runtime fuses, and how a QDQ model is laid out for it.

A target is one :class:`Target` object in its own module of this package.
The pipeline asks it for the float-exact rewrites the runtime needs before
it fuses (``prepare``), the layout rewrites of the quantized model
(``finalize``), the check of what the runtime actually fused
(``check_fusion``), why a node of given types runs in float on it
whatever the layout (``float_by_design``) and the promotion steps the
accuracy search may take on it (``ladder``), and it opens the runtime on
a model (``session``) for every run the quantizer makes: calibration,
evaluation, the search's candidates, the latency pairs. Model-semantic rules (a Log
downstream, graph outputs, subgraph reads, user exclusions) are the
planner's, the same on every target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qlinear.onnx._passes import Pass
from qlinear.quantize._precision import Ladder

__all__ = ["QDQ_FORM", "Form", "Placement", "Target"]

# The form every target reads: standard QuantizeLinear/DequantizeLinear around standard operators.
QDQ_FORM = "qdq"


@dataclass(frozen=True)
class Placement:
    """The facts of a runtime's fusions that the planner's rules read.

    The planner (:mod:`qlinear.quantize._placement`) owns the rules, the same on
    every target (which nodes take a Q/DQ, what shares parameters, what a
    Log downstream or a graph output keeps float); a target says what its
    runtime fuses, here.

    Attributes:
        integer_weight_types: the weight types its integer kernels take
            beside integer activations (other weights pair with float ones).
        table_types: the type a Gather's table is stored in where the
            runtime gathers no narrower codes (asked type -> stored type).
        widened_table: why, as the report says it.
        unfused_weight_ops: ops holding weights that it runs in float
            behind a DequantizeLinear (listed as left float, with what they hold).
        fused_pools: pools it runs on quantized values between a uint8
            DequantizeLinear and QuantizeLinear (their inputs are quantized).
        integer_joins: the joins of activations it runs on integer kernels
            between DequantizeLinear inputs and a QuantizeLinear output
            (their outputs are quantized where their inputs are).
        clamps_folded: activations right after a Conv that a QuantizeLinear
            after them absorbs (its range clamps as they do).
        blocked_float_ops: ops whose blocked weights go with float
            activations, each with the weight types this holds for (None:
            every type; its
            integer kernels take per-tensor or per-channel weight scales
            only, and a blocked DequantizeLinear it fuses into one fails at
            run time).
        unloadable_activations: ops whose Q/DQ it fuses into an integer
            kernel whatever the activations' type, each with the activation
            types it has no such kernel for: a model with one does not load,
            so a run asking for them is refused before any work.
        unloadable_why: why, as the refusal says it.
        column_multiples: weight types whose MatMul and Gemm kernel needs
            the layer's output columns to be a multiple of a number: type ->
            (that number, the type stored where they are not).
        column_multiple_why: why, as the report says it.
        signed_matmul_inputs: whether a MatMul of two activations takes
            its first input as int8 of zero point 0 (its integer kernel
            takes no zero point there).
        quantized_conv_outputs: whether its integer Conv needs a
            QuantizeLinear on its output (ONNX Runtime's QLinearConv does);
            where not, a Conv's output is quantized only where a reader
            takes it quantized.
    """

    integer_weight_types: frozenset[str]
    table_types: Mapping[str, str]
    widened_table: str
    unfused_weight_ops: tuple[str, ...]
    fused_pools: frozenset[str]
    integer_joins: frozenset[str]
    clamps_folded: frozenset[str]
    blocked_float_ops: Mapping[str, frozenset[str] | None]
    unloadable_activations: Mapping[str, frozenset[str]]
    unloadable_why: str
    column_multiples: Mapping[str, tuple[int, str]]
    column_multiple_why: str
    signed_matmul_inputs: bool = False
    quantized_conv_outputs: bool = True

    def stored_type(self, op_type: str, weight_type: str, columns: int | None) -> tuple[str, str | None]:
        """The type a weight of ``op_type`` asked as ``weight_type`` is stored in, and why where it is not that one.

        ``columns``: the layer's output columns (a MatMul's or Gemm's N; None where unknown).
        """
        if op_type == "Gather" and weight_type in self.table_types:
            return self.table_types[weight_type], self.widened_table
        if op_type in ("MatMul", "Gemm") and weight_type in self.column_multiples and columns is not None:
            multiple, wider = self.column_multiples[weight_type]
            if columns % multiple:
                return wider, self.column_multiple_why
        return weight_type, None


@dataclass(frozen=True)
class Form:
    """A form of a finished model that a runtime reads besides standard QDQ, computing the same.

    Attributes:
        rewrite: the pass that rewrites a finalized model into it.
        streamed: the same on an onnx-ir model whose codes are lazy (the
            weights streamed one at a time), as ``streamed(onnx_ir, model)``.
    """

    rewrite: Pass
    streamed: Callable[[Any, Any], int]


@dataclass(frozen=True)
class Target:
    """One runtime's rules.

    Attributes:
        name: what ``--target`` takes and the report shows.
        runtime: the runtime's name, as messages and the report say it.
        providers: the execution providers its sessions run on.
        session: the runtime opened on a model, as
            ``session(model, *, threads=0, path=None, arena=True, spinning=True)``
            (``path``: the model's file instead, its external data beside
            it; ``threads``: 0 for the runtime's own choice; ``arena``:
            whether the session may keep its largest run's memory, off
            where runs return many tensors; ``spinning``: whether its idle
            threads may spin-wait, off where sessions take turns on the
            same cores to be timed). The object it returns runs a
            batch as ``run(output_names, feeds)`` (the outputs' arrays in
            that order); it raises ``QuantizationError`` (one line) where
            the runtime cannot load the model.
        prepare: the float-exact rewrites of the float model that let the
            runtime fuse, as one pass (given whether the run is weight-only).
        finalize: the rewrites of the quantized model into the layout the
            runtime runs fastest (the same values), as one pass.
        check_fusion: which of the quantized nodes the runtime fused, from
            the model and those nodes' names (None: it cannot load it).
        float_by_design: why the runtime runs a node of (op type, weight
            type, activation type) in float whatever its layout, or None.
        ladder: the promotion steps the accuracy search may take on it.
        placement: what it fuses, as the planner reads it.
        run_notes: what a user must set where the model runs for it to
            compute as the report's figures say, from the fusion check and
            whether anything was measured (one warning a line; none where
            nothing is needed).
        node_times: for each batch of feeds given, the seconds a run of a
            model takes in each of its nodes (the kernels the runtime fused
            counted to the node they came from; the ones it added under
            their own names) and a run's seconds, from the runtime's own
            profile; None where it cannot load or run the model. None: the
            runtime gives no profile (every kind of node is then timed).
        forms: the forms of a finished model the runtime reads besides
            standard QDQ, by name (``format`` of the options).
        setting_trials: the settings the runtime could run a finished
            model with besides its own, for those the model can use: each
            (what it is, as the report says it; a pass that writes it into
            the model, where the target's sessions read it). The quantizer
            keeps each where it is faster (:mod:`qlinear.quantize._run_settings`).
        requires: why the target cannot run on this machine (its runtime
            is not installed: the extra to install), or None.
        short_name: the runtime's name in the report's tables ("ORT").
        backend: what the report's evaluation says it ran on.
    """

    name: str
    runtime: str
    providers: tuple[str, ...]
    session: Callable[..., Any]
    prepare: Callable[[bool], Pass]
    finalize: Pass
    check_fusion: Callable[[Any, list[str]], Any]
    float_by_design: Callable[[str, str | None, str | None], str | None]
    ladder: Ladder
    placement: Placement
    run_notes: Callable[[Any, bool], list[str]]
    node_times: Callable[[Any, Any], list[tuple[dict[str, float], float]] | None] | None = None
    forms: Mapping[str, Form] = field(default_factory=dict)
    setting_trials: Callable[[Any], list[tuple[str, Callable[[Any], Any]]]] = lambda model: []
    requires: Callable[[], str | None] = lambda: None
    short_name: str = ""
    backend: str = "onnxruntime"

    @property
    def label(self) -> str:
        """The runtime's name where a table has little room."""
        return self.short_name or self.runtime

    def as_written(self, model: Any, form: str = QDQ_FORM) -> None:
        """``model`` (a quantized model, in place) laid out as the runtime runs it fastest, in ``form``."""
        self.finalize(model)
        if form != QDQ_FORM:
            self.forms[form].rewrite(model)
