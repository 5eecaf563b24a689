"""openWakeWord's audio embedding quantized, judged by the decisions of the wake-word model that reads it.

The models come from the ``openwakeword==0.4.0`` wheel (fetched with ``pip
download``): its mel spectrogram front end, its audio embedding (a 1.3 MB
CNN of LeakyRelu and Max maxout blocks, one 96-wide vector for each window
of 76 mel frames) and its "alexa" wake-word model, which reads 16
consecutive embeddings and gives a probability. Only the embedding is
quantized; the front end and the wake-word model stay float, as a user who
quantizes the embedding runs them.

The data: twelve phrases (four with "alexa", eight without), spoken by
eSpeak NG (``speech_model.py``) in each accent and voice variant, 2 s at
16 kHz in white noise at 5-30 dB signal-to-noise, through the mel front end
and cut into 16 windows of 76 frames, 8 frames apart, as openWakeWord feeds
its embedding. Calibration: 1000 windows of the training voices; eval: every
third window of the clips of the evaluation voices (voices the calibration
never heard); the decisions: the wake-word model's score above 0.5 on every
evaluation clip, each quantized embedding against the float one.

Rows: qlinear's defaults (the embedding judged by its cosine similarity),
qlinear ``--target-sqnr 30`` (the target any vector output had before),
qlinear without promotion, and ONNX Runtime's ``quantize_static`` (QDQ,
per-channel int8 weights, uint8 activations, MinMax). Latency: ONNX Runtime,
2 threads, one window and 16, every model in turn each round, medians.

    pip install '.[examples]'
    python benchmarks/audio_embedding.py [--rounds 11]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

import qlinear.quantize as qq

sys.path.insert(0, str(Path(__file__).parent))
import speech_model as sm
from _latency import medians_ms, session

WHEEL = "openwakeword==0.4.0"
MODELS = "openwakeword/resources/models"
PHRASES = (
    *("alexa", "hey alexa", "alexa stop", "alexa, what time is it"),
    *("a lexus", "alex", "computer", "hello there", "turn it off", "the weather", "seven", "play music"),
)
RATE, SECONDS, FRAMES, STEP = 16000, 2, 76, 8


def fetch(work: Path) -> Path:
    """The wheel's model folder, unpacked under ``work``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work), WHEEL], check=True)
    with zipfile.ZipFile(next(work.glob("openwakeword-*.whl"))) as z:
        z.extractall(work / "unpacked")
    return work / "unpacked" / MODELS


def clips(models: Path, variants: tuple[str, ...], seed: int) -> list[np.ndarray]:
    """Each phrase by each accent and variant: its 16 windows of mel frames, (16, 76, 32, 1)."""
    sm._speaker = sm._speaker or sm._Speaker()  # eSpeak NG starts once a process (speech_model.clips does the same)
    speaker, rng = sm._speaker, np.random.default_rng(seed)
    mel = session(str(models / "melspectrogram.onnx"))
    out = []
    for accent in sm.ACCENTS:
        for variant in variants:
            for phrase in PHRASES:
                speech = speaker.say(phrase, f"{accent}+{variant}", int(rng.integers(120, 210)), int(rng.integers(20, 80)))
                speech = np.interp(np.arange(0, speech.size * RATE / sm.RATE) * sm.RATE / RATE, np.arange(speech.size), speech)
                speech = speech[: RATE * SECONDS] / (np.abs(speech).max() + 1e-9)
                wave = np.zeros(RATE * SECONDS)
                start = int(rng.integers(0, wave.size - speech.size + 1))
                wave[start : start + speech.size] = speech
                noise = rng.normal(size=wave.size) * np.sqrt((speech**2).mean() / 10 ** (rng.uniform(5, 30) / 10))
                pcm = ((wave + noise) * rng.uniform(0.1, 0.8) * 32767).astype(np.float32)
                spec = mel.run(None, {"input": pcm[None]})[0].squeeze() / 10 + 2  # openWakeWord's scaling of its mel frames
                windows = [spec[i : i + FRAMES] for i in range(0, spec.shape[0] - FRAMES + 1, STEP)][:16]
                out.append(np.stack(windows)[..., None].astype(np.float32))
    return out


def wake_scores(embedding: str, wake, evaluation: list[np.ndarray]) -> np.ndarray:
    s = session(embedding)
    return np.array(
        [
            wake.run(None, {wake.get_inputs()[0].name: s.run(None, {"input_1": c})[0].reshape(1, 16, 96)})[0].item()
            for c in evaluation
        ]
    )


def cosine_and_sqnr(float_model: str, quantized: str, windows: np.ndarray) -> tuple[float, float]:
    a = session(float_model).run(None, {"input_1": windows})[0].reshape(len(windows), -1).astype(np.float64)
    b = session(quantized).run(None, {"input_1": windows})[0].reshape(len(windows), -1).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.mean()), float(10 * np.log10((a**2).sum() / ((a - b) ** 2).sum()))


def ort_static(model: str, out: str, cal: np.ndarray) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input_1": cal[i : i + 16]} for i in range(0, len(cal), 16)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = fetch(work)
        float_model = str(models / "embedding_model.onnx")
        train, evaluation = clips(models, sm.TRAIN_VARIANTS, 0), clips(models, sm.EVAL_VARIANTS, 1)
        windows = np.concatenate(train)
        cal = windows[np.random.default_rng(1).permutation(len(windows))[:1000]]
        held_out = np.concatenate(evaluation)[::3]
        runs = {
            "qlinear defaults": {},
            "qlinear --target-sqnr 30": {"target_sqnr_db": 30.0},
            "qlinear --no-promote": {"promote": False},
        }
        files, seconds, promotions = {}, {}, {}
        for label, options in runs.items():
            files[label] = str(work / f"{len(files)}.onnx")
            start = time.perf_counter()
            r = qq.quantize_model(float_model, files[label], {"input_1": cal}, eval={"input_1": held_out}, **options)
            seconds[label] = time.perf_counter() - start
            promotions[label] = len(r.report.promotions.steps) if r.report.promotions else 0
        files["ORT quantize_static"] = str(work / "ort.onnx")
        start = time.perf_counter()
        ort_static(float_model, files["ORT quantize_static"], cal)
        seconds["ORT quantize_static"], promotions["ORT quantize_static"] = time.perf_counter() - start, None

        wake = session(str(models / "alexa_v0.1.onnx"))
        want = wake_scores(float_model, wake, evaluation) > 0.5
        latency = {}
        for batch in (1, 16):
            feeds = {"input_1": held_out[:batch]}
            sessions = {"float": session(float_model), **{label: session(path) for label, path in files.items()}}
            latency[batch] = medians_ms(sessions, feeds, rounds=args.rounds, calls=20)
        print(f"{len(evaluation)} evaluation clips, {int(want.sum())} with the wake word heard by the float pipeline; "
              f"{len(held_out)} eval windows, {len(cal)} calibration windows")  # fmt: skip
        print(
            "| run | mean cosine | SQNR dB | wake-word decisions as float's | promotions | latency / float at 1, 16 | seconds |"
        )
        print("| --- | --: | --: | --: | --: | --- | --: |")
        for label, path in files.items():
            cos, sqnr = cosine_and_sqnr(float_model, path, held_out)
            kept = float(((wake_scores(path, wake, evaluation) > 0.5) == want).mean())
            ratios = ", ".join(f"{latency[b][label] / latency[b]['float']:.2f}" for b in (1, 16))
            p = "-" if promotions[label] is None else promotions[label]
            print(f"| {label} | {cos:.4f} | {sqnr:.1f} | {kept:.2%} | {p} | {ratios} | {seconds[label]:.1f} |")


if __name__ == "__main__":
    main()
