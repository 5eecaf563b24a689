"""qlinear's ``--target openvino`` beside OpenVINO's float model and NNCF's int8 models, every model run on OpenVINO.

The models and data are ``exported_models.py``'s, written to WORK by
``nncf_exported.py data``. NNCF is a peer, never a dependency: it runs in a
virtual environment of its own (with OpenVINO), where it quantizes each
model twice: its ONNX backend's QDQ model (``nncf_exported.py nncf``) and
its OpenVINO-native int8 model (this script's ``nncf`` step, saved as
OpenVINO IR). The comparison then quantizes with qlinear, once for each
target, and runs every model on OpenVINO's CPU plugin (2 threads, f32
inference precision, latency hint): the figures against OpenVINO's float
model on the held-out data, and the latency in alternating rounds against
it, at one sample and at a batch of 16.

    python benchmarks/nncf_exported.py data WORK --models cls ori yolo det rec
    python -m venv /tmp/nncf && /tmp/nncf/bin/pip install nncf==3.4.0 onnx onnxruntime==1.31.1 openvino==2026.4.1
    /tmp/nncf/bin/python benchmarks/nncf_exported.py nncf WORK --models cls ori yolo det rec
    /tmp/nncf/bin/python benchmarks/openvino_exported.py nncf WORK --models cls ori yolo det rec
    python benchmarks/openvino_exported.py compare WORK --models cls ori yolo det rec
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

from nncf_exported import FILES, print_rows  # noqa: E402  (importable in NNCF's environment too)


def nncf_openvino(work: Path, models: list[str]) -> None:
    """NNCF's defaults on the OpenVINO model (its native int8), saved as IR beside its ONNX-backend model."""
    import nncf
    import openvino as ov

    unpacked = Path(json.loads((work / "unpacked.json").read_text())["path"])
    core = ov.Core()
    for name in models:
        batches = [dict(np.load(p)) for p in sorted(work.glob(f"{name}_cal*.npz"), key=lambda p: int(p.stem.split("cal")[1]))]
        model = core.read_model(str(unpacked / FILES[name]))
        start = time.perf_counter()
        try:
            q = nncf.quantize(model, nncf.Dataset(batches), subset_size=sum(len(next(iter(b.values()))) for b in batches))
        except Exception as e:  # a model NNCF cannot take: said, and the others go on
            print(f"{name}: NNCF's OpenVINO backend failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        seconds = time.perf_counter() - start
        ov.save_model(q, str(work / f"{name}_nncf_ov.xml"))
        (work / f"{name}_nncf_ov.json").write_text(json.dumps({"seconds": seconds, "nncf": nncf.__version__}))


def compare(work: Path, models: list[str], rounds: int) -> None:
    import exported_models as em
    import openvino as ov

    import qlinear.quantize as qq
    from qlinear.quantize.targets import openvino as ov_target

    unpacked = Path(json.loads((work / "unpacked.json").read_text())["path"])
    print(f"OpenVINO {ov.__version__}, CPU plugin, 2 threads, f32; latency medians of {rounds} alternating rounds\n")
    print("| model | quantized | agreement | accuracy | SQNR dB | latency / float, batch 1 | batch 16 | seconds |")
    print("| --- | --- | --: | --: | --: | --: | --: | --: |")
    for name in models:
        path = str(unpacked / FILES[name])
        d = getattr(em, em.MODELS[name][1])(unpacked)
        seconds = {}
        for label, target in (("qlinear --target openvino", "openvino"), ("qlinear, placed for ONNX Runtime", "ort-cpu")):
            start = time.perf_counter()
            qq.quantize_model(path, work / f"{name}_qlinear_{target}.onnx", d["cal"], eval=d["eval"], target=target)
            seconds[label] = time.perf_counter() - start
        rows = {
            "float": path,
            "qlinear --target openvino": work / f"{name}_qlinear_openvino.onnx",
            "qlinear, placed for ONNX Runtime": work / f"{name}_qlinear_ort-cpu.onnx",
            "NNCF OpenVINO int8": work / f"{name}_nncf_ov.xml",
            "NNCF ONNX QDQ": work / f"{name}_nncf.onnx",
        }
        for label, peer in (("NNCF OpenVINO int8", "nncf_ov"), ("NNCF ONNX QDQ", "nncf")):
            record = work / f"{name}_{peer}.json"
            if record.exists():
                seconds[label] = json.loads(record.read_text())["seconds"]
        rows = {label: p for label, p in rows.items() if Path(p).exists()}
        sessions = {label: ov_target.session(None, path=str(p)) for label, p in rows.items()}
        print_rows(name, path, d, sessions, seconds, rounds=rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["nncf", "compare"])
    ap.add_argument("work", type=Path)
    ap.add_argument("--models", nargs="+", default=["cls", "ori", "yolo", "det", "rec"], choices=list(FILES))
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    if args.step == "nncf":
        nncf_openvino(args.work, args.models)
    else:
        compare(args.work, args.models, args.rounds)


if __name__ == "__main__":
    main()
