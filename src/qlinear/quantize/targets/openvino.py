"""OpenVINO's CPU plugin (``--target openvino``): QDQ models it runs as int8 kernels, judged and timed on OpenVINO.

OpenVINO reads the ONNX file itself: its frontend turns each activation
QuantizeLinear into a FakeQuantize and each DequantizeLinear into
Convert -> Subtract -> Multiply, and its low-precision transformations
run a Conv, MatMul or Gemm in int8 where its activation input has a
per-tensor 8-bit Q/DQ and its weight int8 codes of zero point 0 (per
output channel). What differs from ONNX Runtime's CPU provider, as
measured on OpenVINO 2026.4.1 (docs/notes/2026-11-27-openvino-cpu-qdq.md):

- weights must be symmetric int8 (a zero point gives a float Conv), so
  the integer weight type is int8 alone;
- a Concat of inputs of different scales leaves the Conv after it in
  float unless the Concat's output is quantized again, which qlinear does
  not give them one scale for yet: a Concat is no integer join here, and
  its reader quantizes its output (then the Conv is int8);
- a MatMul of two activations (attention's) runs int8 only where its
  first input has zero point 0: that input is int8, symmetric;
- its int8 Conv dequantizes its own result (no QuantizeLinear after it is
  needed), so a Conv's output is quantized only where a reader takes it
  quantized: a SiLU after a Conv and a detector's post-processing stay
  float, as NNCF places them. With a Q on every Conv's output, OpenVINO
  computed YOLOv8n's head at 12 dB against the float model where ONNX
  Runtime computed the same file at 40 dB;
- 16-bit Q/DQ is stripped and the op runs in float: the ladder has no
  16-bit activations (as on ONNX Runtime);
- a weight-only Conv's weights are decompressed when the model is
  compiled, and a weight-only MatMul's stay compressed and are multiplied
  in float: both float by design.

Calibration, the analysis, the search, the latency pairs and the
evaluation run on OpenVINO (``pip install 'qlinear[openvino]'``), at
``INFERENCE_PRECISION_HINT`` f32: on processors with bf16 its default runs
every float part in bf16, which is not the model's arithmetic. The fusion
check reads what the plugin compiled: each node of its runtime model
names the ONNX nodes it took in, and its kernel (``primitiveType``) ends
in ``I8`` where it is an integer one. The speed trials read the plugin's
own counters (``PERF_COUNT``): each kernel's time, counted to the ONNX
node it took in.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import save
from qlinear.onnx._passes import Sequential
from qlinear.quantize._fusion import FusionCheck
from qlinear.quantize._node_placement import COMPUTE_OPS
from qlinear.quantize._precision import FULL_LADDER, Ladder
from qlinear.quantize._qdq_names import CODES, VALUES
from qlinear.quantize.targets._ort_profile import PROFILED_RUNS, WARM_UP_RUNS
from qlinear.quantize.targets._target import Placement, Target
from qlinear.quantize.targets.ort_cpu import ORT_CPU

__all__ = ["OPENVINO", "available"]

_EXTRA = "pip install 'qlinear[openvino]'"
# The model's own arithmetic: f32, not the bf16 the plugin picks by default on processors that have it.
_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
_SIXTEEN_BIT = frozenset({"int16", "uint16"})
_FOUR_BIT = frozenset({"int4", "uint4", "int2", "uint2"})
_CORE = None


def available() -> str | None:
    """Why the target cannot run here (OpenVINO missing: the extra to install), or None."""
    if importlib.util.find_spec("openvino") is None:
        return f"target openvino needs OpenVINO: {_EXTRA}"
    return None


def _core():
    global _CORE
    if _CORE is None:
        why = available()
        if why is not None:
            raise QuantizationError(f"quantize: {why}")
        import openvino

        _CORE = openvino.Core()
    return _CORE


class _Session:
    """A model compiled by OpenVINO's CPU plugin, run as the quantizer runs sessions: ``run(output names or None, feeds)``."""

    def __init__(self, compiled: Any) -> None:
        import openvino

        self.compiled = compiled
        self._request = compiled.create_infer_request()
        self._ports = {name: port for port in compiled.outputs for name in port.get_names()}
        # The plugin's Python API hands bfloat16 tensors over as float16 arrays of their bits, both ways.
        bf16 = openvino.Type.bf16
        self._bf16_inputs = {name for port in compiled.inputs if port.get_element_type() == bf16 for name in port.get_names()}
        self._bf16_outputs = {port.get_index() for port in compiled.outputs if port.get_element_type() == bf16}

    @property
    def profiling_info(self) -> Any:
        """The plugin's counters of the last run, a kernel each (compiled with ``PERF_COUNT``)."""
        return self._request.profiling_info

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = {name: _bf16_tensor(a) if name in self._bf16_inputs else a for name, a in feeds.items()}
        result = self._request.infer(feeds)
        ports = list(self.compiled.outputs) if names is None else [self._ports[name] for name in names]
        out = [np.array(result[port]) for port in ports]  # copies: the request reuses its buffers
        return [a.view(ml_dtypes.bfloat16) if p.get_index() in self._bf16_outputs else a for a, p in zip(out, ports, strict=True)]


def _bf16_tensor(a: np.ndarray) -> Any:
    """A bfloat16 array as the plugin's bfloat16 tensor: its bits copied in (the API's float16 view of them)."""
    import openvino

    values = np.ascontiguousarray(a, ml_dtypes.bfloat16)
    tensor = openvino.Tensor(openvino.Type.bf16, openvino.Shape(list(values.shape)))
    tensor.data[...] = values.view(tensor.data.dtype)
    return tensor


def _compiled(model: onnx.ModelProto | None, path: str | None, threads: int, *, counted: bool = False) -> Any:
    """``model`` (or the file at ``path``) compiled; ``counted``: with each kernel's time kept (its profile)."""
    core = _core()
    config = {**_CONFIG, **({"INFERENCE_NUM_THREADS": threads} if threads else {}), **({"PERF_COUNT": True} if counted else {})}
    try:
        if path is not None:
            return core.compile_model(core.read_model(str(path)), "CPU", config)
        with tempfile.TemporaryDirectory(prefix="qlinear-openvino-") as folder:
            file = Path(folder) / "model.onnx"
            save(model, file)  # the model left as it was; its large tensors and lazy weights beside it
            return core.compile_model(core.read_model(str(file)), "CPU", config)
    except QuantizationError:
        raise
    except Exception as e:  # OpenVINO raises RuntimeError and its own types
        raise QuantizationError(f"quantize: OpenVINO cannot load the model: {_why_not_loaded(e)}") from None


def _why_not_loaded(e: Exception) -> str:
    """OpenVINO's reason in one line: the ops its ONNX frontend could not convert and the first such node, where it says.

    Its messages open with the C++ source line that raised (``Exception
    from src/inference/src/cpp/core.cpp:84:``) and end with a summary.
    """
    text = str(e)
    ops = re.search(r"Conversion is failed for: ([^\n]+)", text)
    if ops:
        node = re.search(r"<Node\((\w+)\): ([^>]*)>'?:?\s*(?:Check '[^\n]*\n)?(?:FrontEnd API failed[^\n]*\n)?([^\n]*)", text)
        first = f" (first: the {node[1]} writing {node[2]}: {node[3].strip()})" if node and node[3].strip() else ""
        return f"its ONNX frontend cannot convert {ops[1].strip()}{first}"
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Exception from ")]
    return lines[0] if lines else type(e).__name__


def session(model: onnx.ModelProto | None, *, threads: int = 0, path: str | None = None, **_: Any) -> _Session:
    """The model compiled for OpenVINO's CPU plugin (``arena``, ``spinning``: ONNX Runtime's, nothing to set here)."""
    return _Session(_compiled(model, path, threads))


def node_times(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[tuple[dict[str, float], float]] | None:
    """For each batch of ``feeds``: the seconds a run of ``model`` takes in each of its nodes, and a run's seconds.

    From the plugin's own counters (``PERF_COUNT``), :data:`PROFILED_RUNS`
    runs a batch after two that are not counted. A kernel's time is the
    model node it took in: the compute node (Conv, MatMul, Gemm) among the
    ONNX nodes it names, else the first of them; a kernel the plugin added
    (a layout reorder) names none and keeps its own name. None where
    OpenVINO cannot load or run the model.
    """
    try:
        compiled = _compiled(model, None, 0, counted=True)
        session = _Session(compiled)
        node_of = _kernel_nodes(compiled, model)
        out = []
        for batch in feeds:
            for _ in range(WARM_UP_RUNS):
                session.run([], dict(batch))
            times: dict[str, float] = {}
            run = 0.0
            for _ in range(PROFILED_RUNS):
                start = time.perf_counter()
                session.run([], dict(batch))
                run += (time.perf_counter() - start) / PROFILED_RUNS
                for kernel in session.profiling_info:
                    if str(kernel.status).endswith("EXECUTED"):
                        node = node_of.get(kernel.node_name, kernel.node_name)
                        times[node] = times.get(node, 0.0) + kernel.real_time.total_seconds() / PROFILED_RUNS
            out.append((times, run))
    except Exception:  # OpenVINO raises RuntimeError and its own types (and QuantizationError where it cannot load)
        return None
    return out


@dataclass(frozen=True)
class _Kernel:
    """One node of the plugin's runtime model: its name, the ONNX names it took in and the model nodes they are."""

    name: str
    taken: tuple[str, ...]
    nodes: tuple[str, ...]
    layer: str
    kernel: str


def _kernels(compiled: Any, model: onnx.ModelProto) -> list[_Kernel]:
    """The compiled model's kernels, each with the model nodes it took in (its ``originalLayersNames``).

    A name it took in is a model node's, or has one's name and a "/" suffix
    (the longest such prefix), or is a tensor's (its producer's).
    """
    names = {n.name for n in model.graph.node if n.name}
    producer = {t: n.name for n in model.graph.node for t in n.output if t}

    def node_of(taken: str) -> str | None:
        name = taken
        while name:
            if name in names:
                return name
            name = name.rpartition("/")[0]
        return producer.get(taken)

    found = []
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        read = {key: str(info[key].astype(str)) for key in ("originalLayersNames", "layerType", "primitiveType") if key in info}
        taken = tuple(t for t in read.get("originalLayersNames", "").split(",") if t)
        nodes = tuple(dict.fromkeys(m for m in map(node_of, taken) if m is not None))
        found.append(_Kernel(op.get_friendly_name(), taken, nodes, read.get("layerType", ""), read.get("primitiveType", "")))
    return found


def _kernel_nodes(compiled: Any, model: onnx.ModelProto) -> dict[str, str]:
    """Each kernel of the compiled model (by its name in the profile) and the model node its time counts to."""
    compute = {n.name for n in model.graph.node if n.op_type in COMPUTE_OPS}
    return {k.name: next((m for m in k.nodes if m in compute), k.nodes[0]) for k in _kernels(compiled, model) if k.nodes}


def check_fusion(model: onnx.ModelProto, nodes: list[str]) -> FusionCheck | None:
    """Which of ``nodes`` OpenVINO's CPU plugin runs as integer kernels, from its runtime model; None where it cannot load it."""
    try:
        compiled = _compiled(model, None, 0)
    except QuantizationError:
        return None
    ran = _kernels(compiled, model)
    by_node: dict[str, list[_Kernel]] = {}
    for k in ran:
        for node in k.nodes:
            by_node.setdefault(node, []).append(k)
    runs_as, fused = {}, {}
    for name in nodes:
        match = by_node.get(name, [])
        integer = [k for k in match if k.kernel.lower().endswith("i8")]
        chosen = (integer or match or [None])[0]
        runs_as[name] = "removed" if chosen is None else f"{chosen.layer} ({chosen.kernel})" if chosen.kernel else chosen.layer
        fused[name] = bool(integer)
    # A (de)quantization the plugin runs as its own pass, not taken into an integer kernel.
    left = sum(1 for k in ran if not k.kernel.lower().endswith("i8") and any(n.endswith((CODES, VALUES)) for n in k.taken))
    return FusionCheck(runs_as, fused, left)


def float_by_design(op_type: str, weight_type: str | None, activation_type: str | None) -> str | None:
    """Why OpenVINO's CPU plugin runs a node of these types in float whatever the layout, or None."""
    if activation_type in _SIXTEEN_BIT:
        return "16-bit activations: OpenVINO strips 16-bit Q/DQ and runs the op in float"
    if activation_type is None and op_type in ("Conv", "ConvTranspose"):
        return "a weight-only Conv: OpenVINO decompresses its weights when it compiles the model (a smaller file only)"
    if activation_type is None:
        return "weight-only: OpenVINO keeps the weights compressed and multiplies in float (a smaller, lighter model)"
    if weight_type is not None and weight_type != "int8":
        return f"{weight_type} weights: OpenVINO's integer kernels take int8 weights of zero point 0"
    return None


def _run_notes(fusion: FusionCheck, judged: bool) -> list[str]:
    return [
        "OpenVINO's CPU plugin runs float parts in bf16 on processors that have it, unless told otherwise: the figures here "
        'are at f32; compile the model with {"INFERENCE_PRECISION_HINT": "f32"} to get them'
    ]


OPENVINO = Target(
    name="openvino",
    runtime="OpenVINO",
    providers=("CPU",),
    session=session,
    prepare=ORT_CPU.prepare,  # float-exact rewrites: a Gemm, folded normalizations and affines run as well here
    finalize=Sequential(),
    check_fusion=check_fusion,
    float_by_design=float_by_design,
    ladder=Ladder(FULL_LADDER.weights, {}),
    placement=Placement(
        integer_weight_types=frozenset({"int8"}),
        table_types=dict(ORT_CPU.placement.table_types),
        widened_table="OpenVINO gathers 8-bit codes, not narrower ones",
        unfused_weight_ops=ORT_CPU.placement.unfused_weight_ops,
        fused_pools=frozenset({"AveragePool", "GlobalAveragePool"}),
        integer_joins=frozenset({"Add", "Mul"}),
        clamps_folded=frozenset({"Relu", "Clip"}),
        blocked_float_ops={"MatMul": None, "Gemm": None, "Conv": None},
        unloadable_activations={},
        unloadable_why="",
        column_multiples={},
        column_multiple_why="",
        signed_matmul_inputs=True,  # its int8 MatMul of two activations takes no zero point on the first
        # Its int8 Conv dequantizes its own result: a Q on the output helps only a reader that takes it quantized.
        quantized_conv_outputs=False,
    ),
    run_notes=_run_notes,
    requires=available,
    backend="openvino",
    node_times=node_times,
)
