"""Depthwise equalization on and off, on the models of ``exported_models.py`` that have depthwise Convs.

Each model is quantized with no promotion (and with ``--defaults``, at the
defaults too) with ``equalize_depthwise`` off and on, on the data
``exported_models.py`` draws; prints the agreement (per time step for the
recognizer, top-1 for the classifiers, the F1 of the decisions for the text
detector), the output SQNR, the inputs equalized and those left as they
were. Float-where-faster is off so that the two runs differ in the
rewrite alone.

    pip install '.[examples]'
    python benchmarks/depthwise_equalization.py [--models rec cls ori det] [--defaults]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

import qlinear.quantize as qq

sys.path.insert(0, str(Path(__file__).parent))
import exported_models as em


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["rec", "cls", "ori", "det"], choices=list(em.MODELS))
    ap.add_argument("--defaults", action="store_true", help="also the runs at the defaults (promotions as needed)")
    args = ap.parse_args()
    print("| model | run | equalize_depthwise | agreement | SQNR dB | inputs equalized | left | promotions | seconds |")
    print("| --- | --- | --- | --: | --: | --: | --: | --: | --: |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        unpacked = em.fetch(work)
        for name in args.models:
            rel, make = em.MODELS[name]
            path = str(unpacked / rel)
            d = getattr(em, make)(unpacked)
            held_out = em._batches(path, d["eval"])
            ref = em.first_output(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), held_out)
            runs = [("no promotion", {"promote": False})] + ([("defaults", {})] if args.defaults else [])
            for label, settings in runs:
                for on in (False, True):
                    out = work / f"{name}.onnx"
                    start = time.perf_counter()
                    r = qq.quantize_model(
                        path, out, d["cal"], eval=d["eval"], float_where_faster=False, equalize_depthwise=on, **settings
                    )
                    seconds = time.perf_counter() - start
                    got = em.first_output(ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]), held_out)
                    agree, db, _ = em.figures(name, d, ref, got)
                    done = r.report.algorithms.get("equalize_depthwise")
                    steps = r.report.promotions.steps if r.report.promotions else None
                    print(
                        f"| {name} | {label} | {'on' if on else 'off'} | {agree} | {db:.1f} "
                        f"| {len(done.inputs) if done else 0} | {len(done.not_folded) if done else 0} "
                        f"| {'-' if steps is None else len(steps)} | {seconds:.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
