"""ONNX Runtime latency as the quantizer benchmarks time it: sessions taking turns on the same cores, medians."""

from __future__ import annotations

import statistics
import time

import onnx
import onnxruntime as ort


def session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    """A 2-thread CPU session whose idle threads do not spin (the sessions take turns on the same cores)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def medians_ms(sessions: dict[str, ort.InferenceSession], feeds: dict, *, rounds: int, calls: int) -> dict[str, float]:
    """Each session's median time a run, in ms: every session in turn in each round, ``calls`` runs a turn."""
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for s in sessions.values():
        s.run(None, feeds)
    for _ in range(rounds):
        for label, s in sessions.items():
            start = time.perf_counter()
            for _ in range(calls):
                s.run(None, feeds)
            times[label].append((time.perf_counter() - start) * 1e3 / calls)
    return {label: statistics.median(t) for label, t in times.items()}
