"""The names of the Q/DQ the quantizer adds around an activation, a weight or a bias: short, since a small model's file is largely names.

A tensor ``t`` quantized gives ``t_q`` (its codes), ``t_scale`` and
``t_zp`` (its parameters) and ``t_dq`` (the values a DequantizeLinear
gives back; ``t_dq_1``, ... for its other readers). A node added takes
its output's name: node and tensor names are separate name spaces in
ONNX, and the in-memory path makes each name fresh among both, so it is
unique in each. The streaming path, which has no graph in memory to ask,
appends the suffixes to the weights' names. The long forms
before (``t_quantized``, ``t_DequantizeLinear_consumer``) made a 270 KB
classifier's file 6% larger, and a 21 KB digits CNN's 5%.
"""

from __future__ import annotations

__all__ = ["CODES", "SCALE", "VALUES", "ZERO_POINT"]

CODES = "_q"
VALUES = "_dq"
SCALE = "_scale"
ZERO_POINT = "_zp"
