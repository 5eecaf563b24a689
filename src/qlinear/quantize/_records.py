"""Records: dataclasses that are written as plain JSON values and read back from them, by their fields' types.

A record's attribute names are its JSON keys, except where a field's
metadata names the key (``key``: a Python keyword such as ``from``) or
merges a nested record's keys into its own (``flatten``). Reading back is
lenient in one way only: a key an older writer did not write takes the
field's default (None where it has none), so a report saved by an older
qlinear still reads.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

__all__ = ["from_plain", "plain"]

R = TypeVar("R")


def plain(value: Any) -> Any:
    """``value`` as plain JSON-able values: records as dicts in field order, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("skip"):
                continue
            v = plain(getattr(value, f.name))
            if f.metadata.get("flatten"):
                out.update(v)
            else:
                out[f.metadata.get("key", f.name)] = v
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def from_plain(cls: type[R], data: dict[str, Any]) -> R:
    """The record of type ``cls`` that ``data`` (what :func:`plain` gave) holds.

    Fields marked ``skip`` or ``extra`` in their metadata take their
    defaults: the caller fills them.
    """
    if not isinstance(data, dict):
        raise TypeError(f"a {cls.__name__} is read from a JSON object, got {type(data).__name__}")
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("skip") or f.metadata.get("extra"):
            continue
        if f.metadata.get("flatten"):
            values[f.name] = _value(hints[f.name], data)
            continue
        key = f.metadata.get("key", f.name)
        if key in data:
            values[f.name] = _value(hints[f.name], data[key])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A record type's fields' types, resolved once (a report reads hundreds of records of a few types)."""
    return typing.get_type_hints(cls)


def _value(tp: Any, value: Any) -> Any:
    if value is None or tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _value(options[0], value) if len(options) == 1 else value
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(_value(a, v) for a, v in zip(args, value, strict=True))
        items = [_value(args[0] if args else Any, v) for v in value]
        return items if origin is list else tuple(items)
    if origin is dict:
        _, of = typing.get_args(tp) or (str, Any)
        return {k: _value(of, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_plain(tp, value)
    return value
