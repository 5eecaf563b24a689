"""Weight-only quantization of models larger than memory: time, peak RSS and throughput for 1, 4 and 13 GB of weights.

Each model (MatMul -> Relu layers of 8192 x 8192 float32 weights, 256 MiB
each, in one external data file) is generated here, written straight from
numpy and never held whole; `qlinear quantize --stream-weights` then runs in
a fresh process (its peak RSS is that process's, from /proc VmHWM). Before
each run the model's data is dropped from the page cache
(posix_fadvise), so the weights come from the disk. The disk's own speed is
measured beside it: a 1 GiB file written with fsync, then read back cold.
Prints a Markdown table. Needs about 2.3 times the largest model's size in
free disk (model, output, temporary files); everything is removed after.

With `--activations uint8` the run is a calibrated one instead (16 random
samples, no promotions; its evaluation on the last 3), which keeps the
weights beside the graph from 1 GiB up and runs the model in parts; with
`--ort` ONNX Runtime's `quantize_static` (QDQ, per-channel int8 weights,
uint8 activations, MinMax) quantizes the same model on the same 13
samples after it, in a fresh process too, for the same figures.

    python benchmarks/large_models.py [--sizes 1 4 13] [--weights int8] [--dir /tmp]
    python benchmarks/large_models.py --sizes 3 --activations uint8 --ort
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

SIDE = 8192  # a layer's weight is SIDE x SIDE float32: 256 MiB


def make_model(folder: Path, gigabytes: float) -> Path:
    layers = max(1, round(gigabytes * (1 << 30) / (SIDE * SIDE * 4)))
    rng = np.random.default_rng(0)
    inits, nodes, offset = [], [], 0
    with open(folder / "model.onnx.data", "wb") as f:
        for k in range(layers):
            w = rng.standard_normal((SIDE, SIDE), dtype=np.float32)
            w *= np.float32(SIDE**-0.5)
            t = TensorProto(name=f"w{k}", data_type=TensorProto.FLOAT, dims=[SIDE, SIDE], data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "model.onnx.data"), ("offset", str(offset)), ("length", str(w.nbytes))):
                t.external_data.add(key=key, value=value)
            w.tofile(f)
            offset += w.nbytes
            inits.append(t)
            x = "x" if k == 0 else f"h{k - 1}"
            nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"h{k}"])]
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIDE])],
        [helper.make_tensor_value_info(f"h{layers - 1}", TensorProto.FLOAT, ["N", SIDE])], initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def drop_cache(path: Path) -> None:
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def disk_speed(folder: Path) -> tuple[float, float]:
    """MB/s writing 1 GiB with fsync, and reading it back from the disk."""
    path = folder / "disk.bin"
    block = np.ones(64 << 20, np.uint8)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(16):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = (1 << 30) / (time.perf_counter() - start) / 1e6
    drop_cache(path)
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    read = (1 << 30) / (time.perf_counter() - start) / 1e6
    path.unlink()
    return write, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 13], help="GB of weights for each model")
    parser.add_argument("--weights", default="int8", help="int8, uint8, int4 or uint4")
    parser.add_argument("--granularity", default="per-channel")
    parser.add_argument("--activations", default=None, help="calibrate with these activations (default: weights only)")
    parser.add_argument("--dir", default=None, help="where to write the models (default: the temporary folder)")
    parser.add_argument("--ort", action="store_true", help="with --activations: ONNX Runtime's quantize_static too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        write, read = disk_speed(work)
        print(f"disk: write {write:.0f} MB/s (fsync), read {read:.0f} MB/s (cold)\n")
        print("| quantizer | model | output | time | peak RSS | read + write MB/s |")
        print("| --- | --: | --: | --: | --: | --: |")
        for gb in args.sizes:
            folder = work / f"m{gb:g}"
            folder.mkdir()
            src = make_model(folder, gb)
            drop_cache(folder / "model.onnx.data")
            out = work / "q.onnx"
            child = (
                "import sys; from qlinear.cli import main; rc = main(sys.argv[1:]); "
                "print('VmHWM', open('/proc/self/status').read().split('VmHWM:')[1].split()[0], file=sys.stderr); sys.exit(rc)"
            )
            cmd = [sys.executable, "-c", child, "quantize", str(src), "-o", str(out), "--weights", args.weights]
            cmd += ["--granularity", args.granularity, "--json"]
            if args.activations:
                cmd += ["--activations", args.activations, "--calibrate-random", "16", "--no-promote"]
            else:
                cmd += ["--activations", "none", "--stream-weights"]
            what = f"qlinear {args.weights} {args.granularity}" + (
                f", {args.activations} activations" if args.activations else ""
            )
            _run(what, cmd, folder, work)
            if args.ort and args.activations:
                drop_cache(folder / "model.onnx.data")
                ort = [
                    "import sys; sys.path.insert(0, sys.argv[1]); from large_models import ort_static; ort_static(*sys.argv[2:])"
                ]
                _run("ONNX Runtime quantize_static, int8 per-channel, uint8 activations", [
                    sys.executable, "-c", ort[0], str(Path(__file__).parent), str(src), str(out)], folder, work)  # fmt: skip
            shutil.rmtree(folder)


def _run(what: str, cmd: list[str], folder: Path, work: Path) -> None:
    """Run ``cmd`` (a quantizer writing ``work/q.onnx``) in a fresh process and print its table row; remove its output."""
    # The child prints its own peak RSS (VmHWM) last, on stderr.
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    size_in = (folder / "model.onnx.data").stat().st_size
    if proc.returncode or "VmHWM" not in proc.stderr:
        print(f"| {what} | {size_in / 1e9:.2f} GB | error: {proc.stderr.strip()[-200:]} | | | |", flush=True)
    else:
        peak_kib = int(proc.stderr.rsplit("VmHWM", 1)[1].split()[0])
        size_out = sum(f.stat().st_size for f in work.glob("q.onnx*"))
        # Each weight is read twice (its scales, then its codes) and its codes written once.
        moved = 2 * size_in + size_out
        print(
            f"| {what} | {size_in / 1e9:.2f} GB | {size_out / 1e9:.2f} GB | {seconds:.1f} s "
            f"| {peak_kib / 1024:.0f} MiB | {moved / seconds / 1e6:.0f} |",
            flush=True,
        )
    for f in work.glob("q.onnx*"):
        f.unlink()
    for f in work.glob("*.onnx.data"):  # what ONNX Runtime's quantizer leaves beside its output
        if f.parent == work:
            f.unlink()


def ort_static(model: str, out: str) -> None:
    """ONNX Runtime's quantize_static on 13 uniform random samples of [-1, 1] (qlinear's calibration), batches of 16."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    graph = onnx.load(model, load_external_data=False).graph
    name, width = graph.input[0].name, graph.input[0].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(0)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{name: rng.uniform(-1, 1, (13, width)).astype(np.float32)}])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
    )  # fmt: skip
    print("VmHWM", open("/proc/self/status").read().split("VmHWM:")[1].split()[0], file=sys.stderr)


if __name__ == "__main__":
    main()
