"""qlinear quantize against ONNX Runtime's quantizer, side by side, in one run.

Five models on real data:

- ``digits``: the small CNN the tests use (scikit-learn's 8x8 digits),
  calibrated on its 300 training images, evaluated on the 450 held-out
  ones with labels;
- ``demo``: the CNN `qlinear quantize --demo` ships (the same digits
  resized to 16x16 in its graph, 32-128 channels), on the same data;
- ``digits32``: a CNN of realistic layer sizes (32-64 channels, 32x32
  images: the digits enlarged; benchmarks/image_model.py) trained here for
  a few seconds, calibrated on 1000 of its training images (the last 200
  held out for qlinear's accuracy target) and evaluated on the 450 test
  images;
- ``text``: a character-level transformer (benchmarks/text_model.py)
  trained here for a few seconds on Python's own standard library source,
  calibrated on 2048 windows of the training text and evaluated on 400
  windows of held-out text (next-character labels);
- ``speech``: a keyword spotter (benchmarks/speech_model.py) over one
  second of raw waveform, its STFT, mel and log front end inside the
  graph, trained here for a few seconds on twenty spoken words (eSpeak NG
  voices, with noise), calibrated on 1000 training clips and evaluated on
  600 clips of voices it was not trained on.

Each quantizer runs in a fresh process (its time and peak RSS are that
process's), the same calibration data for all: qlinear at several
settings (its defaults: mse activation ranges, an accuracy target of 99%
agreement on the held-out fifth of the calibration data, bias correction,
GPTQ and AWQ at 4 bits, SmoothQuant at 8; at the same types with no
promotion; with minmax ranges; and with no promotion, minmax and every
algorithm off, round to nearest), ONNX Runtime's ``quantize_static`` (QDQ, per-channel, uint8
activations, int8 weights; MinMax, Entropy and Percentile),
``quantize_dynamic`` (int8 weights) and its 4-bit ``MatMulNBitsQuantizer``
(round to nearest, symmetric blocks of 32; MatMul only). Each result is then evaluated against the float model on
the same held-out data: top-1 agreement, accuracy, output SQNR, file size,
and ONNX Runtime latency against the float model (batches of 1 and 16,
alternating pairs, the median of the pairs' ratios).

    pip install -e '.[examples]'
    python benchmarks/quantizers.py [--json results.json] [--models speech,text]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
CALIBRATION_WINDOWS = 2048  # text windows of 32 tokens to calibrate on
sys.path.insert(0, str(HERE))

# (label, quantizer, settings): qlinear keywords, or ORT's quantizer and its method.
_W4 = {"weights": "int4", "granularity": "blocked", "activations": None}
_NONE = {"bias_correction": False, "gptq": False, "awq": False, "smoothquant": False}  # every algorithm off
_MATMUL_ONLY = {"exclude": ["Gather", "Gemm", "Conv"]}  # the scope of ONNX Runtime's MatMulNBits quantizer
_W4A8 = {"weights": "int4", "granularity": "blocked", "block_size": 32}
RUNS = [
    ("qlinear int8/uint8 (defaults: mse ranges)", "qlinear", {}),
    ("qlinear int8/uint8, no promotion", "qlinear", {"promote": False}),
    (
        "qlinear int8/uint8, no promotion, empirical bias correction",
        "qlinear",
        {"promote": False, "empirical_bias_correction": True},
    ),
    ("qlinear int8/uint8 minmax, no promotion", "qlinear", {"promote": False, "method": "minmax"}),
    ("qlinear int8/uint8 minmax, no promotion, no algorithms", "qlinear", {"promote": False, "method": "minmax", **_NONE}),
    ("qlinear int8/uint8 minmax", "qlinear", {"method": "minmax"}),
    ("qlinear int8/uint8 entropy", "qlinear", {"method": "entropy"}),
    ("qlinear int8/uint8 percentile", "qlinear", {"method": "percentile"}),
    ("qlinear int4 blocked, weight-only", "qlinear", _W4),
    ("qlinear int4 blocked, weight-only, no promotion", "qlinear", {**_W4, "promote": False}),
    ("qlinear int4 blocked, weight-only, no promotion, no algorithms", "qlinear", {**_W4, "promote": False, **_NONE}),
    ("qlinear int4 blocked, weight-only, MatMul only, no promotion", "qlinear", {**_W4, "promote": False, **_MATMUL_ONLY}),
    (
        "qlinear int4 blocked, weight-only, MatMul only, no promotion, no algorithms",
        "qlinear",
        {**_W4, "promote": False, **_MATMUL_ONLY, **_NONE},
    ),
    ("qlinear int4 per-channel/uint8", "qlinear", {"weights": "int4"}),
    ("qlinear int4 per-channel/uint8, no promotion", "qlinear", {"weights": "int4", "promote": False}),
    ("qlinear int4 per-channel/uint8, no promotion, no algorithms", "qlinear", {"weights": "int4", "promote": False, **_NONE}),
    ("qlinear int4 blocked/uint8, no promotion", "qlinear", {**_W4A8, "promote": False}),
    ("qlinear int4 blocked/uint8, no promotion, fine-tuned 300 steps", "qlinear", {**_W4A8, "promote": False, "finetune": 300}),
    ("qlinear int4 blocked/uint8, no promotion, fine-tuned 1000 steps", "qlinear", {**_W4A8, "promote": False, "finetune": 1000}),
    (
        "qlinear int2 blocked, weight-only",
        "qlinear",
        {"weights": "int2", "granularity": "blocked", "block_size": 16, "activations": None},
    ),
    ("qlinear float8 per-channel, weight-only", "qlinear", {"weights": "float8e4m3fn", "activations": None}),
    ("qlinear float4 blocked, weight-only", "qlinear", {"weights": "float4e2m1", "granularity": "blocked", "activations": None}),
    ("ORT static QDQ minmax", "ort_static", {"method": "MinMax"}),
    ("ORT static QDQ entropy", "ort_static", {"method": "Entropy"}),
    ("ORT static QDQ percentile", "ort_static", {"method": "Percentile"}),
    ("ORT dynamic int8", "ort_dynamic", {}),
    ("ORT MatMulNBits int4 blocked 32, weight-only", "ort_nbits", {}),
]


MODELS = ("digits", "demo", "digits32", "text", "speech")
SPEECH_CALIBRATION_CLIPS = 1000


def datasets(work: Path, models: tuple[str, ...] = MODELS) -> dict[str, dict]:
    """Each model's float file, calibration arrays and eval arrays (with labels)."""
    out = {}
    for name in models:
        out[name] = _DATASETS[name](work)
    return out


def _digits(work: Path, model: str = "digits_cnn.onnx") -> dict:
    demo = resources.files("qlinear.quantize") / "_demo"
    cal = dict(np.load(str(demo / "digits_calibration.npz")))
    ev = dict(np.load(str(demo / "digits_eval.npz")))
    return {"model": str(demo / model), "cal": cal, "eval": {"image": ev["image"]}, "labels": ev["label"]}


def _demo(work: Path) -> dict:
    return _digits(work, "digits_resized_cnn.onnx")


def _digits32(work: Path) -> dict:
    import image_model as im

    x_train, y_train, x_test, y_test = im.images()
    path = work / "digits32_cnn.onnx"
    onnx.save(im.to_onnx(im.train(x_train, y_train)), path)
    return {"model": str(path), "cal": {"image": x_train[:1000]}, "eval": {"image": x_test}, "labels": y_test}


def _text(work: Path) -> dict:
    import text_model as tm

    model, tokens, split = tm.train()
    path = work / "char_transformer.onnx"
    onnx.save(tm.to_onnx(model), path)
    cx, _ = tm.windows(tokens[:split], CALIBRATION_WINDOWS, 2)
    ex, ey = tm.windows(tokens[split:], 400, 1)
    return {"model": str(path), "cal": {"ids": cx}, "eval": {"ids": ex}, "labels": ey}


def _speech(work: Path) -> dict:
    import speech_model as sm

    x_train, y_train = sm.clips(sm.TRAIN_VARIANTS, 2, 0)
    x_eval, y_eval = sm.clips(sm.EVAL_VARIANTS, 1, 1)
    path = work / "keyword_spotter.onnx"
    onnx.save(sm.to_onnx(sm.train(sm.features(x_train), y_train)), path)
    # Clips are in order of voice and word: a spread of them, so the held-out fifth has every voice too.
    pick = np.random.default_rng(0).permutation(len(x_train))[:SPEECH_CALIBRATION_CLIPS]
    return {"model": str(path), "cal": {"waveform": x_train[pick]}, "eval": {"waveform": x_eval}, "labels": y_eval}


_DATASETS = {"digits": _digits, "demo": _demo, "digits32": _digits32, "text": _text, "speech": _speech}


def peak_rss_bytes() -> int:
    from qlinear.quantize._memory import peak_rss_bytes as peak

    return peak()


def worker(spec: dict) -> dict:
    """Quantize once (in this fresh process) and say how long it took and the peak RSS."""
    cal = dict(np.load(spec["cal"]))
    start = time.perf_counter()
    extra = {}
    if spec["quantizer"] == "qlinear":
        import qlinear.quantize as qq

        report = qq.quantize_model(spec["model"], spec["out"], cal, **spec["settings"]).report
        if report.promotions is not None:
            extra["promotions"] = len(report.promotions.steps)
        if report.calibration.batches:
            extra["calibration_seconds"] = report.calibration.seconds
            extra["inference_seconds"] = _plain_inference(spec["model"], cal)
    elif spec["quantizer"] == "ort_nbits":
        from onnxruntime.quantization import matmul_nbits_quantizer as nbits

        config = nbits.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True)
        q = nbits.MatMulNBitsQuantizer(onnx.load(spec["model"]), algo_config=config)
        q.process()
        onnx.save(q.model.model, spec["out"])
    elif spec["quantizer"] == "ort_dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(spec["model"], spec["out"], weight_type=QuantType.QInt8)
    else:
        n = next(iter(cal.values())).shape[0]
        batches = [{k: v[i : i + 16] for k, v in cal.items()} for i in range(0, n, 16)]
        ort_static(spec["model"], spec["out"], batches, method=spec["settings"]["method"])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss_bytes": peak_rss_bytes(), **extra}


def ort_static(model: str, out: str, batches: list[dict], *, activations: str = "QUInt8", method: str = "MinMax") -> None:
    """ONNX Runtime's ``quantize_static`` as the benchmarks run it: QDQ, per-channel int8 weights, on ``batches``."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        model, str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, method),
    )  # fmt: skip


def _plain_inference(model: str, cal: dict) -> float:
    """Seconds ONNX Runtime takes to run the float model over the calibration inputs (80%, as calibrated), batches of 16."""
    from qlinear.quantize._session import session

    s = session(onnx.load(model))
    n = next(iter(cal.values())).shape[0]
    n -= max(1, round(n * 0.2))
    start = time.perf_counter()
    for i in range(0, n, 16):
        s.run(None, {k: v[i : min(i + 16, n)] for k, v in cal.items()})
    return time.perf_counter() - start


def memory_growth(d: dict, work: Path) -> None:
    """Peak RSS of a calibration on the text windows and on 20 times as many, for qlinear and ORT."""
    print("\n| quantizer | calibration windows | peak RSS | time |\n| --- | --: | --: | --: |")
    base = {k: v[:256] for k, v in d["cal"].items()}
    for label, quantizer, settings in (
        ("qlinear mse (default)", "qlinear", {}),
        ("qlinear minmax", "qlinear", {"method": "minmax"}),
        ("qlinear entropy", "qlinear", {"method": "entropy"}),
        ("ORT static QDQ minmax", "ort_static", {"method": "MinMax"}),
        ("ORT static QDQ percentile", "ort_static", {"method": "Percentile"}),
    ):
        for times in (1, 20):
            path = work / f"mem_{times}.npz"
            np.savez(path, **{k: np.concatenate([v] * times) for k, v in base.items()})
            spec = {
                "quantizer": quantizer,
                "settings": settings,
                "model": d["model"],
                "cal": str(path),
                "out": str(work / "mem.onnx"),
            }
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, check=False
            )
            if proc.returncode:
                print(
                    f"| {label} | {256 * times} | error: {(proc.stderr.strip().splitlines() or ['failed'])[-1][:100]} | |",
                    flush=True,
                )
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"| {label} | {256 * times} | {r['peak_rss_bytes'] / 2**20:.0f} MiB | {r['seconds']:.2f} s |", flush=True)


def evaluate(float_path: str, path: str, feeds: dict, labels: np.ndarray) -> dict:
    from qlinear.quantize._evaluate import Runner
    from qlinear.quantize._latency import PairTimer
    from qlinear.quantize.targets import ORT_CPU

    fm, qm = onnx.load(float_path), onnx.load(path)
    ref = Runner(fm, [], ORT_CPU)(feeds)
    runner = Runner(qm, [], ORT_CPU)
    got = runner(feeds)
    name = fm.graph.output[0].name
    r, g = ref[name].astype(np.float64), got[name].astype(np.float64)
    noise = float(((r - g) ** 2).sum())
    lat = {b: PairTimer(fm, {k: v[:b] for k, v in feeds.items()}, ORT_CPU).time(qm) for b in (1, 16)}
    size = os.path.getsize(path) + (os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0)
    return {
        "agreement": float((r.argmax(-1) == g.argmax(-1)).mean()),
        "accuracy": float((g.argmax(-1) == labels).mean()),
        "float_accuracy": float((r.argmax(-1) == labels).mean()),
        "sqnr_db": 10 * np.log10(float((r**2).sum()) / noise) if noise else None,
        "size_bytes": size,
        "float_size_bytes": os.path.getsize(float_path),
        "latency_ratio": {str(b): None if t is None else t.ratio for b, t in lat.items()},
        "runs_on": runner.backend,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = tuple(m for m in args.models.split(",") if m)
        unknown = set(models) - set(MODELS)
        if unknown:
            parser.error(f"--models: expected names among {', '.join(MODELS)}, got {', '.join(sorted(unknown))}")
        for model_name, d in datasets(work, models).items():
            cal_path = work / f"{model_name}_cal.npz"
            np.savez(cal_path, **d["cal"])
            for label, quantizer, settings in RUNS:
                out = work / f"{model_name}_{len(results)}.onnx"
                spec = {"quantizer": quantizer, "settings": settings, "model": d["model"], "cal": str(cal_path), "out": str(out)}
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, check=False
                )
                row = {"model": model_name, "run": label}
                if proc.returncode != 0 or not out.exists():
                    row["error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]
                else:
                    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                    try:
                        row.update(evaluate(d["model"], str(out), d["eval"], d["labels"]))
                    except Exception as e:
                        row["error"] = f"evaluation failed: {str(e).splitlines()[0][:160]}"
                results.append(row)
                _print_row(row)
            if model_name == "text":
                memory_growth(d, work)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _print_row(r: dict) -> None:
    if "error" in r:
        print(f"| {r['model']} | {r['run']} | error: {r['error']} |", flush=True)
        return
    print(
        f"| {r['model']} | {r['run']} | {100 * r['agreement']:.2f}% | {100 * r['float_accuracy']:.2f}% -> {100 * r['accuracy']:.2f}% "
        f"| {_fmt(r['sqnr_db'], '.1f')} | {r['size_bytes'] / 1024:.0f} / {r['float_size_bytes'] / 1024:.0f} KiB "
        f"| {_fmt(r['latency_ratio']['1'], '.2f')} / {_fmt(r['latency_ratio']['16'], '.2f')} | {r['seconds']:.2f} s | {r['peak_rss_bytes'] / 2**20:.0f} MiB | {r['runs_on']} "
        f"| {_fmt(r.get('calibration_seconds'), '.2f')} / {_fmt(r.get('inference_seconds'), '.2f')} s | {_fmt(r.get('promotions'), 'd')} |",
        flush=True,
    )


if __name__ == "__main__":
    print(
        "| model | quantizer | top-1 agreement | accuracy | output SQNR dB | size | ORT latency / float (batch 1 / 16) | time | peak RSS | runs on "
        "| calibration / plain inference | promotions |"
    )
    print("| --- | --- | --: | --: | --: | --: | --: | --: | --: | --- | --: | --: |")
    main()
