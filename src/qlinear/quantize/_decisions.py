"""Independent probabilities judged by the decisions they carry, not by their SQNR.

A text detector's probability map, a voice-activity detector's speech
probability, a multi-label tagger's scores: each is a Sigmoid, and its
users threshold it. Their SQNR is ruled by the many scores near 0 nobody
acts on (a detector's background), so a 30 dB target there buys accuracy
no decision needs: PP-OCRv4's detector took 16 nodes back to float to
reach it, where 8 bits alone kept 97.4% of its decisions.

The measure: the scores above 0.5 in the float model and in the quantized
one, compared as two sets over all the eval data, by their F1 (twice the
shared ones over the two counts): 1 where they are the same, and where
neither holds any. The default target is the same 99% as top-1
agreement's, where the eval data holds enough positive decisions to judge
it (:data:`FEWEST_DECISIONS`); otherwise the output's SQNR is.
"""

from __future__ import annotations

import numpy as np
import onnx

from qlinear.onnx._graph import producers
from qlinear.quantize._evaluate import Reference, Runner

__all__ = ["FEWEST_DECISIONS", "THRESHOLD", "decisions_kept", "positive_decisions", "sigmoid_scores"]

THRESHOLD = 0.5  # a probability's decision
# The float model's positive decisions the eval data must hold for them to judge a 99% target: with 9 (Silero VAD's
# speech windows among 96), one window near 0.5 is 6% of the figure. With fewer, the output is judged by its SQNR.
FEWEST_DECISIONS = 100
# What probabilities pass through on their way out, still probabilities (a mean of them too: Silero's over its frames).
_PASS_THROUGH = frozenset(
    {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Cast", "Slice", "ReduceMean", "ReduceMax"}
)


def sigmoid_scores(model: onnx.ModelProto, output: str) -> bool:
    """Whether ``output`` is made by a Sigmoid, through reshapes, casts and means only: independent probabilities."""
    return _made_by_sigmoid(output, [producers(model.graph)])


def _made_by_sigmoid(output: str, scopes: list[dict[str, onnx.NodeProto]]) -> bool:
    """The walk back from ``output``; ``scopes``: the producers of the graph it is in, then of the graphs around it.

    An If's output counts where each branch makes its own by a Sigmoid (a
    branch may pass on a tensor of the graph around it, as Silero VAD's do).
    """
    name = output
    for _ in range(32):
        node = next((scope[name] for scope in scopes if name in scope), None)
        if node is None:
            return False
        if node.op_type == "Sigmoid" and node.domain in ("", "ai.onnx"):
            return True
        if node.op_type == "If":
            k = list(node.output).index(name)
            branches = [a.g for a in node.attribute if a.name in ("then_branch", "else_branch")]
            return bool(branches) and all(_made_by_sigmoid(b.output[k].name, [producers(b), *scopes]) for b in branches)
        if node.op_type not in _PASS_THROUGH:
            return False
        name = node.input[0]
    return False


def positive_decisions(reference: Reference) -> int:
    """The float model's first-output scores above :data:`THRESHOLD` over the reference's batches."""
    return sum(int(np.count_nonzero(np.asarray(ref[reference.output]) > THRESHOLD)) for _, ref in reference.batches)


def decisions_kept(model: onnx.ModelProto, reference: Reference) -> float:
    """The F1 of ``model``'s first-output scores above :data:`THRESHOLD` against the float model's, over every batch."""
    runner = Runner(model, [reference.output], reference.runtime)
    shared = total = 0
    for feeds, ref in reference.batches:
        want = np.asarray(ref[reference.output]) > THRESHOLD
        got = np.asarray(runner(feeds)[reference.output]) > THRESHOLD
        shared += int(np.count_nonzero(want & got))
        total += int(np.count_nonzero(want)) + int(np.count_nonzero(got))
    return 1.0 if total == 0 else 2 * shared / total
