"""The processor a benchmark ran on, so figures from different machines are never mixed up.

Two machines of one cloud's "2 vCPU" kind can differ in everything that
decides a kernel's speed: an AMD EPYC and an Intel Xeon guest gave 8-bit
QuantizeLinear ratios against ONNX Runtime of 0.98 and 1.3 with the same
code. Every ``qlinear bench`` table is printed under this description, and
every JSON report carries it.
"""

from __future__ import annotations

import os
import platform

__all__ = ["VECTOR_FEATURES", "machine", "machine_line"]

# The vector features that decide how the kernels' loops compile, in the
# order they grew; LLVM names them so in its host feature list.
VECTOR_FEATURES = (
    "sse4.1",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
    "avx512bf16",
    "avx512fp16",
    "avxvnni",
    "amx-int8",
    "neon",
    "sve",
)


def _model_name() -> str:
    """The processor's marketing name (``/proc/cpuinfo``'s ``model name`` on Linux), or what Python's platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, object]:
    """``{"cpu", "llvm_cpu", "vector_features", "logical_cpus"}``: the processor, and what numba's LLVM compiles for on it.

    ``llvm_cpu`` and ``vector_features`` are the target numba compiles the
    kernels for: the host's unless ``NUMBA_CPU_NAME`` or
    ``NUMBA_CPU_FEATURES`` say otherwise (then they say so).
    """
    from llvmlite import binding
    from numba.core import config

    features = binding.get_host_cpu_features()
    return {
        "cpu": _model_name(),
        "llvm_cpu": config.CPU_NAME or binding.get_host_cpu_name(),
        "vector_features": [name for name in VECTOR_FEATURES if features.get(name, False)],
        "numba_features_override": config.CPU_FEATURES or None,
        "logical_cpus": os.cpu_count(),
    }


def machine_line(described: dict[str, object] | None = None) -> str:
    """One line naming the processor, LLVM's name for it and its vector features."""
    m = described if described is not None else machine()
    features = " ".join(m["vector_features"]) or "none of " + ", ".join(VECTOR_FEATURES[:3])
    override = f"; NUMBA_CPU_FEATURES={m['numba_features_override']}" if m.get("numba_features_override") else ""
    return f"CPU: {m['cpu']} ({m['logical_cpus']} logical CPUs; LLVM target {m['llvm_cpu']}: {features}{override})"
