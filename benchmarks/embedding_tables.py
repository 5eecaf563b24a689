"""Latency of a model whose embedding table is quantized: qlinear's gathered codes against ONNX Runtime's quantizers.

The model: token ids (a batch of 1 x 16, as one decoding step reads them,
and 16 x 64) -> an embedding table of VOCAB x WIDTH -> a LayerNormalization
-> a MatMul to 256, as a transformer's first layer reads its table. On
ONNX Runtime a ``DequantizeLinear -> Gather`` dequantizes the whole table
every run; qlinear gathers the table's int8 codes and dequantizes the rows
(the same values, bit for bit). Each model runs on ONNX Runtime (2 threads,
no spinning: the sessions take turns on the same cores), timed in
alternating rounds against the float model; medians of the rounds.

    python benchmarks/embedding_tables.py [--vocab 32000] [--width 512]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import qlinear.onnx as qo
import qlinear.quantize as qq


def float_model(vocab: int, width: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    g = qo.Graph("embedding", opset=17)
    ids = g.input("ids", "int64", ("N", "T"))
    table = (rng.standard_normal((vocab, width)) * rng.uniform(0.05, 1.0, (vocab, 1))).astype(np.float32)
    x = g.op("Gather", [table, ids], name="embed")
    x = g.op("LayerNormalization", [x, np.ones(width, np.float32), np.zeros(width, np.float32)], name="norm", axis=-1)
    g.output(g.op("MatMul", [x, (rng.standard_normal((width, 256)) * 0.05).astype(np.float32)], name="proj", output_names=["y"]))
    return g.to_model()


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    # Idle threads of the session that ran last would otherwise spin on the cores the next one runs on.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    rng = np.random.default_rng(1)
    calibration = rng.integers(0, args.vocab, (64, 16)).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = {"float": work / "float.onnx"}
        onnx.save(float_model(args.vocab, args.width), paths["float"])
        paths["qlinear int8 (defaults, no promotion)"] = work / "qlinear.onnx"
        qq.quantize_model(
            str(paths["float"]), paths["qlinear int8 (defaults, no promotion)"], {"ids": calibration}, promote=False
        )
        paths["ORT quantize_dynamic int8"] = work / "ort_dynamic.onnx"
        quantize_dynamic(str(paths["float"]), str(paths["ORT quantize_dynamic int8"]), weight_type=QuantType.QInt8)

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.batches = iter({"ids": calibration[i : i + 16]} for i in range(0, len(calibration), 16))

            def get_next(self):
                return next(self.batches, None)

        paths["ORT quantize_static QDQ"] = work / "ort_static.onnx"
        quantize_static(
            str(paths["float"]), str(paths["ORT quantize_static QDQ"]), Reader(), op_types_to_quantize=["Gather", "MatMul"]
        )
        sessions = {label: _session(p) for label, p in paths.items()}
        print(f"table {args.vocab} x {args.width}; ONNX Runtime {ort.__version__}, 2 threads; median of {args.rounds} rounds\n")
        print("| model | batch | ms | latency / float |\n| --- | --- | --: | --: |")
        for shape in ((1, 16), (16, 64)):
            feeds = {"ids": rng.integers(0, args.vocab, shape).astype(np.int64)}
            times: dict[str, list[float]] = {label: [] for label in sessions}
            for s in sessions.values():
                s.run(None, feeds)
            for _ in range(args.rounds):
                for label, s in sessions.items():  # one round: every model once, in turn
                    start = time.perf_counter()
                    s.run(None, feeds)
                    times[label].append((time.perf_counter() - start) * 1e3)
            base = statistics.median(times["float"])
            for label, t in times.items():
                ms = statistics.median(t)
                print(f"| {label} | {shape[0]} x {shape[1]} | {ms:.3f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
