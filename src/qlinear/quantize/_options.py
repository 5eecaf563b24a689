"""What the user asked the quantizer for, checked once."""

from __future__ import annotations

from dataclasses import dataclass, field

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType, element_type

__all__ = [
    "ACTIVATION_TYPES",
    "DEFAULT_AGREEMENT",
    "DEFAULT_SQNR_DB",
    "GRANULARITIES",
    "METHODS",
    "WEIGHT_TYPES",
    "QuantizeOptions",
]

WEIGHT_TYPES = ("int8", "uint8", "int4", "uint4", "int2", "uint2", "float8e4m3fn", "float8e5m2", "float4e2m1")
ACTIVATION_TYPES = ("uint8", "int8", "uint16", "int16", "float8e4m3fn")
METHODS = ("minmax", "percentile", "entropy", "mse")
GRANULARITIES = ("per-tensor", "per-channel", "blocked")
WEIGHT_CLIPS = ("minmax", "mse")
# The target promotions reach when none is given: top-1 agreement for outputs that classify, else output SQNR.
DEFAULT_AGREEMENT = 0.99
DEFAULT_SQNR_DB = 30.0
# The operators quantized by default: the ones that do the arithmetic.
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class QuantizeOptions:
    """The quantizer's settings (the command line's flags, one field each).

    Attributes:
        weights: the weights' type (``WEIGHT_TYPES``).
        activations: the activations' type (``ACTIVATION_TYPES``), or None
            for weight-only quantization.
        method: how activation ranges are chosen from the statistics (default ``"mse"``).
        granularity: weights per tensor, per output channel (the default)
            or in blocks along the reduction axis.
        block_size: elements a block; default 32 for 2/4-bit weights with
            ``granularity="blocked"``; 0 otherwise.
        symmetric: activations signed and symmetric (zero point 0).
        weight_clip: ``"minmax"`` (the default) or ``"mse"`` (per channel or
            block, the clipping range of least squared error).
        exclude: node names or op types left in float.
        percentile: the share of values inside the range for ``method="percentile"``.
        opset: the output's ai.onnx opset; None: the lowest that holds the types.
        batch_size: samples a calibration batch.
        target_agreement: promote sensitive nodes until the top-1 agreement
            with the float model on the eval data is at least this share.
        target_sqnr_db: promote until the output SQNR is at least this.
        promote: with neither target given, promote to the default target
            (:data:`DEFAULT_AGREEMENT`, or :data:`DEFAULT_SQNR_DB` for an
            output that does not classify); False: keep the types asked for
            everywhere.
        max_float: the share of the quantized nodes promotions may leave
            float, rounded up (0: none).
        bias_correction: take the mean error each quantized weight adds to
            its layer's output back out through the bias (Conv, Gemm, and
            MatMul followed by a bias Add), from the calibration data's
            per-channel input means. None (the default): on wherever there
            is calibration data (not with saved statistics alone).
        gptq: round MatMul and Gemm weights of integer types (per channel
            or blocked) by GPTQ, from the Gram matrix of each layer's input
            on the calibration data, instead of to nearest. None (the
            default): on for 2- and 4-bit integer weights wherever there is
            calibration data.
        smoothquant: move outlier input channels of MatMul/Gemm layers into
            their weights (alpha searched per activation) before quantizing.
            None (the default): on for 8-bit integer activations wherever
            the calibration data can be read twice (arrays, not a stream).
        awq: for weight-only layers, scale up the weight rows that meet
            large inputs before rounding (alpha searched per activation).
            None (the default): on for 2- and 4-bit integer weight-only
            quantization wherever the calibration data can be read twice.
        equalize: cross-layer equalization of ``Conv -> [Relu] -> Conv``
            pairs before quantizing (needs no data). Off by default: on the
            CNNs measured it lowered the output SQNR (docs/quantize.md).
        finetune: after the post-training model (and its promotions), train
            its scales this many steps by distillation against the float
            model on the calibration data (needs torch); kept only where it
            beats the post-training model on the held-out data. 0: off.
        finetune_weights: train the weights too, from their float values
            (their codes change); False: the scales alone.
    """

    weights: str = "int8"
    activations: str | None = "uint8"
    method: str = "mse"
    granularity: str = "per-channel"
    block_size: int = 0
    symmetric: bool = False
    weight_clip: str = "minmax"
    exclude: tuple[str, ...] = field(default_factory=tuple)
    percentile: float = 99.999
    opset: int | None = None
    batch_size: int = 16
    target_agreement: float | None = None
    target_sqnr_db: float | None = None
    promote: bool = True
    max_float: float = 0.25
    bias_correction: bool | None = None
    gptq: bool | None = None
    smoothquant: bool | None = None
    awq: bool | None = None
    equalize: bool = False
    finetune: int = 0
    finetune_weights: bool = True

    def __post_init__(self) -> None:
        _one_of("weights", self.weights, WEIGHT_TYPES)
        if self.activations is not None:
            _one_of("activations", self.activations, ACTIVATION_TYPES)
        _one_of("method", self.method, METHODS)
        _one_of("granularity", self.granularity, GRANULARITIES)
        _one_of("weight_clip", self.weight_clip, WEIGHT_CLIPS)
        if not isinstance(self.block_size, int) or self.block_size < 0:
            raise QuantizationError(f"quantize: block_size must be an int >= 0, got {self.block_size!r}")
        if self.granularity == "blocked" and self.block_size == 0:
            object.__setattr__(self, "block_size", 32)
        if self.granularity != "blocked" and self.block_size:
            raise QuantizationError(
                f"quantize: block_size needs granularity='blocked', got block_size={self.block_size} with granularity={self.granularity!r}"
            )
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise QuantizationError(f"quantize: batch_size must be an int >= 1, got {self.batch_size!r}")
        if not 50.0 <= float(self.percentile) <= 100.0:
            raise QuantizationError(f"quantize: percentile must be in [50, 100], got {self.percentile!r}")
        if self.opset is not None and not (isinstance(self.opset, int) and 10 <= self.opset):
            raise QuantizationError(f"quantize: opset must be an int >= 10, got {self.opset!r}")
        if self.target_agreement is not None and self.target_sqnr_db is not None:
            raise QuantizationError("quantize: give target_agreement or target_sqnr_db, not both")
        if self.target_agreement is not None and not 0.0 < float(self.target_agreement) <= 1.0:
            raise QuantizationError(f"quantize: target_agreement must be in (0, 1], got {self.target_agreement!r}")
        if self.target_sqnr_db is not None and not isinstance(self.target_sqnr_db, (int, float)):
            raise QuantizationError(f"quantize: target_sqnr_db must be a number of dB, got {self.target_sqnr_db!r}")
        if not 0.0 <= float(self.max_float) <= 1.0:
            raise QuantizationError(f"quantize: max_float must be in [0, 1], got {self.max_float!r}")
        if self.symmetric and self.activations in ("uint8", "uint16"):
            signed = "int" + self.activations[4:]
            object.__setattr__(self, "activations", signed)
        if not (isinstance(self.finetune, int) and not isinstance(self.finetune, bool) and self.finetune >= 0):
            raise QuantizationError(f"quantize: finetune must be an int >= 0 (training steps), got {self.finetune!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def weight_type(self) -> ElementType:
        return element_type(self.weights)

    @property
    def activation_type(self) -> ElementType | None:
        return None if self.activations is None else element_type(self.activations)

    def to_dict(self) -> dict:
        """The settings as plain values, enough to repeat the run."""
        return {
            "weights": self.weights,
            "activations": self.activations,
            "method": self.method,
            "granularity": self.granularity,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
            "weight_clip": self.weight_clip,
            "exclude": list(self.exclude),
            "percentile": self.percentile,
            "opset": self.opset,
            "batch_size": self.batch_size,
            "target_agreement": self.target_agreement,
            "target_sqnr_db": self.target_sqnr_db,
            "promote": self.promote,
            "max_float": self.max_float,
            "bias_correction": self.bias_correction,
            "gptq": self.gptq,
            "smoothquant": self.smoothquant,
            "awq": self.awq,
            "equalize": self.equalize,
            "finetune": self.finetune,
            "finetune_weights": self.finetune_weights,
        }


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise QuantizationError(f"quantize: {name} must be one of {', '.join(allowed)}, got {value!r}")
