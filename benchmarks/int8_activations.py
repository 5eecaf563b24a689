"""Latency and agreement of models with int8 activations: qlinear's layout against ONNX Runtime's quantizer.

ONNX Runtime's x86 integer kernels read activations as uint8. It converts
an int8 QuantizeLinear -> DequantizeLinear pair to uint8 only where the
QuantizeLinear has one reader, and drops a Relu in front of a QuantizeLinear
only where the zero point is the type's minimum; qlinear's last rewrite
(``_signed_layout``) lays int8 activations out for both. Each model: float;
qlinear uint8 (the default), int8 and int8 symmetric (zero point 0),
without promotion; the int8 models again with that rewrite turned off;
ONNX Runtime's ``quantize_static`` (QDQ, per-channel int8 weights) with
int8 activations (asymmetric, its default). Latency: ONNX Runtime, 2
threads, no spinning, a batch of 16, every model in turn in each round,
medians of the rounds, over the float model's; agreement: top-1 with the
float model on the eval data.

    python benchmarks/int8_activations.py [--models digits digits32 text] [--rounds 31]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import qlinear.quantize as qq
import qlinear.quantize._pipeline as pipeline

sys.path.insert(0, str(Path(__file__).parent))
import quantizers  # the benchmark models and their data
from _latency import medians_ms, session


def _ort_int8(float_path: str, cal: dict, out: Path) -> str:
    n = next(iter(cal.values())).shape[0]
    quantizers.ort_static(
        float_path, str(out), [{k: v[i : i + 16] for k, v in cal.items()} for i in range(0, n, 16)], activations="QInt8"
    )
    return str(out)


def _models(d: dict, work: Path) -> dict[str, onnx.ModelProto | str]:
    models: dict[str, onnx.ModelProto | str] = {"float": d["model"]}
    models["qlinear uint8"] = qq.quantize_model(d["model"], None, d["cal"], promote=False).model
    for symmetric in (False, True):
        label = "qlinear int8" + (" symmetric" if symmetric else "")
        quantize = {"activations": "int8", "symmetric": symmetric, "promote": False}
        models[label] = qq.quantize_model(d["model"], None, d["cal"], **quantize).model
        laid_out = pipeline.lay_out_signed
        pipeline.lay_out_signed = lambda model: []
        try:
            models[f"{label}, layout rewrite off"] = qq.quantize_model(d["model"], None, d["cal"], **quantize).model
        finally:
            pipeline.lay_out_signed = laid_out
    models["ORT quantize_static int8"] = _ort_int8(d["model"], d["cal"], work / "ort_int8.onnx")
    return models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["digits", "digits32", "text"], choices=quantizers.MODELS)
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args()
    print(f"ONNX Runtime {ort.__version__}, 2 threads, a batch of 16; medians of {args.rounds} rounds\n")
    print("| model | quantized | agreement | ms | latency / float |\n| --- | --- | --: | --: | --: |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, d in quantizers.datasets(work, tuple(args.models)).items():
            sessions = {label: session(m) for label, m in _models(d, work).items()}
            eval_feeds = d["eval"]
            want = sessions["float"].run(None, eval_feeds)[0].argmax(-1)
            feeds = {k: v[:16] for k, v in eval_feeds.items()}
            medians = medians_ms(sessions, feeds, rounds=args.rounds, calls=10)
            base = medians["float"]
            for label, s in sessions.items():
                agreement = float(np.mean(s.run(None, eval_feeds)[0].argmax(-1) == want))
                ms = medians[label]
                print(f"| {name} | {label} | {agreement:.2%} | {ms:.3f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
