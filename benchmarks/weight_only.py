"""Data-free 4-bit weight-only quantization: qlinear against ONNX Runtime's MatMulNBitsQuantizer, one run.

No calibration data on either side: blocks of 32 along the input
channels, 4-bit weights, float activations. The rows:

- qlinear's command, ``--weights int4 --activations none --granularity
  blocked --block-size 32``, with each weight range method
  (``--weight-clip minmax``: round to nearest; ``mse``: the least-error
  clip per block; ``search``: the least-error scale and integer zero
  point per block), and round to nearest written as MatMulNBits
  (``--format matmulnbits``), and round to nearest given calibration
  inputs (the decoder's: its eval inputs) (the run then times ONNX Runtime's MatMulNBits accuracy level
  4 against 0 and keeps the faster where the target holds);
- ONNX Runtime's ``MatMulNBitsQuantizer`` with round to nearest
  (``DefaultWeightOnlyQuantConfig``, asymmetric and symmetric), HQQ
  (``HQQWeightOnlyQuantConfig``) and k-quant
  (``KQuantWeightOnlyQuantConfig``).

The models: the character transformer of ``benchmarks/quantizers.py``
(trained here, its held-out windows) and a generated decoder block of
realistic width (``--width`` 2048: the attention's four MatMuls of width x
width and an MLP of width x 2.75 width gated, its weights normal with 1%
of their input rows eight times the rest, as language models' outlier
channels are). Each quantizer runs in a fresh process (its time and peak
RSS are that process's). Each layer's stored weight is read back by
running the quantized MatMul (a MatMulNBits or a DequantizeLinear and
MatMul) on an identity matrix, on ONNX Runtime at accuracy level 0, so
every format is read the same way. Figures: the weight SQNR of every
layer (median and worst), the output SQNR on the held-out inputs and,
for the text model, the agreement of the next character with the float
model; latency over the float model's on ONNX Runtime (2 threads, pairs
alternating, medians), at one window or one sequence of 32 tokens.

    python benchmarks/weight_only.py [--models text decoder] [--width 2048] [--methods ROW ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

BLOCK = 32
METHODS = {
    "qlinear int4, round to nearest": {"quantizer": "qlinear", "weights": "int4", "weight_clip": "minmax"},
    "qlinear int4, mse clip": {"quantizer": "qlinear", "weights": "int4", "weight_clip": "mse"},
    "qlinear int4, search": {"quantizer": "qlinear", "weights": "int4", "weight_clip": "search"},
    "qlinear int4, MatMulNBits form": {
        "quantizer": "qlinear",
        "weights": "int4",
        "weight_clip": "minmax",
        "format": "matmulnbits",
    },
    "qlinear int4, given data": {"quantizer": "qlinear", "weights": "int4", "weight_clip": "minmax", "data": True},
    "qlinear uint4, round to nearest": {"quantizer": "qlinear", "weights": "uint4", "weight_clip": "minmax"},
    "qlinear uint4, mse clip": {"quantizer": "qlinear", "weights": "uint4", "weight_clip": "mse"},
    "qlinear uint4, search": {"quantizer": "qlinear", "weights": "uint4", "weight_clip": "search"},
    "ORT RTN, asymmetric": {"quantizer": "ort", "algo": "rtn", "symmetric": False},
    "ORT RTN, symmetric": {"quantizer": "ort", "algo": "rtn", "symmetric": True},
    "ORT HQQ": {"quantizer": "ort", "algo": "hqq"},
    "ORT k-quant": {"quantizer": "ort", "algo": "kquant"},
}


def decoder(path: Path, width: int) -> dict:
    """A decoder block's MatMuls on a residual stream: attention's q, k, v, o and a gated MLP."""
    rng = np.random.default_rng(0)
    hidden = int(2.75 * width) // 64 * 64

    def weight(name: str, k: int, n: int) -> onnx.TensorProto:
        w = rng.normal(0, k**-0.5, (k, n)).astype(np.float32)
        w[rng.choice(k, max(1, k // 100), replace=False)] *= 8  # outlier input channels
        return numpy_helper.from_array(w, name)

    inits = [weight(f"w_{n}", width, width) for n in "qkvo"]
    inits += [weight("w_gate", width, hidden), weight("w_up", width, hidden), weight("w_down", hidden, width)]
    mm = lambda a, w, out: helper.make_node("MatMul", [a, w], [out], name=out)  # noqa: E731
    nodes = [mm("x", f"w_{n}", n) for n in "qkv"]
    nodes += [helper.make_node("Sum", ["q", "k", "v"], ["qkv"], name="qkv"), mm("qkv", "w_o", "o")]
    nodes += [helper.make_node("Add", ["x", "o"], ["h"], name="residual1")]
    nodes += [mm("h", "w_gate", "gate"), mm("h", "w_up", "up")]
    nodes += [
        helper.make_node("Sigmoid", ["gate"], ["sig"], name="sig"),
        helper.make_node("Mul", ["gate", "sig"], ["silu"], name="silu"),
    ]
    nodes += [helper.make_node("Mul", ["silu", "up"], ["mlp_in"], name="gated"), mm("mlp_in", "w_down", "down")]
    nodes += [helper.make_node("Add", ["h", "down"], ["y"], name="residual2")]
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", width])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
    x = rng.normal(0, 1, (8, 32, width)).astype(np.float32)
    return {"model": str(path), "eval": {"x": x}, "labels": None, "timed": {"x": x[:1]}}


def text(work: Path) -> dict:
    import quantizers

    d = quantizers._text(work)
    return {**d, "timed": {k: v[:1] for k, v in d["eval"].items()}}


def worker(spec: dict) -> dict:
    """Quantize once, in this fresh process: its seconds and peak RSS."""
    from qlinear.quantize._memory import peak_rss_bytes

    start = time.perf_counter()
    if spec["quantizer"] == "qlinear":
        import qlinear.quantize as qq

        # Given data (its last fifth held out), the run times ONNX Runtime's settings too.
        data = dict(np.load(spec["data"])) if spec.get("data") else None
        qq.quantize_model(
            spec["model"], spec["out"], data, weights=spec["weights"], activations=None, granularity="blocked",
            block_size=BLOCK, weight_clip=spec["weight_clip"], format=spec.get("format", "qdq"),
        )  # fmt: skip
    else:
        from onnxruntime.quantization import matmul_nbits_quantizer as nbits

        algo = spec["algo"]
        if algo == "rtn":
            config = nbits.DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=spec["symmetric"], accuracy_level=0)
        elif algo == "hqq":
            config = nbits.HQQWeightOnlyQuantConfig(block_size=BLOCK, bits=4)
        else:
            config = nbits.KQuantWeightOnlyQuantConfig()
        q = nbits.MatMulNBitsQuantizer(onnx.load(spec["model"]), block_size=BLOCK, accuracy_level=0, algo_config=config)
        q.process()
        onnx.save(q.model.model, spec["out"], save_as_external_data=True, location=Path(spec["out"]).name + ".data")
    return {"seconds": time.perf_counter() - start, "peak_rss_bytes": peak_rss_bytes()}


def stored_weights(path: str, float_model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Each float MatMul weight as the quantized model stores it: its MatMul run on an identity matrix."""
    from qlinear.quantize._evaluate import Runner
    from qlinear.quantize.targets import ORT_CPU

    q = onnx.load(path)
    inits = {t.name: t for t in q.graph.initializer}
    made = {o: n for n in q.graph.node for o in n.output}
    shapes = {t.name: tuple(t.dims) for t in float_model.graph.initializer}
    out = {}
    for node in float_model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in shapes:
            continue
        k = shapes[node.input[1]][0]
        layer = next((n for n in q.graph.node if n.op_type in ("MatMul", "MatMulNBits") and node.output[0] in n.output), None)
        if layer is None:  # rewritten into another op (a Gemm with its bias): not compared
            continue
        # The layer with its weight side (initializers and the nodes computing from them), fed an identity matrix.
        keep, stack = [], [i for i in layer.input[1:] if i]
        while stack:
            name = stack.pop()
            if name in made:
                keep.append(made[name])
                stack.extend(i for i in made[name].input if i)
        nodes = [*reversed(keep), helper.make_node(layer.op_type, ["eye", *layer.input[1:]], ["w"], domain=layer.domain,
                                                   **{a.name: helper.get_attribute_value(a) for a in layer.attribute})]  # fmt: skip
        read = {i for n in nodes for i in n.input}
        graph = helper.make_graph(
            nodes, "layer", [helper.make_tensor_value_info("eye", TensorProto.FLOAT, [k, k])],
            [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)], [inits[n] for n in read if n in inits],
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=list(q.opset_import))
        model.ir_version = q.ir_version
        out[node.input[1]] = Runner(model, [], ORT_CPU)({"eye": np.eye(k, dtype=np.float32)})["w"]
    return out


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10((ref**2).sum() / max(((ref - got) ** 2).sum(), 1e-300)))


def figures(d: dict, path: str) -> dict:
    """Weight SQNRs, output SQNR, agreement and latency of the model at ``path`` against the float model."""
    from qlinear.quantize._evaluate import Runner
    from qlinear.quantize._latency import PairTimer
    from qlinear.quantize.targets import ORT_CPU

    float_model = onnx.load(d["model"])
    weights = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    stored = stored_weights(path, float_model)
    layer_db = [sqnr(weights[name], w) for name, w in stored.items()]
    output = float_model.graph.output[0].name
    ref = Runner(float_model, [], ORT_CPU)(d["eval"])[output]
    got = Runner(onnx.load(path), [], ORT_CPU)(d["eval"])[output]
    agreement = float((ref.argmax(-1) == got.argmax(-1)).mean()) if d["labels"] is not None else None
    latency = PairTimer(float_model, d["timed"], ORT_CPU).time(onnx.load(path))
    return {
        "layers": len(layer_db), "weight_db_median": float(np.median(layer_db)), "weight_db_worst": min(layer_db),
        "output_db": sqnr(ref, got), "agreement": agreement, "latency": None if latency is None else latency.ratio,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["text", "decoder"], choices=["text", "decoder"])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="ROW",
                        help="the rows to run (default: all)")  # fmt: skip
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="qlinear-weight-only-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        "| model | quantizer | weight SQNR dB, median (worst) | output SQNR dB | agreement | latency | seconds | peak RSS MiB |"
    )
    print("| --- | --- | --: | --: | --: | --: | --: | --: |")
    for name in args.models:
        d = text(work) if name == "text" else decoder(work / f"decoder{args.width}.onnx", args.width)
        for label, method in ((label, METHODS[label]) for label in args.methods):
            out = work / f"{name}-{label.replace(' ', '_').replace(',', '')}.onnx"
            spec = {**method, "model": d["model"], "out": str(out)}
            if method.get("data"):
                inputs = work / f"{name}-inputs.npz"
                np.savez(inputs, **d.get("cal", d["eval"]))  # the calibration inputs where the model has some
                spec["data"] = str(inputs)
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {name} | {label} | failed: {tail[:120]} | | | | | |", flush=True)
                continue
            # The last line holds it (ONNX Runtime's k-quant prints a progress bar with no newline before it).
            run = json.loads(proc.stdout[proc.stdout.rindex('{"seconds"') :])
            f = figures(d, str(out))
            agreement = "-" if f["agreement"] is None else f"{100 * f['agreement']:.2f}%"
            latency = "-" if f["latency"] is None else f"{f['latency']:.2f}"
            print(
                f"| {name} | {label} | {f['weight_db_median']:.2f} ({f['weight_db_worst']:.2f}) | {f['output_db']:.2f} | "
                f"{agreement} | {latency} | {run['seconds']:.1f} | {run['peak_rss_bytes'] / 2**20:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
