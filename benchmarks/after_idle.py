"""qlinear's plain call and ONNX Runtime's after the process has been idle, call by call.

Both libraries keep worker threads that sleep when there is no work. Each
round waits for the other library's threads to go to sleep (150 ms), makes
one call, idles for the pause (or makes calls for 0.3 s: the steady
state), then makes four calls back to back, and
records each call's time and the process's CPU time over the four calls
divided by their wall time (2.0: both threads busy throughout, 1.0: one;
ONNX Runtime's count includes its threads' spinning). Rounds alternate
between qlinear, qlinear with its workers left where Linux wakes them
(placement turned off, kernels/cpu/_placement.py) and ONNX Runtime;
each figure is the median over the rounds. uint8 QuantizeLinear per tensor,
16M float32 elements, 2 threads (both libraries). Prints a Markdown table.

    pip install -e '.[examples]'
    python benchmarks/after_idle.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numba
import numpy as np

import qlinear
from qlinear.bench._cases import Case
from qlinear.bench._measure import SETTLE_S
from qlinear.bench._others import ort_runner
from qlinear.kernels.cpu._placement import set_enabled

PAUSES_S = (None, 0.0, 0.003, 0.02, 0.15)  # None: after 0.3 s of calls back to back, for the steady state
WARM_S = 0.3
CALLS = 4
THREADS = 2


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def round_of_calls(fn, pause_s: float | None) -> tuple[list[float], float]:
    """Each call's milliseconds after ``pause_s`` of idling since ``fn``'s last call, and the cores used over them."""
    time.sleep(SETTLE_S)  # the other library's threads asleep
    fn()
    if pause_s is None:
        end = time.perf_counter() + WARM_S
        while time.perf_counter() < end:
            fn()
    else:
        time.sleep(pause_s)
    times = []
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    for _ in range(CALLS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    wall = time.perf_counter() - wall0
    return times, (cpu_seconds() - cpu0) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    numba.set_num_threads(THREADS)
    x = np.random.default_rng(0).normal(size=(16384, 1024)).astype(np.float32)
    scale, zero_point = np.array(0.02, np.float32), np.array(128, np.uint8)
    q = qlinear.quantize_linear(x, scale, zero_point)
    ort_call, _ = ort_runner(Case("Q", "uint8", "per-tensor"), x, q, scale, zero_point, THREADS)

    def placed(on: bool):
        def call():
            set_enabled(on)
            return qlinear.quantize_linear(x, scale, zero_point)

        return call

    sides = {"qlinear": placed(True), "qlinear, workers not placed": placed(False), "ONNX Runtime": ort_call}
    for fn in sides.values():
        fn()
    print(f"numba threading layer: {numba.threading_layer()}\n")
    print("| library | pause | " + " | ".join(f"call {k + 1} ms" for k in range(CALLS)) + " | cores used |")
    print("| --- | --: | " + " | ".join("--:" for _ in range(CALLS)) + " | --: |")
    for pause_s in PAUSES_S:
        got: dict[str, tuple[list[list[float]], list[float]]] = {name: ([], []) for name in sides}
        for r in range(args.rounds):
            names = list(sides)
            for name in names[r % len(names) :] + names[: r % len(names)]:  # each side first in turn
                times, cores = round_of_calls(sides[name], pause_s)
                got[name][0].append(times)
                got[name][1].append(cores)
        for name, (times, cores) in got.items():
            per_call = [statistics.median(t[k] for t in times) for k in range(CALLS)]
            pause = "none (busy)" if pause_s is None else f"{pause_s * 1e3:.0f} ms"
            print(
                f"| {name} | {pause} | " + " | ".join(f"{v:.2f}" for v in per_call) + f" | {statistics.median(cores):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
