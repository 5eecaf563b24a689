"""nn.Modules for QuantizeLinear, DequantizeLinear and fake quantization.

Each quantizer holds a quantized type, a granularity and its qparams, kept
one of four ways (``qparams=``):

* ``"fixed"``: the ``scale`` and ``zero_point`` given, as buffers;
* ``"minmax"``: observed in training mode, the running min and max;
* ``"moving_average"``: observed, ``m += averaging_constant * (batch - m)``;
* ``"learnable"``: parameters (LSQ gradients), set from the first training
  batch's range unless ``scale`` is given.

In training mode the module observes and records autograd; in eval mode it
only computes, with nothing saved for backward (the seed's ``training?``).
``grad_scale`` is the seed's ``lda coeff``. Per-axis and blocked qparams get
their shape from the first input (or :meth:`initialize`): create optimizers
after that.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, is_lazy

from qlinear._errors import QuantizationError
from qlinear.spec import Granularity
from qlinear.torch._functional import dequantize_linear, fake_quantize, quantize_linear
from qlinear.torch._qparams import extremes, from_range, param_shape
from qlinear.torch._types import resolve_type

__all__ = ["QuantizeLinear", "DequantizeLinear", "FakeQuantize"]

POLICIES = ("fixed", "minmax", "moving_average", "learnable")


# The smallest scale a learned one is kept at: float32's smallest normal value, the floor ONNX models hold.
SCALE_FLOOR = 2.0**-126


class _Quantizer(nn.Module):
    """What QuantizeLinear and FakeQuantize share: type, granularity, qparams."""

    def __init__(
        self,
        dtype: Any = "int8",
        *,
        qparams: str = "minmax",
        axis: int | None = None,
        block_size: int = 0,
        symmetric: bool = True,
        averaging_constant: float = 0.01,
        scale: torch.Tensor | None = None,
        zero_point: torch.Tensor | None = None,
        saturate: bool = True,
        precision: Any = None,
        grad_scale: float = 1.0,
    ) -> None:
        super().__init__()
        caller = type(self).__name__
        self.qtype = resolve_type(dtype, what=f"{caller}: dtype")
        if self.qtype.kind not in ("int", "float") or self.qtype.name == "int32":
            raise QuantizationError(f"{caller}: dtype must be a quantized type (int8, int4, float8e4m3fn, ...), got {self.qtype}")
        if qparams not in POLICIES:
            raise QuantizationError(f"{caller}: qparams must be one of {POLICIES}, got {qparams!r}")
        if qparams == "fixed" and scale is None:
            raise QuantizationError(f"{caller}: qparams='fixed' needs a scale, got scale=None")
        if not symmetric and not self.qtype.is_integer:
            raise QuantizationError(f"{caller}: symmetric=False needs an integer dtype, got {self.qtype}")
        if axis is None and block_size:
            raise QuantizationError(f"{caller}: block_size={block_size} needs an axis, got axis=None")
        self.policy, self.axis, self.block_size = qparams, axis, int(block_size)
        self.symmetric, self.averaging_constant = symmetric, float(averaging_constant)
        self.saturate, self.precision, self.grad_scale = saturate, precision, float(grad_scale)
        learn_zp = qparams == "learnable" and not symmetric
        given = scale is not None
        if scale is not None:
            scale = torch.as_tensor(scale, dtype=torch.float32) if not isinstance(scale, torch.Tensor) else scale.detach().clone()
            zero_point = torch.zeros_like(scale) if zero_point is None else torch.as_tensor(zero_point).detach().clone()
            zero_point = zero_point.to(torch.float32)
        elif axis is None:
            scale, zero_point = torch.ones(()), torch.zeros(())
        if qparams == "learnable":
            self.scale = nn.Parameter(scale) if scale is not None else UninitializedParameter()
            if learn_zp:
                self.zero_point = nn.Parameter(zero_point) if zero_point is not None else UninitializedParameter()
            else:
                self.register_buffer("zero_point", zero_point if zero_point is not None else UninitializedBuffer())
        else:
            self.register_buffer("scale", scale if scale is not None else UninitializedBuffer())
            self.register_buffer("zero_point", zero_point if zero_point is not None else UninitializedBuffer())
        if qparams in ("minmax", "moving_average"):
            self.register_buffer("min_val", UninitializedBuffer())
            self.register_buffer("max_val", UninitializedBuffer())
        # Set once qparams hold real values: given, observed or initialised.
        self.register_buffer("initialized", torch.tensor(given))
        self._register_load_state_dict_pre_hook(self._materialize_for_load)

    @property
    def granularity(self) -> Granularity:
        """The granularity the module's qparams have."""
        if self.axis is None:
            return Granularity("per_tensor")
        return Granularity("blocked" if self.block_size else "per_axis", self.axis, self.block_size)

    def _normalized(self, x_shape: tuple[int, ...]) -> Granularity:
        g = self.granularity
        if g.kind == "per_tensor":
            return g
        if not -len(x_shape) <= g.axis < len(x_shape):
            raise QuantizationError(f"{type(self).__name__}: axis={g.axis} is out of range for input of shape {x_shape}")
        if g.block_size and g.block_size > x_shape[g.axis]:
            # Every block would be cut short by the axis: a block a row, stored at more than the float's size.
            raise QuantizationError(
                f"{type(self).__name__}: block_size={g.block_size} runs along axis {g.axis} of size {x_shape[g.axis]} "
                f"(input shape {x_shape}); use a block of at most {x_shape[g.axis]}, or per-axis (block_size=0)"
            )
        return Granularity(g.kind, g.axis % len(x_shape), g.block_size)

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Set the qparams (and their shapes) from ``x``'s range, observing it once."""
        g = self._normalized(tuple(x.shape))
        lo, hi = extremes(x.detach(), g)
        shape = param_shape(g, tuple(x.shape))
        for name in ("scale", "zero_point", "min_val", "max_val"):
            t = getattr(self, name, None)
            if t is not None and is_lazy(t):
                t.materialize(shape, device=x.device, dtype=torch.float32)
        if self.policy in ("minmax", "moving_average"):
            if self.initialized:
                if self.policy == "minmax":
                    lo, hi = torch.minimum(self.min_val, lo), torch.maximum(self.max_val, hi)
                else:
                    c = self.averaging_constant
                    lo, hi = self.min_val + c * (lo - self.min_val), self.max_val + c * (hi - self.max_val)
            self.min_val.copy_(lo)
            self.max_val.copy_(hi)
        scale, zero_point = from_range(lo, hi, self.qtype, self.symmetric)
        self.scale.copy_(scale)
        self.zero_point.copy_(zero_point)
        self.initialized.fill_(True)

    @torch.no_grad()
    def keep_scale_valid(self) -> None:
        """Project a learned scale back to at least :data:`SCALE_FLOOR` (a NaN one as well).

        Called before every forward, so an optimizer step that took a scale
        to zero or below (or to NaN) is undone where the scale is next used,
        and on export. A projection rather than a parametrization (``exp``,
        ``softplus``): the parameter stays the scale itself, so its LSQ
        gradient is LSQ's, its value is what is exported, and an optimizer's
        state means what it says.
        """
        self.scale.copy_(
            torch.nan_to_num(self.scale, nan=SCALE_FLOOR, posinf=torch.finfo(torch.float32).max).clamp_min(SCALE_FLOOR)
        )

    def _materialize_for_load(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # Uninitialised qparams take the saved shapes before the copy.
        for name in ("scale", "zero_point", "min_val", "max_val"):
            t = getattr(self, name, None)
            if t is not None and is_lazy(t) and prefix + name in state_dict:
                t.materialize(state_dict[prefix + name].shape, dtype=torch.float32)

    def _qparams_for(self, x: torch.Tensor) -> None:
        """Observe or initialise in training mode; insist on values in eval mode; keep learned scales positive."""
        if self.training and (self.policy in ("minmax", "moving_average") or not self.initialized):
            if self.policy != "fixed":
                self.initialize(x)
        if self.policy == "learnable" and self.initialized:
            self.keep_scale_valid()
        if not self.initialized:
            raise QuantizationError(
                f"{type(self).__name__}: qparams are not set; run it in training mode on data first, call initialize(x), or give a scale"
            )

    def _kwargs(self) -> dict[str, Any]:
        return {
            "axis": 1 if self.axis is None else self.axis,
            "block_size": self.block_size,
            "output_dtype": self.qtype.name,
            "saturate": self.saturate,
            "precision": self.precision,
        }

    def _run(self, fn: Any, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():  # export_onnx checked the qparams; the kernels cannot be traced
            from qlinear.torch._dynamo import exported_call

            kind = "fake" if fn is fake_quantize else "quantize"
            return exported_call(kind, x, self.scale, self.zero_point, self._kwargs())
        self._qparams_for(x)
        if not self.training:
            with torch.no_grad():
                return fn(x, self.scale, self.zero_point, **self._kwargs())
        return fn(x, self.scale, self.zero_point, grad_scale=self.grad_scale, **self._kwargs())

    def extra_repr(self) -> str:
        return f"{self.qtype}, {self.granularity}, qparams={self.policy}"


class QuantizeLinear(_Quantizer):
    """QuantizeLinear as a module: ``y = saturate(round(x / scale) + zero_point)``.

    The output is a float32 tensor holding the quantized values. Arguments
    are described in the module docstring of :mod:`qlinear.torch._modules`.

    >>> q = QuantizeLinear("int8", qparams="fixed", scale=torch.tensor(0.5)).eval()
    >>> q(torch.tensor([1.0, -100.0])).tolist()
    [2.0, -128.0]
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(quantize_linear, x)


class FakeQuantize(_Quantizer):
    """DequantizeLinear(QuantizeLinear(x)) as a module, with LSQ gradients.

    The output has ``x``'s dtype and is bit-identical to the numpy operators
    chained. Arguments are described in :mod:`qlinear.torch._modules`.

    >>> fq = FakeQuantize("int4", qparams="fixed", scale=torch.tensor(0.5)).eval()
    >>> fq(torch.tensor([0.3, 9.0])).tolist()
    [0.5, 3.5]
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(fake_quantize, x)


class DequantizeLinear(nn.Module):
    """DequantizeLinear as a module: ``y = (x - zero_point) * scale``.

    Args:
        source: a :class:`QuantizeLinear` whose qparams (whatever their
            policy) this module uses, so Q and DQ stay paired.
        dtype, scale, zero_point, axis, block_size: fixed qparams instead of
            a source; ``learnable=True`` makes them parameters.

    >>> dq = DequantizeLinear(dtype="int8", scale=torch.tensor(0.5))
    >>> dq(torch.tensor([2.0, -128.0])).tolist()
    [1.0, -64.0]
    """

    def __init__(
        self,
        source: QuantizeLinear | None = None,
        *,
        dtype: Any = None,
        scale: torch.Tensor | None = None,
        zero_point: torch.Tensor | None = None,
        axis: int | None = None,
        block_size: int = 0,
        learnable: bool = False,
    ) -> None:
        super().__init__()
        if (source is None) == (scale is None):
            raise QuantizationError("DequantizeLinear: give either source (a QuantizeLinear) or scale, not both or neither")
        # Not a submodule: the source sits elsewhere in the model and owns its qparams.
        self._source = [source] if source is not None else []
        if source is None:
            self.qtype = resolve_type(dtype if dtype is not None else "int8", what="DequantizeLinear: dtype")
            scale = scale.detach().clone().to(torch.float32)
            zero_point = torch.zeros_like(scale) if zero_point is None else zero_point.detach().clone().to(torch.float32)
            if learnable:
                self.scale, self.zero_point = nn.Parameter(scale), nn.Parameter(zero_point)
            else:
                self.register_buffer("scale", scale)
                self.register_buffer("zero_point", zero_point)
            self.axis, self.block_size = axis, int(block_size)

    @property
    def source(self) -> QuantizeLinear | None:
        """The QuantizeLinear this module takes its qparams from, if any."""
        return self._source[0] if self._source else None

    def qparams(self) -> tuple[Any, torch.Tensor, torch.Tensor, int | None, int]:
        """``(qtype, scale, zero_point, axis, block_size)`` in use."""
        src = self.source
        if src is not None:
            return src.qtype, src.scale, src.zero_point, src.axis, src.block_size
        return self.qtype, self.scale, self.zero_point, self.axis, self.block_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qtype, scale, zero_point, axis, block_size = self.qparams()
        kwargs = {"axis": 1 if axis is None else axis, "block_size": block_size, "input_dtype": qtype.name}
        if torch.compiler.is_exporting():
            from qlinear.torch._dynamo import exported_call

            return exported_call("dequantize", x, scale, zero_point, kwargs)
        if not self.training:
            with torch.no_grad():
                return dequantize_linear(x, scale, zero_point, **kwargs)
        return dequantize_linear(x, scale, zero_point, **kwargs)
