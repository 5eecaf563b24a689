"""Embedding tables gathered as codes: the rows' values bit for bit those of dequantizing the whole table."""

from __future__ import annotations

import io
import sysconfig
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from rich.console import Console

import qlinear
import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._fusion import GATHER_CODES
from qlinear.quantize._report_print import print_report

VOCAB, WIDTH, CONTEXT = 96, 48, 24


def _model(*, table_reads_quantized: bool, dtype: type = np.float32) -> onnx.ModelProto:
    """ids -> embedding (rows of differing norms; also an output) -> [Relu] -> MatMul, in ``dtype``.

    With the Relu the table's output is no quantized activation.
    """
    rng = np.random.default_rng(0)
    g = qo.Graph("embedding", opset=17)
    ids = g.input("ids", "int64", ("N", CONTEXT))
    table = (rng.standard_normal((VOCAB, WIDTH)) * rng.uniform(0.05, 2.0, (VOCAB, 1))).astype(dtype)
    x = g.op("Gather", [table, ids], name="embed", output_names=["rows"])
    g.output(x)
    if not table_reads_quantized:
        x = g.op("Relu", [x], name="relu")
    g.output(g.op("MatMul", [x, (rng.standard_normal((WIDTH, 16)) * 0.2).astype(dtype)], name="proj", output_names=["y"]))
    return g.to_model()


def _ids(count: int) -> np.ndarray:
    """Windows of Python's textwrap source as byte tokens (printable ASCII and newline)."""
    b = np.frombuffer((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_bytes(), np.uint8)
    b = b[((b >= 32) & (b < 127)) | (b == 10)]
    tokens = np.where(b == 10, 95, b.astype(np.int64) - 32)
    starts = np.random.default_rng(1).integers(0, tokens.size - CONTEXT, count)
    return tokens[starts[:, None] + np.arange(CONTEXT)[None, :]]


def _table_reads(model: onnx.ModelProto) -> list[str]:
    """The op types that read the table's codes."""
    table = next(t.name for t in model.graph.initializer if t.dims == [VOCAB, WIDTH])
    return [n.op_type for n in model.graph.node if table in n.input]


@pytest.mark.parametrize("granularity", ["per-channel", "blocked", "per-tensor"])
@pytest.mark.parametrize("weights", ["int8", "uint8"])
def test_gathered_codes_equal_the_whole_table_dequantized(weights, granularity):
    ids = _ids(40)
    block = {"block_size": 16} if granularity == "blocked" else {}
    r = qq.quantize_model(
        _model(table_reads_quantized=False), None, {"ids": ids}, weights=weights, granularity=granularity, **block,
        activations=None, promote=False,
    )  # fmt: skip
    g = r.model.graph
    assert _table_reads(r.model) == ["Gather"]
    read = {i for n in g.node for i in n.input}
    assert [t.name for t in g.initializer if t.name not in read] == []  # the whole-table parameters gone
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    codes = next(v for v in inits.values() if v.shape == (VOCAB, WIDTH))
    # The oracle: the whole table dequantized by qlinear (bit for bit the specification), then its rows taken.
    # The stored parameters are read back from the table's row Gathers (or the one DequantizeLinear).
    rows_of = {n.output[0]: inits[n.input[0]] for n in g.node if n.op_type == "Gather" and n.input[0] in inits}
    writer = next(n for n in g.node if "rows" in n.output)
    if granularity == "per-tensor":
        assert writer.op_type == "DequantizeLinear"
        whole = qlinear.dequantize_linear(codes, *(inits[t] for t in writer.input[1:]))
    elif granularity == "blocked":
        assert writer.op_type == "DequantizeLinear" and r.report.settings.opset == 21
        scale, zp = (rows_of[t] for t in writer.input[1:])
        assert scale.shape == (VOCAB, WIDTH // 16)
        whole = qlinear.dequantize_linear(codes, scale, zp, axis=1, block_size=16)
    else:  # (codes - zero point) * scale as Cast, Sub, Mul, at the model's own opset
        assert writer.op_type == "Mul" and r.report.settings.opset == 17
        scale = next(rows_of[t] for t in writer.input if t in rows_of)
        zp_node = next((n for n in g.node if n.op_type == "Sub"), None)
        zp = None if zp_node is None else rows_of[zp_node.input[1]]
        assert (zp_node is not None) == (weights == "uint8")  # a symmetric table needs no Sub
        stored_zp = None if zp is None else zp.reshape(-1).astype(np.dtype(weights))
        whole = qlinear.dequantize_linear(codes, scale.reshape(-1), stored_zp, axis=0)
    rows = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["rows"], {"ids": ids})[0]
    np.testing.assert_array_equal(rows, whole[ids])
    node = next(n for n in r.report.nodes if n.name == "embed")
    assert node.runs_as == GATHER_CODES and node.fused


@pytest.mark.parametrize("weights", ["int8", "uint8"])
def test_a_float16_models_table_is_gathered_bit_for_bit(weights):
    ids = _ids(40)
    r = qq.quantize_model(
        _model(table_reads_quantized=False, dtype=np.float16), None, {"ids": ids}, weights=weights, activations=None,
        promote=False,
    )  # fmt: skip
    g = r.model.graph
    assert _table_reads(r.model) == ["Gather"]
    cast = next(n for n in g.node if n.op_type == "Cast")
    assert cast.attribute[0].i == onnx.TensorProto.FLOAT16  # the rows in the model's own type
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    codes = next(v for v in inits.values() if v.shape == (VOCAB, WIDTH))
    rows_of = {n.output[0]: inits[n.input[0]] for n in g.node if n.op_type == "Gather" and n.input[0] in inits}
    writer = next(n for n in g.node if "rows" in n.output)
    scale = next(rows_of[t] for t in writer.input if t in rows_of).reshape(-1)
    sub = next((n for n in g.node if n.op_type == "Sub"), None)
    zp = None if sub is None else rows_of[sub.input[1]].reshape(-1).astype(np.dtype(weights))
    assert scale.dtype == np.float16 and (sub is not None) == (weights == "uint8")
    whole = qlinear.dequantize_linear(codes, scale, zp, axis=0)
    rows = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["rows"], {"ids": ids})[0]
    assert rows.dtype == np.float16 and np.array_equal(rows.view(np.uint16), whole[ids].view(np.uint16))
    assert r.report.fusion.unfused == []


def test_a_4_bit_run_stores_its_tables_at_8_bits_and_gathers_them():
    ids = _ids(40)
    r = qq.quantize_model(
        _model(table_reads_quantized=False), None, {"ids": ids}, weights="int4", granularity="blocked", activations=None,
        promote=False,
    )  # fmt: skip
    types = {n.name: (n.weight_type, n.runs_as) for n in r.report.nodes}
    assert types == {"embed": ("int8", GATHER_CODES), "proj": ("int4", "MatMulNBits")}
    assert [(w.name, w.asked, w.stored, w.reason) for w in r.report.widened] == [
        ("embed", "int4", "int8", "ONNX Runtime gathers 8-bit codes, not narrower ones")
    ]
    assert _table_reads(r.model) == ["Gather"] and r.report.fusion.unfused == []
    out = io.StringIO()
    print_report(r.report, Console(file=out, width=200, color_system=None))
    assert "weights widened  embed int4 -> int8" in out.getvalue()


def test_a_table_whose_output_is_a_quantized_activation_gets_its_quantizelinear_after_the_rows():
    ids = _ids(60)
    r = qq.quantize_model(_model(table_reads_quantized=True), None, {"ids": ids}, promote=False)
    nodes = list(r.model.graph.node)
    writer = next(k for k, n in enumerate(nodes) if "rows" in n.output)
    q = next(k for k, n in enumerate(nodes) if n.op_type == "QuantizeLinear" and "rows" in n.input)
    gather = next(k for k, n in enumerate(nodes) if n.name == "embed")
    assert gather < writer < q  # the rows are gathered, dequantized, then quantized for the MatMul
    assert {n.name: n.runs_as for n in r.report.nodes} == {"embed": GATHER_CODES, "proj": "MatMulIntegerToFloat"}
    assert r.report.output.sqnr_db > 35
