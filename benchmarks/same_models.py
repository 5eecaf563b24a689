"""The byte-for-byte check of a change that must not change what the quantizer writes.

Digests every model qlinear quantizes in ``benchmarks/quantizers.py``'s
qlinear runs on the ``digits`` and ``text`` models, and (with ``--tests``)
every model the test suite quantizes, then compares two such records.
The float models and data are made once and kept in the work folder, so
two commits quantize the same inputs:

    python benchmarks/same_models.py write WORK --tests        # on the commit before the change
    git checkout <change>
    python benchmarks/same_models.py write WORK --tests --name after
    python benchmarks/same_models.py compare WORK/before.json WORK/after.json

``compare`` exits 1 if any model differs or is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = ("digits", "text")


def _inputs(work: Path, name: str) -> dict:
    """The float model and its data, made once (the text model is trained) and then read back."""
    import quantizers

    folder = work / "inputs" / name
    meta = folder / "meta.json"
    if not meta.exists():
        folder.mkdir(parents=True, exist_ok=True)
        d = quantizers.datasets(folder, (name,))[name]
        model = folder / "float.onnx"
        onnx.save(onnx.load(d["model"]), model)
        np.savez(folder / "cal.npz", **d["cal"])
        np.savez(folder / "eval.npz", **d["eval"])
        meta.write_text(json.dumps({"model": str(model)}))
    return {
        "model": json.loads(meta.read_text())["model"],
        "cal": dict(np.load(folder / "cal.npz")),
        "eval": dict(np.load(folder / "eval.npz")),
    }


def write(work: Path, name: str, tests: bool, models: tuple[str, ...] = MODELS) -> Path:
    import quantizers

    import qlinear.quantize as qq

    digests: dict[str, dict] = {}
    # The float-where-faster pass times the machine at hand: its choice is not a function of the inputs, so it is
    # off here, as in the tests (on commits that have it).
    timed = {"float_where_faster": False} if "float_where_faster" in {f.name for f in fields(qq.QuantizeOptions)} else {}
    for model_name in models:
        d = _inputs(work, model_name)
        for label, quantizer, settings in quantizers.RUNS:
            if quantizer != "qlinear":
                continue
            key = f"{model_name}: {label}"
            out = work / "out.onnx"
            try:
                r = qq.quantize_model(d["model"], out, d["cal"], **{**timed, **settings})
                digests[key] = {
                    "sha256": hashlib.sha256(r.model.SerializeToString(deterministic=True)).hexdigest(),
                    "file_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                }
            except Exception as e:  # a run that fails must fail the same way after the change
                digests[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            print(key, digests[key], flush=True)
    if tests:
        lines = work / f"{name}.tests.jsonl"
        lines.unlink(missing_ok=True)
        env = {**os.environ, "QLINEAR_MODEL_DIGESTS": str(lines)}
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "tests"], env=env, check=True)
        for line in lines.read_text().splitlines():
            r = json.loads(line)
            digests[f"test {r['test']} #{r['call']}"] = {k: v for k, v in r.items() if k.endswith("sha256")}
    path = work / f"{name}.json"
    path.write_text(json.dumps(digests, indent=1, sort_keys=True))
    print(f"{len(digests)} digests in {path}")
    return path


def compare(before: Path, after: Path, renamed: dict[str, str] | None = None) -> int:
    """Exit status 1 where a model differs or is missing; a test file renamed between the two is followed."""
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    for old, new_name in (renamed or {}).items():
        a = {k.replace(f"test {old}::", f"test {new_name}::"): v for k, v in a.items()}
    missing = sorted(set(a) - set(b))
    new = sorted(set(b) - set(a))
    # A model quantized from a different input (an exporter that writes source paths into metadata) compares nothing.
    # (Records written before inputs were digested carry none: those are compared.)
    other_input = sorted(
        k
        for k in set(a) & set(b)
        if "input_sha256" in a[k] and "input_sha256" in b[k] and a[k]["input_sha256"] != b[k]["input_sha256"]
    )
    differ = sorted(
        k
        for k in set(a) & set(b)
        if k not in other_input
        and {n: v for n, v in a[k].items() if n != "input_sha256"} != {n: v for n, v in b[k].items() if n != "input_sha256"}
    )
    for k in other_input:
        print(f"input differs (not compared): {k}")
    for k in differ:
        print(f"differs: {k}: {a[k]} -> {b[k]}")
    for k in missing:
        print(f"missing after: {k}")
    for k in new:
        print(f"new after (not compared): {k}")
    same = len(set(a) & set(b)) - len(differ)
    same -= len(other_input)
    print(
        f"{same} of {len(a)} models the same byte for byte; {len(differ)} differ, {len(missing)} missing, "
        f"{len(other_input)} from a different input"
    )
    return 1 if differ or missing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="quantize the models and write their digests to WORK/NAME.json")
    w.add_argument("work", type=Path)
    w.add_argument("--name", default="before")
    w.add_argument("--tests", action="store_true", help="also every model the test suite quantizes (runs the suite)")
    w.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)} (default: both)")
    c = sub.add_parser("compare", help="compare two digest files; exit 1 if any model differs or is missing")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--renamed", nargs="*", default=[], metavar="OLD=NEW", help="test files renamed between the two")
    args = parser.parse_args()
    if args.command == "write":
        args.work.mkdir(parents=True, exist_ok=True)
        write(args.work, args.name, args.tests, tuple(m for m in args.models.split(",") if m))
    else:
        sys.exit(compare(args.before, args.after, dict(r.split("=", 1) for r in args.renamed)))


if __name__ == "__main__":
    main()
