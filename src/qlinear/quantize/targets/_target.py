"""The target interface: what one runtime fuses, and how a QDQ model is laid out for it.

A target is one :class:`Target` object in its own module of this package.
The pipeline asks it for the float-exact rewrites the runtime needs before
it fuses (``prepare``), the layout rewrites of the quantized model
(``finalize``), the check of what the runtime actually fused
(``check_fusion``), why a node of given types runs in float on it
whatever the layout (``float_by_design``) and the promotion steps the
accuracy search may take on it (``ladder``). Model-semantic rules (a Log
downstream, graph outputs, subgraph reads, user exclusions) are the
planner's, the same on every target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qlinear.onnx._passes import Pass
from qlinear.quantize._precision import Ladder

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    """One runtime's rules.

    Attributes:
        name: what ``--target`` takes and the report shows.
        runtime: the runtime and its provider, in words.
        providers: the execution providers its sessions run on.
        prepare: the float-exact rewrites of the float model that let the
            runtime fuse, as one pass (given whether the run is weight-only).
        finalize: the rewrites of the quantized model into the layout the
            runtime runs fastest (the same values), as one pass.
        check_fusion: which of the quantized nodes the runtime fused, from
            the model and those nodes' names (None: it cannot load it).
        float_by_design: why the runtime runs a node of (op type, weight
            type, activation type) in float whatever its layout, or None.
        ladder: the promotion steps the accuracy search may take on it.
    """

    name: str
    runtime: str
    providers: tuple[str, ...]
    prepare: Callable[[bool], Pass]
    finalize: Pass
    check_fusion: Callable[[Any, list[str]], Any]
    float_by_design: Callable[[str, str | None, str | None], str | None]
    ladder: Ladder
