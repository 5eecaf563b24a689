"""qlinear.torch.fake_quantize against PyTorch's fake quantization, 16M float32 elements, in one run.

Rows: per-tensor uint8 and per-channel int8 (along the last axis, 1024
channels); the forward without gradients, the forward recording gradients
(x's, and the scale's for qlinear: LSQ; PyTorch's functions learn no
scale), and forward + backward with a full upstream gradient. Times are medians of alternating rounds (PyTorch, then
qlinear), 2 threads. Prints a Markdown table.

    python benchmarks/torch_fake_quantize.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import qlinear.torch as qt

N = 16 << 20


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    x = torch.randn(N // 1024, 1024)
    s_t, z_t = torch.tensor(0.02), torch.tensor(128.0)
    s_c = torch.rand(1024) * 0.02 + 0.01
    z_c = torch.zeros(1024, dtype=torch.int32)
    cases = {
        "per-tensor uint8, forward": (
            lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 128, 0, 255),
            lambda: qt.fake_quantize(x, s_t, z_t, output_dtype="uint8"),
        ),
        "per-channel int8 (last axis), forward": (
            lambda: torch.fake_quantize_per_channel_affine(x, s_c, z_c, 1, -128, 127),
            lambda: qt.fake_quantize(x, s_c, z_c.float(), axis=1, output_dtype="int8"),
        ),
    }
    xg = x.clone().requires_grad_(True)
    sg = s_t.clone().requires_grad_(True)
    cases["per-tensor uint8, forward recording gradients"] = (
        lambda: torch.fake_quantize_per_tensor_affine(xg, 0.02, 128, 0, 255),
        lambda: qt.fake_quantize(xg, sg, z_t, output_dtype="uint8"),
    )
    # The gradient arriving from the layers above: a full tensor, as in training (a .sum()'s would be one value
    # broadcast, which neither library sees in a real network).
    upstream = torch.randn_like(x)
    cases["per-tensor uint8, forward + backward"] = (
        lambda: torch.fake_quantize_per_tensor_affine(xg, 0.02, 128, 0, 255).backward(upstream),
        lambda: qt.fake_quantize(xg, sg, z_t, output_dtype="uint8").backward(upstream),
    )
    sc = s_c.clone().requires_grad_(True)
    cases["per-channel int8 (last axis), forward recording gradients"] = (
        lambda: torch.fake_quantize_per_channel_affine(xg, s_c, z_c, 1, -128, 127),
        lambda: qt.fake_quantize(xg, sc, None, axis=1, output_dtype="int8"),
    )
    cases["per-channel int8 (last axis), forward + backward"] = (
        lambda: torch.fake_quantize_per_channel_affine(xg, s_c, z_c, 1, -128, 127).backward(upstream),
        lambda: qt.fake_quantize(xg, sc, None, axis=1, output_dtype="int8").backward(upstream),
    )
    print("| call (16M float32, 2 threads) | PyTorch | qlinear.torch | qlinear / PyTorch |")
    print("| --- | --: | --: | --: |")
    for label, (theirs, ours) in cases.items():
        grad = "gradients" in label or "backward" in label
        with torch.set_grad_enabled(grad):
            theirs(), ours()  # warm-up: numba's first call, allocator
            times = {"theirs": [], "ours": []}
            for _ in range(args.rounds):
                times["theirs"].append(timed(theirs))
                times["ours"].append(timed(ours))
        t, o = statistics.median(times["theirs"]), statistics.median(times["ours"])
        print(f"| {label} | {t:.1f} ms | {o:.1f} ms | {o / t:.2f} |", flush=True)


if __name__ == "__main__":
    main()
