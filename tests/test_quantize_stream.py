"""Weight-only quantization one weight at a time: the codes the in-memory path writes, a model over 2 GB, bad external data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import qlinear
import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import main

ROWS, COLS = 256, 128


def _external(folder: Path, arrays: dict[str, np.ndarray], *, location: str = "model.onnx.data") -> list[TensorProto]:
    """Initializers whose data is written straight from ``arrays`` into one external data file in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    inits, offset = [], 0
    with open(folder / "model.onnx.data", "wb") as f:
        for name, w in arrays.items():
            kind = helper.np_dtype_to_tensor_dtype(w.dtype)
            t = TensorProto(name=name, data_type=kind, dims=list(w.shape), data_location=TensorProto.EXTERNAL)
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(w.nbytes))):
                t.external_data.add(key=key, value=value)
            w.tofile(f)
            offset += w.nbytes
            inits.append(t)
    return inits


def _save(folder: Path, graph: onnx.GraphProto, opset: int) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what ONNX Runtime 1.31 reads (helper stamps the newest)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _external_model(folder: Path, weights: list[np.ndarray], *, location: str = "model.onnx.data", opset: int = 21) -> Path:
    """MatMul -> Relu layers whose weights lie in one external data file written straight from the arrays."""
    inits = _external(folder, {f"w{k}": w for k, w in enumerate(weights)}, location=location)
    nodes = []
    for k in range(len(weights)):
        x = "x" if k == 0 else f"h{k - 1}"
        nodes += [
            helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
            helper.make_node("Relu", [f"m{k}"], [f"h{k}"], name=f"relu{k}"),
        ]
    n_in = weights[0].shape[0]
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info(f"h{len(weights) - 1}", TensorProto.FLOAT, ["N", weights[-1].shape[1]])], initializer=inits,
    )  # fmt: skip
    return _save(folder, graph, opset)


def _codes(path: Path, name: str) -> np.ndarray:
    """The stored codes of weight ``name`` of a quantized model (read alone, lazily)."""
    model = ir.load(path)
    return model.graph.initializers[f"{name}_q"].const_value.numpy()


@pytest.mark.parametrize(("weights", "granularity"), [("int8", "per-channel"), ("int4", "blocked"), ("uint4", "blocked")])
def test_streamed_codes_are_the_in_memory_codes(tmp_path, weights, granularity):
    rng = np.random.default_rng(0)
    layers = [rng.standard_normal((ROWS, ROWS)).astype(np.float32) * 0.1 for _ in range(3)]
    src = _external_model(tmp_path / "in", layers)
    options = dict(weights=weights, granularity=granularity, activations=None)
    out = tmp_path / "streamed.onnx"
    r = qq.quantize_weights_streaming(src, out, qq.QuantizeOptions(**options))
    assert r.weights == 3 and r.bytes_after < r.bytes_before / 3
    onnx.checker.check_model(str(out), full_check=True)
    feeds = {"x": rng.standard_normal((4, ROWS)).astype(np.float32)}
    whole = qq.quantize_model(
        str(src), None, eval=feeds, promote=False, bias_correction=False, gptq=False, awq=False, **options
    ).model
    inits = {t.name: t for t in whole.graph.initializer}
    for k in range(3):
        assert np.array_equal(_codes(out, f"w{k}"), qlinear.from_tensor_proto(inits[f"w{k}_q"]))
    # And the streamed model runs and stays close to the float one.
    ref, got = qo.run(str(src), feeds, backend="onnxruntime")["h2"], qo.run(str(out), feeds, backend="onnxruntime")["h2"]
    assert 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum()) > (30 if weights == "int8" else 10)


@pytest.mark.parametrize(("weights", "granularity"), [("int8", "per-channel"), ("int4", "blocked")])
def test_a_gemm_reading_its_weight_transposed_stores_it_transposed_as_the_in_memory_path_does(tmp_path, weights, granularity):
    # nn.Linear as torch exports it on a 2-D input: Gemm(x, W, b, transB=1). Stored as W transposed and transB=0, its
    # DequantizeLinear fuses into MatMulNBits; left transposed, ONNX Runtime dequantizes the weight on every run.
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    w = rng.standard_normal((COLS, ROWS)).astype(np.float32) * 0.1  # (out, in)
    inits = _external(tmp_path / "in", {"w": w})
    inits.append(onnx.numpy_helper.from_array(rng.standard_normal(COLS).astype(np.float32), "b"))
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="linear", transB=1)
    graph = helper.make_graph(
        [node], "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", COLS])], initializer=inits,
    )  # fmt: skip
    src = _save(tmp_path / "in", graph, 21)
    options = dict(weights=weights, granularity=granularity, activations=None)
    out = tmp_path / "streamed.onnx"
    qq.quantize_weights_streaming(src, out, qq.QuantizeOptions(**options))
    streamed = onnx.load(str(out))
    gemm = next(n for n in streamed.graph.node if n.op_type == "Gemm")
    assert {a.name: a.i for a in gemm.attribute}.get("transB", 0) == 0
    whole = qq.quantize_model(str(src), None, eval={"x": rng.standard_normal((4, ROWS)).astype(np.float32)}, promote=False,
                              bias_correction=False, gptq=False, awq=False, **options).model  # fmt: skip
    assert np.array_equal(
        _codes(out, "w"), qlinear.from_tensor_proto(next(t for t in whole.graph.initializer if t.name == "w_q"))
    )
    feeds = {"x": rng.standard_normal((4, ROWS)).astype(np.float32)}
    ref, got = qo.run(str(src), feeds, backend="onnxruntime")["y"], qo.run(str(out), feeds, backend="onnxruntime")["y"]
    assert 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum()) > (30 if weights == "int8" else 10)
    if granularity == "blocked":  # ONNX Runtime runs it as MatMulNBits
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
        assert "MatMulNBits" in {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
        # And the MatMulNBits form written as it streams takes it too.
        packed = tmp_path / "packed.onnx"
        qq.quantize_weights_streaming(src, packed, qq.QuantizeOptions(**options, format="matmulnbits"))
        assert {n.op_type for n in onnx.load(str(packed)).graph.node} == {"MatMulNBits"}


def test_a_model_over_2_gb(tmp_path):
    # Five weights of 436 MB: 2.2 GB of external data, written straight from numpy and removed afterwards.
    rng = np.random.default_rng(1)
    shapes = [(8192, 13312), (13312, 8192), (8192, 13312), (13312, 8192), (8192, 13312)]
    try:
        arrays = [rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02) for shape in shapes]
        src = _external_model(tmp_path / "big", arrays)
        kept = {0: arrays[0][:, :64].copy(), 3: arrays[3][:, :64].copy()}  # columns of two weights, to check
        del arrays
        assert (tmp_path / "big" / "model.onnx.data").stat().st_size > 2 << 30
        out = tmp_path / "q.onnx"
        assert main(["quantize", str(src), "-o", str(out), "--activations", "none", "--stream-weights", "--quiet"]) == 0
        onnx.checker.check_model(str(out), full_check=True)  # by path: the checker's only way past 2 GB
        model = ir.load(out)
        for k, columns in kept.items():
            codes = model.graph.initializers[f"w{k}_q"].const_value.numpy()[:, :64]
            scale = model.graph.initializers[f"w{k}_scale"].const_value.numpy()[:64]
            zp = model.graph.initializers[f"w{k}_zp"].const_value.numpy()[:64]
            assert np.array_equal(codes, qlinear.quantize_linear(columns, scale, zp, axis=1))
    finally:
        for f in tmp_path.rglob("*.data"):
            f.unlink()


def test_external_data_outside_the_folder_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    np.zeros((ROWS, ROWS), np.float32).tofile(secret)
    src = _external_model(tmp_path / "model", [np.ones((ROWS, ROWS), np.float32)], location="../secret.bin")
    with pytest.raises(QuantizationError, match="outside the model's folder; refused"):
        qq.quantize_weights_streaming(src, tmp_path / "q.onnx", qq.QuantizeOptions(activations=None))
    with pytest.raises(QuantizationError):  # the in-memory path refuses it too (qlinear.onnx.load)
        qq.quantize_model(str(src), None, calibrate_random=4)
    assert not (tmp_path / "q.onnx").exists()


def test_truncated_external_data_and_old_opsets_are_one_error(tmp_path, capsys):
    src = _external_model(tmp_path / "m", [np.ones((ROWS, ROWS), np.float32)])
    data = tmp_path / "m" / "model.onnx.data"
    with open(data, "r+b") as f:
        f.truncate(1000)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--activations", "none", "--stream-weights"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "truncated" in err and not out.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".q.onnx")]  # no temporary folder left
    old = _external_model(tmp_path / "old", [np.ones((ROWS, ROWS), np.float32)], opset=11)
    with pytest.raises(QuantizationError, match="need opset 21"):
        qq.quantize_weights_streaming(old, out, qq.QuantizeOptions(weights="int4", granularity="blocked", activations=None))


def test_a_full_disk_leaves_nothing_behind(tmp_path, monkeypatch):
    import errno

    src = _external_model(tmp_path / "m", [np.ones((ROWS, ROWS), np.float32)])

    def full(model, path, **kwargs):
        Path(path).write_bytes(b"partial")  # what a writer leaves when the disk fills mid-way
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ir, "save", full)
    out = tmp_path / "q.onnx"
    with pytest.raises(QuantizationError, match=r"cannot write .*No space left on device"):
        qq.quantize_weights_streaming(src, out, qq.QuantizeOptions(activations=None))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no output, no temporary folder
    assert (tmp_path / "m" / "model.onnx.data").stat().st_size == ROWS * ROWS * 4  # the input untouched


def _table_model(folder: Path, table: np.ndarray, weight: np.ndarray) -> Path:
    """ids -> Gather of an external table -> Relu -> MatMul of an external weight; the table's rows also an output."""
    inits = _external(folder, {"table": table, "w": weight})
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed"),
        helper.make_node("Relu", ["rows"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w"], ["y"], name="proj"),
    ]
    kind = helper.np_dtype_to_tensor_dtype(table.dtype)
    graph = helper.make_graph(
        nodes, "table", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 12])],
        [helper.make_tensor_value_info("rows", kind, ["N", 12, table.shape[1]]),
         helper.make_tensor_value_info("y", kind, ["N", 12, weight.shape[1]])], initializer=inits,
    )  # fmt: skip
    return _save(folder, graph, 21)


@pytest.mark.parametrize(
    ("weights", "granularity", "dtype"),
    [("int8", "per-channel", np.float32), ("uint8", "per-channel", np.float32), ("int4", "blocked", np.float32),
     ("uint8", "per-channel", np.float16)],
)  # fmt: skip
def test_streamed_tables_gather_their_codes_as_the_in_memory_path_does(tmp_path, weights, granularity, dtype):
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((300, 64)) * rng.uniform(0.05, 2.0, (300, 1))).astype(dtype)
    src = _table_model(tmp_path / "in", table, (rng.standard_normal((64, 32)) * 0.1).astype(dtype))
    options = dict(weights=weights, granularity=granularity, activations=None)
    out = tmp_path / "streamed.onnx"
    r = qq.quantize_weights_streaming(src, out, qq.QuantizeOptions(**options))
    assert [name for name, _, _ in r.widened] == (["table"] if weights == "int4" else [])
    onnx.checker.check_model(str(out), full_check=True)
    streamed = onnx.load(str(out))
    table_reads = [n.op_type for n in streamed.graph.node if "table_q" in n.input]
    assert table_reads == ["Gather"]  # no DequantizeLinear of the whole table
    read = {i for n in streamed.graph.node for i in n.input}
    assert [t.name for t in streamed.graph.initializer if t.name not in read] == []  # the float table and unread zero points gone
    codes = _codes(out, "table")
    assert codes.dtype == (np.uint8 if weights == "uint8" else np.int8)  # an int4 run stores its table at int8
    feeds = {"ids": rng.integers(0, 300, (5, 12)).astype(np.int64)}
    whole = qq.quantize_model(
        str(src), None, eval=feeds, promote=False, bias_correction=False, gptq=False, awq=False, **options
    ).model
    inits = {t.name: t for t in whole.graph.initializer}
    assert np.array_equal(codes, qlinear.from_tensor_proto(inits["table_q"]))
    got = qo.run(str(out), feeds, backend="onnxruntime")
    ref = qo.run(whole, feeds, backend="onnxruntime")
    assert got["rows"].dtype == dtype and np.array_equal(got["rows"], ref["rows"])  # bit for bit the in-memory path's


def test_the_command_line_names_the_tables_a_streamed_4_bit_run_stores_at_8_bits(tmp_path, capsys):
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((300, 64)) * 0.5).astype(np.float32)
    src = _table_model(tmp_path / "in", table, (rng.standard_normal((64, 32)) * 0.1).astype(np.float32))
    args = ["--stream-weights", "--weights", "int4", "--granularity", "blocked", "--activations", "none"]
    assert main(["quantize", str(src), "-o", str(tmp_path / "q.onnx"), *args]) == 0
    assert (
        "stored wider than asked: table at int8 (ONNX Runtime gathers 8-bit codes, not narrower ones)" in capsys.readouterr().out
    )


def test_streaming_is_chosen_by_the_memory_the_in_memory_path_would_take(tmp_path):
    src = _external_model(tmp_path / "in", [np.ones((ROWS, ROWS), np.float32)])
    size = sum(f.stat().st_size for f in (tmp_path / "in").iterdir())
    options = qq.QuantizeOptions(weights="int4", activations=None, granularity="blocked")
    # Six copies of the model past half the memory: one weight at a time; within it: in memory.
    why = qq.streaming_choice(src, options, memory_bytes=2 * 6 * size - 2)
    assert why is not None and "would take about" in why
    assert qq.streaming_choice(src, options, memory_bytes=2 * 6 * size) is None
    # What only the in-memory path does keeps a large model there.
    for asked in ({"exclude": ("mm0",)}, {"equalize": True}, {"opset": 22}, {"weights": "int2"}):
        assert qq.streaming_choice(src, qq.QuantizeOptions(**{**options.__dict__, **asked}), memory_bytes=1) is None
    assert qq.streaming_choice(src, qq.QuantizeOptions(weights="int4"), memory_bytes=1) is None  # activations quantized


def test_the_command_line_streams_a_weight_only_run_given_no_data_that_memory_cannot_hold(tmp_path, monkeypatch, capsys):
    src = _external_model(tmp_path / "in", [np.random.default_rng(0).standard_normal((ROWS, ROWS)).astype(np.float32)])
    args = ["--weights", "int4", "--granularity", "blocked", "--activations", "none", "--json"]
    assert main(["quantize", str(src), "-o", str(tmp_path / "memory.onnx"), *args]) == 0
    assert "streamed" not in json.loads(capsys.readouterr().out)  # it fits: the in-memory path and its report
    monkeypatch.setattr("qlinear.quantize._stream._memory_bytes", lambda: 1 << 20)
    assert main(["quantize", str(src), "-o", str(tmp_path / "streamed.onnx"), *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["streamed"] and summary["judged"] is False and "would take about" in summary["streamed_because"]
    assert np.array_equal(_codes(tmp_path / "streamed.onnx", "w0"), _codes(tmp_path / "memory.onnx", "w0"))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--exclude", "mm0"], "--exclude is not for streaming weights"),
        (["--target-sqnr", "30"], "--target-sqnr needs data"),
        (["--calibrate-random", "4"], "leave out --calibrate-random"),
        (["--report", "r.json"], "make no report and no analysis: leave out --report"),
    ],
)
def test_stream_weights_refuses_what_it_cannot_do_naming_the_flag(tmp_path, capsys, extra, named):
    src = _external_model(tmp_path / "in", [np.ones((ROWS, ROWS), np.float32)])
    out = tmp_path / "q.onnx"
    args = ["--stream-weights", "--weights", "int4", "--activations", "none", *extra]
    assert main(["quantize", str(src), "-o", str(out), *args]) == 2
    assert named in capsys.readouterr().err and not out.exists()
