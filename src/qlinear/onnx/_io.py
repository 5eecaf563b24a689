"""Read and write ONNX models, large tensors in an external data file.

Tensors of at least a threshold of bytes go to one file beside the model,
each at an offset aligned for memory mapping. Loading reads each external
tensor with one read into the model, one tensor at a time, so memory peaks
at the model plus its largest tensor (protobuf copies the bytes it is given);
before reading, it checks that the file really holds the bytes the model says.
"""

from __future__ import annotations

from collections.abc import Iterator
from os import PathLike
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from qlinear._errors import QuantizationError
from qlinear.onnx._large import TensorStore, is_marker, value_of

__all__ = ["DEFAULT_EXTERNAL_THRESHOLD", "load", "load_mapped", "save"]

DEFAULT_EXTERNAL_THRESHOLD = 1 << 20  # 1 MiB
_ALIGN = 4096  # page size, so a reader can mmap each tensor


def save(model: onnx.ModelProto, path: str | PathLike[str], *, external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD) -> None:
    """Write ``model`` to ``path``; initializers of ``external_threshold`` bytes or more go to ``path + ".data"``.

    ``model`` is left as it was.

    Raises:
        QuantizationError: ``model`` holds tensors whose external data was
            never loaded, or ``path`` cannot be written.
    """
    path = Path(path)
    if not isinstance(model, onnx.ModelProto):
        raise QuantizationError(f"save: model must be an onnx.ModelProto, got {type(model).__name__}")
    unloaded = [t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL and not is_marker(t)]
    if unloaded:
        raise QuantizationError(
            f"save: tensors {unloaded[:3]} have external data that is not loaded; load the model with qlinear.onnx.load"
        )
    # ByteSize avoids copying raw_data just to measure it. A marker's value is always written beside the model.
    big = [t for t in model.graph.initializer if is_marker(t) or (t.HasField("raw_data") and t.ByteSize() >= external_threshold)]
    data_name = path.name + ".data"
    moved: list[tuple[TensorProto, TensorProto | bytes]] = []
    try:
        if big:
            with open(path.parent / data_name, "wb") as f:
                for t in big:
                    if is_marker(t):
                        raw: Any = np.ascontiguousarray(value_of(t)).reshape(-1).view(np.uint8)
                        kept: TensorProto | bytes = TensorProto()
                        kept.CopyFrom(t)
                    else:
                        raw = kept = t.raw_data
                    f.write(b"\0" * (-f.tell() % _ALIGN))
                    _point_to(t, data_name, f.tell(), len(raw))
                    moved.append((t, kept))
                    f.write(raw)
        path.write_bytes(model.SerializeToString())
    except OSError as e:
        raise QuantizationError(f"save: cannot write {path}: {e.strerror}") from None
    finally:
        for t, kept in moved:
            if isinstance(kept, TensorProto):
                t.CopyFrom(kept)
                continue
            del t.external_data[:]
            t.ClearField("data_location")
            t.raw_data = kept


def _point_to(t: TensorProto, location: str, offset: int, length: int) -> None:
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def load(path: str | PathLike[str]) -> onnx.ModelProto:
    """Read the model at ``path`` and the external data its initializers name.

    >>> import tempfile, os, numpy as np
    >>> from qlinear.onnx import Graph
    >>> g = Graph(opset=21); g.output(g.dequantize_linear(np.arange(4, dtype=np.int8), np.float32(2)))
    >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx"); g.save(path)
    >>> [n.op_type for n in load(path).graph.node]
    ['DequantizeLinear']

    Raises:
        QuantizationError: one line saying the file is missing, truncated
            or corrupt, or which external data file is short or missing.
    """
    path = Path(path)
    model = _parse(path)
    for t, f, offset, length in _external(model, path):
        f.seek(offset)
        t.raw_data = f.read(length)
        del t.external_data[:]
        t.ClearField("data_location")
    return model


def load_mapped(path: str | PathLike[str], store: TensorStore) -> onnx.ModelProto:
    """Read the model at ``path``; its external tensors become markers of ``store`` over read-only memory maps.

    Nothing of the external data is read until a value is used; each use
    maps the value afresh, a read-only view of the file (copy it to change
    it) whose pages leave the process with the array. Tensors whose stored
    bytes are not one array element each (4-bit and 2-bit types) are read.

    Raises:
        QuantizationError: as :func:`load`.
    """
    path = Path(path)
    model = _parse(path)
    for t, f, offset, length in _external(model, path):
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        count = int(np.prod(t.dims, dtype=np.int64))
        if count * dtype.itemsize != length or t.data_type in _PACKED:
            f.seek(offset)
            t.raw_data = f.read(length)
            del t.external_data[:]
            t.ClearField("data_location")
            continue
        t.CopyFrom(store.mapped_marker(t.name, f.name, offset, dtype, tuple(t.dims)))
    return model


_PACKED = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}


def _parse(path: Path) -> onnx.ModelProto:
    """The model at ``path``, its external data not read."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise QuantizationError(f"load: cannot read {path}: {e.strerror}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        raise QuantizationError(f"load: {path} is truncated or corrupt: its {len(data)} bytes are no ONNX model") from None
    del data
    # Protobuf parses a prefix cut at a field boundary; the fields written
    # last (opset imports) are then missing.
    if not model.HasField("graph") or not model.opset_import or not model.ir_version:
        raise QuantizationError(f"load: {path} is truncated or corrupt: it has no graph, opset imports or IR version")
    return model


def _external(model: onnx.ModelProto, path: Path) -> Iterator[tuple[TensorProto, BinaryIO, int, int]]:
    """Each initializer with external data, its file open, and its bytes' offset and length, checked.

    Refused: a location outside the model's folder (a crafted model must
    not read arbitrary files), a missing file, a file shorter than the
    tensor's bytes.
    """
    base = path.parent
    files: dict[str, BinaryIO] = {}
    try:
        for t in model.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in t.external_data}
            location = info.get("location", "")
            target = (base / location).resolve()
            if not location or Path(location).is_absolute() or base.resolve() not in target.parents:
                raise QuantizationError(
                    f"load: {path}: tensor {t.name!r} names external data {location!r} outside the model's folder"
                )
            if location not in files:
                try:
                    files[location] = open(target, "rb")  # closed in the finally below
                except OSError as e:
                    raise QuantizationError(
                        f"load: {path}: external data file {location!r} of tensor {t.name!r}: {e.strerror}"
                    ) from None
            f = files[location]
            size = f.seek(0, 2)
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else size - offset
            if offset + length > size:
                raise QuantizationError(
                    f"load: {path}: external data file {location!r} is truncated: tensor {t.name!r} needs bytes "
                    f"[{offset}, {offset + length}), the file has {size}"
                )
            yield t, f, offset, length
    finally:
        for f in files.values():
            f.close()
