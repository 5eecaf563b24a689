"""Graph rewrites as passes, in the shape of onnx-ir's (``onnx_ir.passes``): a pass, its result, a sequence, checks.

qlinear's rewrites work on ``onnx.ModelProto`` and on the quantizer's
float model rather than on ``onnx_ir`` models, and an error a pass raises
for the user (a :class:`~qlinear.QuantizationError`) must reach them as it
is, where ``onnx_ir.passes.Sequential`` wraps it in a ``PassError``; so
the few lines of the same shape are here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FunctionPass", "Pass", "PassResult", "Sequential"]


@dataclass
class PassResult:
    """What a pass returns: the model (the same object for an in-place pass) and whether it changed it."""

    model: Any
    modified: bool


class Pass:
    """One rewrite: :meth:`call` does it; :meth:`requires` and :meth:`ensures` check the model before and after.

    Every pass of qlinear rewrites its model in place (``in_place``), as
    ``onnx_ir.passes.InPlacePass`` does: the result holds the same object.
    """

    in_place = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def requires(self, model: Any) -> None:
        """Raise if ``model`` is not one this pass can rewrite."""

    def ensures(self, model: Any) -> None:
        """Raise if the rewritten ``model`` breaks what this pass promises."""

    def call(self, model: Any) -> PassResult:
        raise NotImplementedError(f"{self.name}.call")

    def __call__(self, model: Any) -> PassResult:
        self.requires(model)
        result = self.call(model)
        if not isinstance(result, PassResult) or (self.in_place and result.model is not model):
            raise TypeError(f"pass {self.name}: call must return a PassResult holding the model it was given")
        self.ensures(result.model)
        return result

    def __repr__(self) -> str:
        return self.name


class FunctionPass(Pass):
    """A pass made of a function that rewrites its model in place and says whether it changed it.

    ``after`` runs on the model once the function changed it (the float
    model's indexes are rebuilt this way).
    """

    def __init__(self, rewrite: Callable[[Any], bool], *, name: str | None = None, after: Callable[[Any], Any] | None = None):
        self.rewrite = rewrite
        self._name = name or getattr(rewrite, "__name__", None) or getattr(getattr(rewrite, "func", None), "__name__", "rewrite")
        self.after = after

    @property
    def name(self) -> str:
        return self._name.lstrip("_")

    def call(self, model: Any) -> PassResult:
        modified = bool(self.rewrite(model))
        if modified and self.after is not None:
            self.after(model)
        return PassResult(model, modified)


class Sequential(Pass):
    """Passes run in order on one model; modified where any of them modified it."""

    def __init__(self, *passes: Pass):
        self.passes = passes

    @property
    def name(self) -> str:
        return "Sequential(" + ", ".join(p.name for p in self.passes) + ")"

    def call(self, model: Any) -> PassResult:
        modified = False
        for p in self.passes:
            modified = p(model).modified or modified
        return PassResult(model, modified)
