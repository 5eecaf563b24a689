"""The quantizer's algorithms, each one module behind :mod:`~qlinear.quantize.algorithms._registry`.

Importing this package registers every algorithm; the order of the
registrations below is the order each stage runs them in (and the order of
their options in the report and on the command line).
"""

from __future__ import annotations

from qlinear.quantize.algorithms._registry import ALGORITHMS, STAGES, Algorithm, Facts, register

# The registrations: each module registers its algorithm when imported, in the order of these lines, which is
# the order each stage runs them in. A new algorithm is its module and one line here.
# isort: off
from qlinear.quantize.algorithms import equalize  # noqa: F401
from qlinear.quantize.algorithms import depthwise  # noqa: F401
from qlinear.quantize.algorithms import awq  # noqa: F401
from qlinear.quantize.algorithms import smoothquant  # noqa: F401
from qlinear.quantize.algorithms import bias_correction  # noqa: F401
from qlinear.quantize.algorithms import gptq  # noqa: F401
from qlinear.quantize.algorithms import empirical_bias_correction  # noqa: F401
from qlinear.quantize.algorithms import finetune  # noqa: F401
# isort: on

__all__ = ["ALGORITHMS", "STAGES", "Algorithm", "Facts", "register", "at_stage"]


def at_stage(stage: str, options: object) -> list[Algorithm]:
    """The algorithms of ``stage`` that ``options`` turn on, in the order they run."""
    return [a for a in ALGORITHMS if a.stage == stage and a.on(options)]
