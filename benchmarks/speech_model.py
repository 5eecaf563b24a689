"""A keyword-spotting model on spoken words with its audio front end inside the graph, for the quantizer benchmarks.

The words are the ten digits "zero" to "nine", spoken by eSpeak NG (its
library and voice data come in the ``espeakng-loader`` wheel, so nothing is
downloaded): English accents times voice variants (male, female, croaky,
whispered, Klatt formant voices), at random speed and pitch, each placed at
a random offset in one second of audio at 11025 Hz with background noise
(brown noise and hum at 5-30 dB signal-to-noise). The evaluation words are
spoken by voice variants the model never hears in training.

The ONNX model takes the raw waveform, as deployed keyword spotters do:
STFT (frames of 256, hop 128, Hann window), power spectrum, a 40-band mel
filterbank (MatMul), ``Log(x + 1e-6)``, then four 1-D convolutions over
time (batch normalization folded in, ReLU), a mean over time and a Gemm.
The front end is what collapses a quantized model of this kind: the power
spectrum spans ten decades, and a uint8 scale over it turns every quiet
band into ``log(1e-6)``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
from _training import fit

import qlinear.onnx as qo

WORDS = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    *("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"),
)
ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan")
TRAIN_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "f1", "f2", "f3", "croak", "klatt", "klatt3", "whisper")
EVAL_VARIANTS = ("m6", "m7", "f4", "f5", "klatt2")
RATE = 11025  # eSpeak's 22050 Hz halved
SAMPLES = RATE  # one second
FRAME, HOP, MELS = 256, 128, 40
CHANNELS = (64, 64, 96, 96)


class _Speaker:
    """eSpeak NG through its C API, synthesizing into memory."""

    def __init__(self) -> None:
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
        self.chunks: list[np.ndarray] = []

        def collect(wav, n, _events):
            if n > 0:
                self.chunks.append(np.ctypeslib.as_array(wav, (n,)).copy())
            return 0

        self.callback = callback_type(collect)  # kept: the library calls it for as long as it lives
        synchronous = 2  # AUDIO_OUTPUT_SYNCHRONOUS: Synth returns when done, samples go to the callback, nothing to a sound card
        if self.lib.espeak_Initialize(synchronous, 0, espeakng_loader.get_data_path().encode(), 0) != 22050:
            raise RuntimeError("eSpeak NG did not start at 22050 Hz")
        self.lib.espeak_SetSynthCallback(self.callback)

    def say(self, word: str, voice: str, speed: int, pitch: int) -> np.ndarray:
        """The word as float32 samples at :data:`RATE` (eSpeak's 22050 Hz, low-passed and halved)."""
        self.chunks.clear()
        self.lib.espeak_ng_SetRandSeed(ctypes.c_long(0))  # breathy and whispered voices draw noise: the same clips every run
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise RuntimeError(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_SetParameter(1, speed, 0)  # espeakRATE, words a minute
        self.lib.espeak_SetParameter(3, pitch, 0)  # espeakPITCH, 0-100
        text = word.encode()
        if self.lib.espeak_Synth(text, len(text) + 1, 0, 1, 0, 0, None, None) != 0:
            raise RuntimeError(f"eSpeak NG could not speak {word!r} as {voice!r}")
        wav = np.concatenate(self.chunks).astype(np.float32) / 32768
        return np.convolve(wav, np.array([0.25, 0.5, 0.25], np.float32), mode="same")[::2]


_speaker: _Speaker | None = None


def _noise(rng: np.random.Generator) -> np.ndarray:
    """One second of brown noise plus mains hum, unit power."""
    brown = np.cumsum(rng.normal(size=SAMPLES))
    brown -= np.convolve(brown, np.ones(101) / 101, mode="same")  # no drift below about 100 Hz
    t = np.arange(SAMPLES) / RATE
    hum = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) / k for k, f in enumerate((50, 100, 150), 1))
    n = brown / brown.std() + 0.5 * hum / hum.std()
    return (n / n.std()).astype(np.float32)


def clips(variants: tuple[str, ...], per_voice: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(waveforms (N, SAMPLES) float32, labels int64)``: each word by each accent and variant, ``per_voice`` times."""
    global _speaker
    _speaker = _speaker or _Speaker()  # eSpeak NG starts once a process: a second start hangs
    speaker, rng = _speaker, np.random.default_rng(seed)
    waves, labels = [], []
    for accent in ACCENTS:
        for variant in variants:
            for label, word in enumerate(WORDS):
                for _ in range(per_voice):
                    speech = speaker.say(word, f"{accent}+{variant}", int(rng.integers(110, 230)), int(rng.integers(15, 85)))
                    speech = speech[:SAMPLES] / (np.abs(speech).max() + 1e-9)
                    clip = np.zeros(SAMPLES, np.float32)
                    start = int(rng.integers(0, SAMPLES - speech.size + 1))
                    clip[start : start + speech.size] = speech
                    snr_db = rng.uniform(-5, 25)
                    noise = _noise(rng) * np.sqrt((speech**2).mean() / 10 ** (snr_db / 10))
                    waves.append((clip + noise) * rng.uniform(0.05, 0.9))
                    labels.append(label)
    return np.stack(waves).astype(np.float32), np.array(labels, np.int64)


def _mel_filterbank() -> np.ndarray:
    """(FRAME // 2 + 1, MELS) triangular filters, equally spaced in mel from 60 Hz to Nyquist."""
    mel = np.linspace(2595 * np.log10(1 + 60 / 700), 2595 * np.log10(1 + RATE / 2 / 700), MELS + 2)
    hz = 700 * (10 ** (mel / 2595) - 1)
    bins = np.fft.rfftfreq(FRAME, 1 / RATE)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    tri = np.maximum(0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))
    return tri.T.astype(np.float32)


def features(waves: np.ndarray) -> np.ndarray:
    """The front end in numpy, for training: (N, MELS, frames) log mel energies, as the ONNX graph computes them."""
    frames = 1 + (SAMPLES - FRAME) // HOP
    idx = np.arange(frames)[:, None] * HOP + np.arange(FRAME)[None, :]
    window = np.hanning(FRAME + 1)[:-1].astype(np.float32)  # periodic Hann, as ONNX's HannWindow
    spectrum = np.fft.rfft(waves[:, idx] * window, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    return np.log(power @ _mel_filterbank() + 1e-6).transpose(0, 2, 1).astype(np.float32)


def train(x: np.ndarray, y: np.ndarray, epochs: int = 12, lr: float = 2e-3, seed: int = 0):
    """A trained 1-D CNN over log mel features ``x`` (N, MELS, frames)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers, c = [], MELS
    for i, co in enumerate(CHANNELS):
        layers += [nn.Conv1d(c, co, 5 if i == 0 else 3, padding="same"), nn.BatchNorm1d(co), nn.ReLU()]
        if i in (1, 2):
            layers.append(nn.MaxPool1d(2))
        c = co
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c, len(WORDS)))
    return fit(model, x, y, epochs=epochs, lr=lr, seed=seed, optimizer="adamw")


def to_onnx(model) -> onnx.ModelProto:
    """The waveform-to-logits model: the front end of :func:`features` in ONNX ops, then the trained CNN."""
    from torch import nn

    g = qo.Graph("keyword_spotter", opset=17)
    wave = g.input("waveform", "float32", ("N", SAMPLES))
    signal = g.op("Unsqueeze", [wave, np.array([-1], np.int64)], name="signal")
    window = np.hanning(FRAME + 1)[:-1].astype(np.float32)
    stft = g.op("STFT", [signal, np.array(HOP, np.int64), window, np.array(FRAME, np.int64)], name="stft", onesided=1)
    power = g.op("ReduceSum", [g.op("Mul", [stft, stft], name="square"), np.array([-1], np.int64)], name="power", keepdims=0)
    mel = g.op("MatMul", [power, _mel_filterbank()], name="mel")
    x = g.op("Log", [g.op("Add", [mel, np.float32(1e-6)], name="floor")], name="log")
    x = g.op("Transpose", [x], name="channels_first", perm=[0, 2, 1])
    layers = list(model)
    i = 0
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, nn.Conv1d):
            bn = layers[i + 1]
            k = (bn.weight / (bn.running_var + bn.eps).sqrt()).detach().numpy()
            w = (layer.weight.detach().numpy() * k[:, None, None]).astype(np.float32)
            b = ((layer.bias.detach().numpy() - bn.running_mean.numpy()) * k + bn.bias.detach().numpy()).astype(np.float32)
            pad = w.shape[-1] // 2
            x = g.op("Conv", [x, w, b], name=f"conv{i}", pads=[pad, pad])
            x = g.op("Relu", [x], name=f"relu{i}")
            i += 3
            continue
        if isinstance(layer, nn.MaxPool1d):
            x = g.op("MaxPool", [x], name=f"pool{i}", kernel_shape=[2], strides=[2])
        elif isinstance(layer, nn.Linear):
            x = g.op(
                "Gemm",
                [x, layer.weight.detach().numpy(), layer.bias.detach().numpy()],
                name="classifier",
                transB=1,
                output_names=["logits"],
            )
        elif isinstance(layer, nn.AdaptiveAvgPool1d):
            x = g.op("ReduceMean", [x], name="time_mean", axes=[-1], keepdims=0)
        i += 1
    g.output(x)
    return g.to_model()
