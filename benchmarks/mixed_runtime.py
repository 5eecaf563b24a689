"""Whole QDQ models with weight types ONNX Runtime lacks: backend="onnxruntime+qlinear" against "qlinear" and ONNX Runtime.

The demo digits CNN and the character transformer of benchmarks/quantizers.py,
quantized weight-only with float4e2m1 and int2 weights (blocks of 32 / 16),
run on a batch of 64 by:

- ``qlinear``: onnx's reference evaluator with qlinear's Q/DQ operators;
- ``onnxruntime+qlinear``: the weights dequantized once by qlinear, the
  graph on ONNX Runtime (graph optimizations off, as that backend runs);
- ONNX Runtime itself on the same model quantized with int8 weights (the
  nearest model it can run), one session with its default optimizations,
  as a user would run it.

Each time is the median of alternating rounds, after one warm-up call (which
builds the sessions). Prints a Markdown table.

    pip install -e '.[examples]'
    python benchmarks/mixed_runtime.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
import onnx

import qlinear.quantize as qq
from qlinear.onnx import run
from qlinear.onnx._ort_with_qlinear import MixedRunner
from qlinear.quantize._session import session

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROUNDS = 15


def models(work: Path) -> dict[str, tuple[str, dict, dict]]:
    demo = resources.files("qlinear.quantize") / "_demo"
    cal = dict(np.load(str(demo / "digits_calibration.npz")))
    out = {"digits": (str(demo / "digits_cnn.onnx"), cal, {"image": cal["image"][:64]})}
    import text_model as tm

    model, tokens, split = tm.train()
    path = work / "text.onnx"
    onnx.save(tm.to_onnx(model), path)
    cx, _ = tm.windows(tokens[:split], 512, 2)
    out["text"] = (str(path), {"ids": cx}, {"ids": cx[:64]})
    return out


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    print("| model | weights | qlinear | onnxruntime+qlinear | ONNX Runtime, int8 weights | speed-up | against int8 on ORT |")
    print("| --- | --- | --: | --: | --: | --: | --: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, cal, feeds) in models(Path(tmp)).items():
            int8 = qq.quantize_model(path, None, cal, activations=None, promote=False).model
            ort_session = session(int8)
            for weights, block in (("float4e2m1", 32), ("int2", 16)):
                q = qq.quantize_model(
                    path, None, cal, weights=weights, granularity="blocked", block_size=block, activations=None, promote=False
                ).model
                mixed = MixedRunner(q)
                calls = {
                    "qlinear": lambda q=q, f=feeds: run(q, f, backend="qlinear"),
                    "mixed": lambda mixed=mixed, f=feeds: mixed(f),
                    "ort": lambda s=ort_session, f=feeds: s.run(None, f),
                }
                for call in calls.values():
                    call()
                times = {k: [] for k in calls}
                for _ in range(ROUNDS):
                    for k, call in calls.items():
                        times[k].append(timed(call))
                m = {k: statistics.median(v) for k, v in times.items()}
                print(
                    f"| {name} | {weights} | {m['qlinear']:.1f} ms | {m['mixed']:.2f} ms | {m['ort']:.2f} ms "
                    f"| {m['qlinear'] / m['mixed']:.0f}x | {m['mixed'] / m['ort']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
