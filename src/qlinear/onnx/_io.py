"""Read and write ONNX models, large tensors in an external data file.

Tensors of at least a threshold of bytes go to one file beside the model,
each at an offset aligned for memory mapping. Loading reads each external
tensor with one read into the model, one tensor at a time, so memory peaks
at the model plus its largest tensor (protobuf copies the bytes it is given);
before reading, it checks that the file really holds the bytes the model says.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from qlinear._errors import QuantizationError

__all__ = ["DEFAULT_EXTERNAL_THRESHOLD", "load", "save"]

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
    unloaded = [t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    if unloaded:
        raise QuantizationError(
            f"save: tensors {unloaded[:3]} have external data that is not loaded; load the model with qlinear.onnx.load"
        )
    # ByteSize avoids copying raw_data just to measure it.
    big = [t for t in model.graph.initializer if t.HasField("raw_data") and t.ByteSize() >= external_threshold]
    data_name = path.name + ".data"
    moved: list[tuple[TensorProto, bytes]] = []
    try:
        if big:
            with open(path.parent / data_name, "wb") as f:
                for t in big:
                    raw = t.raw_data
                    f.write(b"\0" * (-f.tell() % _ALIGN))
                    _point_to(t, data_name, f.tell(), len(raw))
                    moved.append((t, raw))
                    f.write(raw)
        path.write_bytes(model.SerializeToString())
    except OSError as e:
        raise QuantizationError(f"save: cannot write {path}: {e.strerror}") from None
    finally:
        for t, raw in moved:
            del t.external_data[:]
            t.ClearField("data_location")
            t.raw_data = raw


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
    _load_external(model, path.parent, path)
    return model


def _load_external(model: onnx.ModelProto, base: Path, path: Path) -> None:
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
            f.seek(offset)
            t.raw_data = f.read(length)
            del t.external_data[:]
            t.ClearField("data_location")
    finally:
        for f in files.values():
            f.close()
