"""The runtimes a quantized model is placed for, each one :class:`~qlinear.quantize.targets._target.Target`.

ONNX Runtime's CPU provider (``"ort-cpu"``) is the default. A new target is
one module here and one line in :data:`TARGETS`.
"""

from __future__ import annotations

from qlinear._errors import QuantizationError
from qlinear.quantize.targets._target import QDQ_FORM, Placement, Target
from qlinear.quantize.targets.openvino import OPENVINO
from qlinear.quantize.targets.ort_cpu import ORT_CPU

__all__ = ["DEFAULT_TARGET", "FORMS", "OPENVINO", "ORT_CPU", "QDQ_FORM", "TARGETS", "Placement", "Target", "target"]

TARGETS: dict[str, Target] = {t.name: t for t in (ORT_CPU, OPENVINO)}
DEFAULT_TARGET = ORT_CPU.name
# Every form a model can be written in: standard QDQ, then each target's own.
FORMS = (QDQ_FORM, *dict.fromkeys(f for t in TARGETS.values() for f in t.forms))


def target(name: str) -> Target:
    """The target named ``name``; refused where it cannot run on this machine (its runtime not installed)."""
    if name not in TARGETS:
        raise QuantizationError(f"quantize: target must be one of {', '.join(TARGETS)}, got {name!r}")
    why = TARGETS[name].requires()
    if why is not None:
        raise QuantizationError(f"quantize: {why}")
    return TARGETS[name]
