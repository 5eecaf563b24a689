"""Wrap the weights and input activations of Linear and Conv layers with FakeQuantize."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from qlinear._errors import QuantizationError
from qlinear.torch._modules import FakeQuantize

__all__ = ["QuantSpec", "QuantConfig", "QuantizedModule", "quantize_modules"]

WRAPPED = (nn.Linear, nn.Conv1d, nn.Conv2d)


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize one tensor: the arguments of :class:`FakeQuantize`.

    >>> QuantSpec("int4", axis=1, block_size=16).build()
    FakeQuantize(int4, blocked(axis=1, block_size=16), qparams=minmax)
    """

    dtype: Any = "int8"
    qparams: str = "minmax"
    axis: int | None = None
    block_size: int = 0
    symmetric: bool = True
    averaging_constant: float = 0.01
    saturate: bool = True
    grad_scale: float = 1.0

    def build(self) -> FakeQuantize:
        """A fresh :class:`FakeQuantize` with these settings."""
        return FakeQuantize(
            self.dtype,
            qparams=self.qparams,
            axis=self.axis,
            block_size=self.block_size,
            symmetric=self.symmetric,
            averaging_constant=self.averaging_constant,
            saturate=self.saturate,
            grad_scale=self.grad_scale,
        )


@dataclass(frozen=True)
class QuantConfig:
    """What :func:`quantize_modules` does to each Linear/Conv1d/Conv2d layer.

    Attributes:
        weight: quantization of the weight (default int8 per output channel,
            min-max); None leaves weights in float.
        activation: quantization of the layer's input (default uint8
            per-tensor, asymmetric, moving average); None leaves inputs in float.
    """

    weight: QuantSpec | None = field(default_factory=lambda: QuantSpec("int8", axis=0))
    activation: QuantSpec | None = field(default_factory=lambda: QuantSpec("uint8", qparams="moving_average", symmetric=False))


class QuantizedModule(nn.Module):
    """A Linear or Conv layer computing on fake-quantized input and weight.

    ``forward(x) = layer(input_quant(x))`` with the weight replaced by
    ``weight_quant(layer.weight)``; the bias stays in float.
    """

    def __init__(self, layer: nn.Module, weight_quant: FakeQuantize | None, input_quant: FakeQuantize | None) -> None:
        super().__init__()
        self.layer, self.weight_quant, self.input_quant = layer, weight_quant, input_quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_quant is not None:
            x = self.input_quant(x)
        w = self.layer.weight if self.weight_quant is None else self.weight_quant(self.layer.weight)
        if isinstance(self.layer, nn.Linear):
            return nn.functional.linear(x, w, self.layer.bias)
        return self.layer._conv_forward(x, w, self.layer.bias)


def quantize_modules(model: nn.Module, config: QuantConfig | None = None) -> nn.Module:
    """Replace every nn.Linear, nn.Conv1d and nn.Conv2d in ``model`` by a :class:`QuantizedModule`.

    Weight quantizers take their qparams from the weight at once (so
    optimizers created afterwards see learnable ones); input quantizers
    observe or initialise on the first training-mode batches. The model is
    changed in place and returned. A weight whose blocks would run along an
    axis shorter than a block is quantized per output channel, with a
    warning naming the layer.

    Raises:
        QuantizationError: ``model`` is not an nn.Module, or holds no layer to wrap.

    >>> m = quantize_modules(nn.Sequential(nn.Linear(4, 2)))
    >>> type(m[0]).__name__
    'QuantizedModule'
    """
    if not isinstance(model, nn.Module):
        raise QuantizationError(f"quantize_modules: model must be a torch.nn.Module, got {type(model).__name__}")
    config = config or QuantConfig()
    wrapped = 0
    names = {id(m): n for n, m in model.named_modules()}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, WRAPPED):
                spec = config.weight
                if spec is not None and spec.block_size and spec.axis is not None:
                    length = child.weight.shape[spec.axis]
                    if spec.block_size > length:
                        # Blocks cut short by the axis (a first convolution's single input channel, say) would
                        # store more than the float weight: one scale an output channel instead.
                        warnings.warn(
                            f"quantize_modules: {names.get(id(child), name)}: blocks of {spec.block_size} along axis "
                            f"{spec.axis} of size {length}; quantized per output channel (axis 0) instead",
                            stacklevel=2,
                        )
                        spec = replace(spec, axis=0, block_size=0)
                weight_quant = None if spec is None else spec.build()
                if weight_quant is not None:
                    weight_quant.initialize(child.weight)
                input_quant = None if config.activation is None else config.activation.build()
                setattr(parent, name, QuantizedModule(child, weight_quant, input_quant))
                wrapped += 1
    if not wrapped:
        raise QuantizationError(
            f"quantize_modules: model must hold a {', '.join(t.__name__ for t in WRAPPED)} as a submodule, got none in {type(model).__name__}"
        )
    return model
