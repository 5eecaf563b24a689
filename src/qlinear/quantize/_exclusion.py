"""Which nodes a user's ``exclude`` patterns name.

Real exporters' node names are long and numerous (a CQT front end of 26
Conv nodes named ``/frontend/conv_bank.17/Conv``), so a user names them by
pattern, not one by one. Each pattern is one of:

- a node name or an op type, exactly (``fc1``, ``Conv``);
- a glob over node names, where it holds ``*``, ``?`` or ``[`` (``/frontend/*``);
- a regular expression over node names after ``re:`` (``re:conv_bank\\.\\d+``),
  found anywhere in the name;
- a region, ``FROM..TO``: every node on a path from the tensor or input
  ``FROM`` to the node ``TO``, both ends included (a front end from the
  raw input to its last filter).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

import onnx

from qlinear._errors import QuantizationError
from qlinear.quantize._model import FloatModel

__all__ = ["excluded_nodes", "unmatched"]

_GLOB = frozenset("*?[")


def excluded_nodes(fm: FloatModel, patterns: Iterable[str]) -> set[str]:
    """The names of ``fm``'s nodes that any of ``patterns`` names (see the module's text)."""
    found: set[str] = set()
    for pattern in patterns:
        found |= _matches(fm, pattern)
    return found


def unmatched(fm: FloatModel, patterns: Iterable[str]) -> list[str]:
    """The patterns that name no node of ``fm`` (a typo, or a model other than the one meant).

    An ONNX op type the model does not hold is no typo: one exclusion list
    (``Gemm Conv``) is commonly given to models of every kind; nor is the
    name of a node the target's prepare passes folded into another (a
    BatchNormalization into its Conv, a constant Mul into the Conv beside
    it), which is float wherever that node is.
    """
    return [p for p in patterns if not _matches(fm, p) and not onnx.defs.has(p) and not _names_folded(fm, p)]


def _names_folded(fm: FloatModel, pattern: str) -> bool:
    return ".." not in pattern and bool(_named(sorted(fm.folded), pattern))


def _matches(fm: FloatModel, pattern: str) -> set[str]:
    if ".." in pattern:
        start, _, end = pattern.partition("..")
        return _region(fm, pattern, start, end)
    found = _named([n.name for n in fm.graph.node], pattern)
    if not (pattern.startswith("re:") or _GLOB & set(pattern)):
        found |= {n.name for n in fm.graph.node if n.op_type == pattern}
    return found


def _named(names: list[str], pattern: str) -> set[str]:
    """The ``names`` a name pattern (an expression, a glob or a name) names."""
    if pattern.startswith("re:"):
        try:
            expression = re.compile(pattern[3:])
        except re.error as e:
            raise QuantizationError(f"quantize: exclude pattern {pattern!r} is not a regular expression: {e}") from None
        return {n for n in names if expression.search(n)}
    if _GLOB & set(pattern):
        return {n for n in names if fnmatch.fnmatchcase(n, pattern)}
    return {n for n in names if n == pattern}


def _region(fm: FloatModel, pattern: str, start: str, end: str) -> set[str]:
    """The nodes on a path from tensor ``start`` to node ``end``: downstream of the one and upstream of the other."""
    by_name = {n.name: n for n in fm.graph.node}
    if end not in by_name:
        raise QuantizationError(f"quantize: exclude region {pattern!r}: no node is named {end!r}")
    if not fm.consumers.get(start):
        raise QuantizationError(f"quantize: exclude region {pattern!r}: no node reads a tensor named {start!r}")
    downstream: set[str] = set()
    tensors, frontier = {start}, [start]
    while frontier:
        for n in fm.consumers.get(frontier.pop(), []):
            if n.name in downstream:
                continue
            downstream.add(n.name)
            for o in n.output:
                if o not in tensors:
                    tensors.add(o)
                    frontier.append(o)
    upstream: set[str] = set()
    stack = [by_name[end]]
    while stack:
        n = stack.pop()
        if n.name in upstream:
            continue
        upstream.add(n.name)
        stack.extend(p for i in n.input if (p := fm.producer.get(i)) is not None)
    region = downstream & upstream
    if not region:
        raise QuantizationError(f"quantize: exclude region {pattern!r}: node {end!r} is not downstream of {start!r}")
    return region
