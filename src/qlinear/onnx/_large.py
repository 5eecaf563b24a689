"""Models past protobuf's 2 GiB limit: their weights held beside the graph, never serialized with it.

Protobuf serializes no message of 2 GiB or more, so a model whose weights
pass that cannot reach ONNX Runtime, the checker or shape inference as
bytes, and every copy of it costs its weights. Here its large initializers
are *markers* (name, type and shape; data location EXTERNAL, naming a
:class:`TensorStore`) and their values live in the store: small arrays,
or slices of a file (the model's external data, or the store's own for
values it was given), mapped read-only at each use. Copies of the
graph cost the graph alone.

- ONNX Runtime (:func:`qlinear.onnx._parts.session`) receives the
  values as tensors beside the graph
  (``SessionOptions.add_external_initializers``): nothing is written to
  disk and nothing but the graph is serialized;
- shape inference reads types and shapes from the markers;
- the checker sees markers as graph inputs of the same type and shape (it
  would look for a data file); a written model is checked by path;
- :func:`qlinear.onnx.save` writes their values to the external data file.

A model under the limit takes the ordinary path everywhere.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import TensorProto, helper, numpy_helper

from qlinear._errors import QuantizationError

__all__ = [
    "PROTOBUF_LIMIT", "TensorStore", "byte_size", "check_model", "copy_fields", "digest", "graph_only", "has_markers", "infer_shapes", "inline", "into_store",
    "is_large", "tensor_bytes", "value_of",
]  # fmt: skip

# What protobuf serializes, less a margin for the graph around the tensors.
PROTOBUF_LIMIT = (2 << 30) - (64 << 20)
# Initializers of this many bytes or more leave the graph-only copy.
MOVED_THRESHOLD = 1 << 20
# ONNX Runtime's session settings: no packed copy of a weight; the file beside an optimized model for its weights.
NO_PACKED_COPIES = "session.disable_prepacking"
OPTIMIZED_DATA = "session.optimized_model_external_initializers_file_name"
# Values a store is given of this many bytes or more go to its spill file (TensorStore).
SPILLED_BYTES = 16 << 20
_MARKER_LOCATION = "qlinear-in-memory"  # names no file: the values travel beside the graph
_STORE_SCHEME = "qlinear-store:"  # a store marker's location: the scheme, the store's key, "/", the value's number
_STORES: weakref.WeakValueDictionary[str, TensorStore] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class _FileSlice:
    """A value that lives in a file: read through a fresh read-only memory map at each use."""

    path: str
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    def read(self) -> np.ndarray:
        # A map of its own for each reader: its pages leave the process with the reader's array, so a model
        # read weight by weight holds one weight's pages at a time (a map kept open would keep every page read).
        if not all(self.shape):
            return np.empty(self.shape, self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


class TensorStore:
    """Values of initializers held beside their graph, each named in the graph by a marker.

    A value is never changed once stored: a new value is a new marker, so
    a copy of the graph made earlier keeps the value it was made with. The
    store lives as long as something holds it (a model's markers do not):
    keep it beside the graphs that name it.

    Values of :data:`SPILLED_BYTES` or more that the store is given as
    arrays (a rewritten weight, a weight's codes) are written to a file of
    the store's own and read back like the model's external data, so a
    large model's changed weights take the disk, not the memory. The file
    goes with the store.
    """

    def __init__(self) -> None:
        self.key = secrets.token_hex(8)
        self._values: dict[str, np.ndarray | _FileSlice] = {}
        self._numbers = itertools.count()
        self._spill: Any = None  # the spill file, opened at the first value spilled
        _STORES[self.key] = self

    def marker(self, name: str, value: np.ndarray) -> TensorProto:
        """A marker for initializer ``name`` whose value is ``value``: kept as given (do not change it), or, from
        :data:`SPILLED_BYTES`, copied to the store's file."""
        number = str(next(self._numbers))
        self._values[number] = self._spilled(value) if value.nbytes >= SPILLED_BYTES else value
        return self._marker(name, number, value.dtype, value.shape)

    def mapped_marker(self, name: str, path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> TensorProto:
        """A marker for initializer ``name`` whose value is the bytes of file ``path`` from ``offset`` (read at each use)."""
        number = str(next(self._numbers))
        self._values[number] = _FileSlice(path, offset, np.dtype(dtype), tuple(shape))
        return self._marker(name, number, np.dtype(dtype), shape)

    def _marker(self, name: str, number: str, dtype: np.dtype, shape: tuple[int, ...]) -> TensorProto:
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(dtype), dims=shape)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=f"{_STORE_SCHEME}{self.key}/{number}")
        return t

    def _spilled(self, value: np.ndarray) -> np.ndarray | _FileSlice:
        """``value`` written to the spill file, as a slice of it (an ml_dtypes value, stored as an array, stays one)."""
        if value.dtype.isbuiltin == 2 or not all(value.shape):
            return value
        if self._spill is None:
            self._spill = tempfile.NamedTemporaryFile(prefix="qlinear-weights-", suffix=".bin")
        f = self._spill
        offset = f.seek(0, os.SEEK_END)
        np.ascontiguousarray(value).tofile(f)
        f.flush()
        return _FileSlice(f.name, offset, value.dtype, tuple(value.shape))

    def __len__(self) -> int:
        return len(self._values)


def is_marker(t: TensorProto) -> bool:
    """Whether ``t`` is a marker of a :class:`TensorStore`."""
    return (
        t.data_location == TensorProto.EXTERNAL
        and len(t.external_data) == 1
        and t.external_data[0].value.startswith(_STORE_SCHEME)
    )


def has_markers(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s graph names values of a :class:`TensorStore`."""
    return any(is_marker(t) for t in model.graph.initializer)


def value_of(t: TensorProto) -> np.ndarray:
    """The value of ``t``: a marker's from its store, any other tensor's through ``numpy_helper``.

    Raises:
        QuantizationError: ``t`` is a marker whose store no longer exists.
    """
    if not is_marker(t):
        return numpy_helper.to_array(t)
    key, _, number = t.external_data[0].value[len(_STORE_SCHEME) :].partition("/")
    store = _STORES.get(key)
    if store is None or number not in store._values:
        raise QuantizationError(f"tensor {t.name!r} names values of a model that no longer exists: keep the model alive")
    value = store._values[number]
    return value.read() if isinstance(value, _FileSlice) else value


def inline(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its markers replaced by their values (itself, when it has none)."""
    if not has_markers(model):
        return model
    out = onnx.ModelProto()
    copy_fields(model, out, skip="graph")
    copy_fields(model.graph, out.graph, skip="initializer")
    for t in model.graph.initializer:
        out.graph.initializer.append(numpy_helper.from_array(value_of(t), t.name) if is_marker(t) else t)
    return out


def byte_size(model: onnx.ModelProto) -> int:
    """``model``'s serialized size in bytes, of any size (protobuf's ``ByteSize`` refuses 2 GiB or more)."""
    try:
        size = model.ByteSize()
    except EncodeError:
        light, moved = graph_only(model)
        size = light.ByteSize() + sum(t.ByteSize() for t in moved)
    return size + sum(_inline_bytes(t) - t.ByteSize() for t in model.graph.initializer if is_marker(t))


def _inline_bytes(marker: TensorProto) -> int:
    """The serialized size of the tensor ``marker`` names, its value in ``raw_data``."""
    nbytes = tensor_bytes(marker)
    header = TensorProto(name=marker.name, data_type=marker.data_type, dims=marker.dims).ByteSize()
    return header + 1 + len(_varint(nbytes)) + nbytes  # raw_data's tag, its length, its bytes


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def tensor_bytes(t: TensorProto) -> int:
    """The bytes ``t`` holds: a marker's value's (from its type and shape: nothing is mapped), any other tensor's
    serialized size."""
    if not is_marker(t):
        return t.ByteSize()
    return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def is_large(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is too large to serialize."""
    return byte_size(model) >= PROTOBUF_LIMIT


def graph_only(model: onnx.ModelProto, threshold: int | None = None) -> tuple[onnx.ModelProto, list[TensorProto]]:
    """A copy of ``model`` whose initializers of ``threshold`` bytes (default 1 MiB) or more are markers, and those initializers.

    The initializers returned are ``model``'s own (not copies): the copy
    costs the graph, not the weights. Only the main graph's initializers
    move; subgraphs and Constant nodes stay as they are.
    """
    threshold = MOVED_THRESHOLD if threshold is None else threshold
    light = onnx.ModelProto()
    copy_fields(model, light, skip="graph")
    copy_fields(model.graph, light.graph, skip="initializer")
    moved = []
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and t.ByteSize() >= threshold:  # markers stay as they are
            marker = light.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
            marker.data_location = TensorProto.EXTERNAL
            marker.external_data.add(key="location", value=_MARKER_LOCATION)
            moved.append(t)
        else:
            light.graph.initializer.append(t)
    return light, moved


def into_store(model: onnx.ModelProto, store: TensorStore, threshold: int | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers of ``threshold`` bytes or more (default: 1 MiB) are markers of ``store``."""
    light, moved = graph_only(model, threshold)
    by_name = {t.name: t for t in moved}
    for t in light.graph.initializer:
        if t.name in by_name and not is_marker(t):
            t.CopyFrom(store.marker(t.name, numpy_helper.to_array(by_name[t.name])))
    return light


def copy_fields(source: Any, target: Any, *, skip: str) -> None:
    """Every field ``source`` (a protobuf message) sets, but ``skip``, set on ``target`` alike (a copy of the rest)."""
    for fd, value in source.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(target, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(target, fd.name).CopyFrom(value)
        else:
            setattr(target, fd.name, value)


def infer_shapes(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` of ``model``'s graph-only copy (:func:`graph_only`), of any size.

    The result holds markers in place of the big initializers: read shapes
    and types from it, not values. Inference reads their types and shapes
    only (a shape a node computes comes from small tensors), and the copy
    spares serializing the weights for it (twice the model's bytes at the
    peak).
    """
    return onnx.shape_inference.infer_shapes(graph_only(model)[0], **kwargs)


def check_model(model: onnx.ModelProto, *, full_check: bool = True) -> None:
    """``onnx.checker.check_model``; a large model is checked with its big initializers as graph inputs.

    Their contents are not checked then (only their types and shapes): check
    the model by path after writing it for that.
    """
    if not is_large(model) and not has_markers(model):
        onnx.checker.check_model(model, full_check=full_check)
        return
    light, _ = graph_only(model)
    inits = light.graph.initializer
    for k in reversed(range(len(inits))):  # markers, old and new, become inputs of their type and shape
        if inits[k].data_location == TensorProto.EXTERNAL:
            light.graph.input.append(helper.make_tensor_value_info(inits[k].name, inits[k].data_type, list(inits[k].dims)))
            del inits[k]
    onnx.checker.check_model(light, full_check=full_check)


def digest(model: onnx.ModelProto) -> str:
    """A short hex digest of ``model``'s content, of any size (each part hashed on its own)."""
    markers = [t for t in model.graph.initializer if is_marker(t)]
    if not markers and not is_large(model):
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]
    light, moved = graph_only(model)
    for t in light.graph.initializer:  # a marker's location names this process's store: not the content
        if is_marker(t):
            del t.external_data[:]
    h = hashlib.sha256(light.SerializeToString(deterministic=True))
    for t in (*markers, *moved):
        h.update(t.name.encode())
        h.update(t.raw_data if t.HasField("raw_data") else np.ascontiguousarray(value_of(t)).reshape(-1).view(np.uint8))
    return h.hexdigest()[:16]
