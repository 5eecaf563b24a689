"""ONNX Runtime for the quantizer: its CPU sessions, and a batch run whose failure reads as one line."""

from __future__ import annotations

import os
import re
import tempfile
from typing import TYPE_CHECKING

import onnx
import onnxruntime as ort

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import _parts as parts

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = [
    "MATMUL_NBITS_ACCURACY_LEVEL", "NBITS_LEVEL_KEY", "PROVIDERS", "load_error", "load_reason", "nbits_level", "optimized_graph", "run_batch",
    "only_outputs", "session", "with_outputs",
]  # fmt: skip

# The quantizer's figures are ONNX Runtime's CPU provider's.
PROVIDERS = ["CPUExecutionProvider"]
# ONNX Runtime's session setting for the precision of the MatMulNBits it fuses from blocked DequantizeLinear + MatMul.
MATMUL_NBITS_ACCURACY_LEVEL = "session.qdq_matmulnbits_accuracy_level"
# The level a quantized model was measured at and is meant to run at, where the quantizer chose one by speed
# (qlinear.quantize._run_settings): in the model's metadata, read by qlinear's sessions of it. Absent: level 0.
NBITS_LEVEL_KEY = "qlinear.matmulnbits_accuracy_level"


def nbits_level(model: onnx.ModelProto | None) -> int:
    """The MatMulNBits accuracy level ``model`` says it runs at (0: its input float, as the QDQ model says)."""
    if model is None:
        return 0
    return next((int(p.value) for p in model.metadata_props if p.key == NBITS_LEVEL_KEY), 0)


def session(
    model: onnx.ModelProto | None,
    *,
    threads: int = 0,
    optimize: bool = True,
    optimized_path: str | None = None,
    path: str | None = None,
    basic: bool = False,
    arena: bool = True,
    spinning: bool = True,
    profile_prefix: str | None = None,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session for ``model``, or for the model file at ``path`` (its external data beside it).

    ``basic``: only ONNX Runtime's basic graph optimizations (constant
    folding, redundant node removal, fusions such as MatMul + Add -> Gemm).
    ``arena``: ONNX Runtime's memory arena, which keeps what its largest
    run took for the session's life. Off for sessions that return many
    tensors (calibration, the per-node comparisons): each would keep a
    batch's worth of them (the orientation classifier's whole run: 1.64 ->
    1.23 GiB at the peak, in the same time).
    ``spinning``: whether its idle threads spin, waiting for the next
    operator's work (ONNX Runtime's default, the fastest for one session
    alone). Off where sessions take turns on the same cores: one
    session's spinning threads take the cores from the next one's run (a
    float classifier's alternating timings went 1.5 -> 2.1-2.4 ms a batch
    of one with them on).
    ``profile_prefix``: ONNX Runtime profiles every run into a JSON file of
    that prefix (``end_profiling()`` gives its path).

    Raises:
        QuantizationError: ONNX Runtime cannot load the model (its first line of error).
    """

    def options() -> ort.SessionOptions:  # a session's own (a large model's parts take one each)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        levels = ort.GraphOptimizationLevel
        so.graph_optimization_level = (
            (levels.ORT_ENABLE_BASIC if basic else levels.ORT_ENABLE_ALL) if optimize else levels.ORT_DISABLE_ALL
        )
        # ONNX Runtime fuses a 2/4/8-bit blocked DequantizeLinear into its MatMul (MatMulNBits) and, by default
        # (level 4), quantizes that MatMul's float input to int8 in blocks: not what the QDQ model says, and on
        # small layers slower (the character transformer's int4 MatMuls, batch 16: 1.78 ms at level 4, 1.15 ms
        # at 0, float 1.0). Level 0 keeps the input float, so the figures qlinear reports are the model's own,
        # unless the model says it runs at another (chosen by speed, its figures measured there).
        so.add_session_config_entry(MATMUL_NBITS_ACCURACY_LEVEL, str(nbits_level(model)))
        so.enable_cpu_mem_arena = arena
        if not spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if profile_prefix:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        if optimized_path:
            so.optimized_model_filepath = optimized_path
            # Its weights in a file beside it: an optimized model past 2 GB cannot be one protobuf file.
            so.add_session_config_entry(large.OPTIMIZED_DATA, "optimized.onnx.data")
        return so

    try:
        if path is not None:
            return ort.InferenceSession(path, options(), providers=PROVIDERS)
        return parts.session(model, options, PROVIDERS)
    except Exception as e:  # ONNX Runtime raises its own exception types; the user needs the one line
        raise QuantizationError(f"quantize: ONNX Runtime cannot load the model: {_first_line(e)}{_hint(e)}") from None


def optimized_graph(model: onnx.ModelProto, *, basic: bool = False) -> onnx.ModelProto | None:
    """The graph ONNX Runtime makes of ``model`` (its weights left out), or None where it cannot load the model.

    ``basic``: after its basic optimizations only (see :func:`session`).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        try:
            if parts.runs_in_parts(model):  # each part's graph, in one
                return session(model, basic=basic).optimized(tmp)
            session(model, optimized_path=path, basic=basic)
        except QuantizationError:  # no kernels for its types, or a model it refuses: the caller goes on without
            return None
        return onnx.load(path, load_external_data=False)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _hint(e: Exception) -> str:
    """What to do about a load error the user can fix in one line."""
    newest = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", str(e))
    if newest:  # onnx.helper.make_model stamps the onnx package's newest IR version, which ONNX Runtime may not read yet
        return (
            f"; set model.ir_version = {newest.group(2)} (or lower, down to what its opsets need) before saving it: "
            f"IR version {newest.group(1)} is newer than this ONNX Runtime {ort.__version__} reads"
        )
    return ""


def run_batch(sess: ort.InferenceSession, names: list[str] | None, feeds: dict, what: str, runtime: str = "ONNX Runtime") -> list:
    """``sess.run``, its failure said in one line naming what was being run (and ``runtime``, the session's)."""
    try:
        return sess.run(names, feeds)
    except Exception as e:  # ONNX Runtime raises its own exception types
        raise QuantizationError(f"quantize: {runtime} failed on {what}: {_first_line(e)}") from None


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs the tensors ``names``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return out


def only_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs are the tensors ``names`` alone: the runtime computes no node they do not need."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(names))
    return out


def load_error(model: onnx.ModelProto, runtime: Target) -> str | None:
    """Why ``runtime`` (a target) cannot load ``model`` as it is, or None where it loads it.

    The model as written, not one with more outputs: an output added to
    watch a tensor can keep a fusion from happening that fails to load.
    """
    try:
        runtime.session(model)
    except QuantizationError as e:
        return load_reason(e)
    return None


def load_reason(error: QuantizationError) -> str:
    """Why a target's runtime could not load a model: its error without the "quantize: <runtime> cannot load" opening."""
    return str(error).removeprefix("quantize: ").split(" cannot load the model: ", 1)[-1]
