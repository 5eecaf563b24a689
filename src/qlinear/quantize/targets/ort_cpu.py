"""ONNX Runtime's CPU provider: the default target.

Its QDQ fusions (QLinearConv, QGemm, QLinearMatMul, MatMulIntegerToFloat,
MatMulNBits, the QLinear* element-wise and pooling kernels) are what the
planner's placement rules and the promotion ladder are written for; the
rules and the reasons are in docs/reference/placement-ort-cpu.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from onnx import helper

from qlinear.dtypes import ELEMENT_TYPES
from qlinear.onnx._passes import FunctionPass, Sequential
from qlinear.quantize import _prepare as rewrites
from qlinear.quantize._affine_folds import fold_affines_into_convs, fold_conv_affines
from qlinear.quantize._fusion import FusionCheck, check_fusion, float_by_design
from qlinear.quantize._gathered_table import gather_tables
from qlinear.quantize._model import FloatModel, index
from qlinear.quantize._padded_codes import pad_codes
from qlinear.quantize._precision import FULL_LADDER, Ladder
from qlinear.quantize._session import MATMUL_NBITS_ACCURACY_LEVEL, NBITS_LEVEL_KEY, PROVIDERS, nbits_level, session
from qlinear.quantize._signed_layout import lay_out_signed
from qlinear.quantize.targets._matmul_nbits import CONTRIB_DOMAIN, blocked_matmuls, streamed_to_matmul_nbits, to_matmul_nbits
from qlinear.quantize.targets._ort_profile import node_times
from qlinear.quantize.targets._target import Form, Placement, Target

__all__ = ["ORT_CPU", "prepare"]

_FLOAT8 = frozenset(t.name for t in ELEMENT_TYPES if not t.is_integer and t.bits == 8)


def _float_rewrite(rewrite, name: str | None = None) -> FunctionPass:
    return FunctionPass(rewrite, name=name, after=index)  # the float model's indexes follow each change


def _setting_trials(model) -> list[tuple[str, Callable[[Any], Any]]]:
    """MatMulNBits at accuracy level 4 (its input quantized to int8 in blocks), where the model has some to run so."""
    if not blocked_matmuls(model) or nbits_level(model) == 4:
        return []
    return [("MatMulNBits accuracy level 4", _at_level_4)]


def _at_level_4(model) -> None:
    """The model marked to run at level 4: its metadata (sessions read it), and its own MatMulNBits nodes' attribute."""
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != NBITS_LEVEL_KEY]  # the model's own stay
    del model.metadata_props[:]
    for key, value in [*kept, (NBITS_LEVEL_KEY, "4")]:
        model.metadata_props.add(key=key, value=value)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and node.domain == CONTRIB_DOMAIN:
            kept_attrs = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept_attrs, helper.make_attribute("accuracy_level", 4)])


def _prepare(weight_only: bool) -> Sequential:
    # In this order: constants are computed first, MatMul + Add becomes a Gemm, so a BatchNormalization after
    # it folds too, and constant scales and shifts after a Conv fold into the weights and bias the normalization may
    # have given it (before those before a Conv, so a map between two Convs goes into the first).
    to_gemm = functools.partial(rewrites.matmul_add_to_gemm, integer_activations=not weight_only)
    passes = [
        _float_rewrite(rewrites.drop_identities),
        _float_rewrite(rewrites.fold_constant_reshapes),
        _float_rewrite(to_gemm, "matmul_add_to_gemm"),
        _float_rewrite(rewrites.fold_batch_norms),
        _float_rewrite(fold_conv_affines),
        _float_rewrite(fold_affines_into_convs),
    ]
    if weight_only:  # only then does a DequantizeLinear on a Gemm's weight fuse into MatMulNBits
        passes.append(_float_rewrite(rewrites.untranspose_gemm_weights))
    return Sequential(*passes)


def _run_notes(fusion: FusionCheck, judged: bool) -> list[str]:
    """The session setting the MatMulNBits it fuses need to compute as measured (its default quantizes their input to int8).

    The MatMulNBits form's own nodes say their accuracy level themselves,
    and a model measured at level 4, ONNX Runtime's default, needs none.
    Where nothing was measured (no data), the choice is the user's to make.
    """
    nbits = sum(op == "MatMulNBits" and name not in fusion.written for name, op in fusion.runs_as.items())
    if not nbits or fusion.nbits_level == 4:
        return []
    if not judged:
        return [
            f"ONNX Runtime runs {nbits} MatMul(s) as MatMulNBits: its default accuracy level, 4, quantizes their inputs "
            f"to int8 (on wide layers much the faster: a 2048-wide decoder's 0.18x the float model's latency at one token "
            f'against 0.43x); "{MATMUL_NBITS_ACCURACY_LEVEL}" "0" keeps them float, as the model says; no data was '
            "given, so neither was measured: give data (--calibration) and qlinear times both and keeps the faster"
        ]
    return [
        f"ONNX Runtime runs {nbits} MatMul(s) as MatMulNBits: the figures here are at its accuracy level 0 (the input "
        f"stays float, as the model says); its default, 4, quantizes their inputs to int8: set the session entry "
        f'"{MATMUL_NBITS_ACCURACY_LEVEL}" to "0" where you run the model'
    ]


ORT_CPU = Target(
    name="ort-cpu",
    runtime="ONNX Runtime",
    short_name="ORT",
    providers=tuple(PROVIDERS),
    session=session,
    prepare=_prepare,
    finalize=Sequential(
        # The same values, without dequantizing whole tables every run.
        FunctionPass(lambda model: bool(gather_tables(model)), name="gather_tables"),
        # The same values, int8 activations where ONNX Runtime's x86 kernels take them.
        FunctionPass(lambda model: bool(lay_out_signed(model)), name="lay_out_signed"),
        # The same values, a Pad of a quantized tensor on its codes (ONNX Runtime drops no Q/DQ pair around a Pad).
        FunctionPass(lambda model: bool(pad_codes(model)), name="pad_codes"),
    ),
    check_fusion=check_fusion,
    float_by_design=float_by_design,
    # Wider weights only: its CPU provider has no 16-bit integer kernels, so a 16-bit activation runs in float
    # plus its Q/DQ (and spreads to its neighbours' outputs), slower than float and never more accurate; an
    # activation that must widen goes float.
    ladder=Ladder(FULL_LADDER.weights, {}),
    placement=Placement(
        integer_weight_types=frozenset({"int8", "uint8", "int4", "uint4"}),
        # Its Gather takes no 4- or 2-bit tensors, and a table dequantized whole on every run costs far more time
        # than its bytes save (see _gathered_table).
        table_types={"int4": "int8", "int2": "int8", "uint4": "uint8", "uint2": "uint8"},
        widened_table="ONNX Runtime gathers 8-bit codes, not narrower ones",
        # Its quantize_dynamic rewrites LSTM into a com.microsoft op instead.
        unfused_weight_ops=("LSTM", "GRU", "RNN", "Einsum"),
        fused_pools=frozenset({"GlobalAveragePool", "AveragePool"}),  # QLinearGlobalAveragePool, QLinearAveragePool
        integer_joins=frozenset({"Add", "Mul", "Concat"}),  # QLinearAdd, QLinearMul, QLinearConcat
        clamps_folded=frozenset({"Relu", "Clip"}),  # its redundant-clip rule
        # MatMul and Gemm run blocked weights of every type as MatMulNBits; a blocked 8-bit Conv weight it fuses
        # into QLinearConv, which takes no blocked filter scale (4-bit ones it leaves a float Conv).
        blocked_float_ops={"MatMul": None, "Gemm": None, "Conv": frozenset({"int8", "uint8"})},
        # Its optimizer fuses the Q/DQ around these into QLinearConv, QLinearMatMul and QGemm without looking at the
        # type, and the session then fails (INVALID_GRAPH; no QLinearMatMul kernel): measured on ONNX Runtime 1.31.
        unloadable_activations=dict.fromkeys(("Conv", "MatMul", "Gemm"), _FLOAT8),
        unloadable_why="its optimizer fuses their Q/DQ into QLinearConv, QLinearMatMul or QGemm, which have no float8 "
        "kernels, and the model does not load",
        # Its optimizer fuses a 2-bit DequantizeLinear -> MatMul or Gemm into MatMulNBits (bits=2), which returns
        # wrong values, different in each session, for a layer of 1-3, 5-7, 33, ... output columns: measured on
        # ONNX Runtime 1.31.1 (4, 8, 12, ..., 64 columns and every 4-bit layer are right).
        column_multiples={"int2": (4, "int4"), "uint2": (4, "uint4")},
        column_multiple_why="ONNX Runtime's 2-bit MatMulNBits, which it fuses these layers into, computes a layer of "
        "output columns not a multiple of 4 wrongly",
    ),
    run_notes=_run_notes,
    node_times=node_times,
    # Its own op for a blocked weight-only MatMul, which it fuses the QDQ form into; some tools read only this.
    setting_trials=_setting_trials,
    forms={
        "matmulnbits": Form(
            FunctionPass(lambda model: bool(to_matmul_nbits(model)), name="to_matmul_nbits"), streamed_to_matmul_nbits
        )
    },
)


def prepare(fm: FloatModel, *, weight_only: bool) -> FloatModel:
    """``fm`` with this target's float-exact rewrites applied (in place)."""
    ORT_CPU.prepare(weight_only)(fm)
    return fm
