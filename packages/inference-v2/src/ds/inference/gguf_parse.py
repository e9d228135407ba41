"""A fast reader of the GGUF container: header, metadata and tensor table parsed with ``struct``
over a memory map, tensor data as ``numpy`` views ready for ``gguf.quants.dequantize``.

``gguf.GGUFReader`` builds numpy views for every string of the metadata: a 49k-token vocabulary
with its merges takes it seconds. This reader takes the type codes and block sizes from the
``gguf`` package and parses the container (little-endian GGUF v2/v3) itself.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_NUMPY = {code: np.dtype(fmt) for code, fmt in _SCALARS.items()}


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]  # ggml order: the row length first
    offset: int  # from the start of the file


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFFormatError(f"the file ends inside its header (at byte {self.pos})")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError(f"the file ends inside a string (at byte {self.pos})")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, type_id: int) -> Any:
        if type_id in _SCALARS:
            return self.take(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            elem, count = self.take("<I"), self.take("<Q")
            if elem in _NUMPY:  # numbers in one read
                size = _NUMPY[elem].itemsize * count
                if self.pos + size > len(self.buf):
                    raise GGUFFormatError(f"the file ends inside an array (at byte {self.pos})")
                arr = np.frombuffer(self.buf, _NUMPY[elem], count, self.pos)
                self.pos += size
                return arr.tolist()
            return [self.value(elem) for _ in range(count)]
        raise GGUFFormatError(f"unknown metadata value type {type_id} at byte {self.pos}")


class GGUFContainer:
    """``metadata`` (key -> value) and ``tensors`` (TensorInfo) of a GGUF file; ``data(info)``
    maps one tensor's bytes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._map)
        if len(self._map) < 4 or self._map[:4] != b"GGUF":
            raise GGUFFormatError("it does not start with the GGUF magic bytes")
        cur.pos = 4
        version = cur.take("<I")
        if version not in (2, 3):
            raise GGUFFormatError(
                f"GGUF version {version} (big-endian or unknown); ds reads v2, v3"
            )
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
            infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        self.tensors = [TensorInfo(n, t, d, start + o) for n, d, t, o in infos]

    def data(self, info: TensorInfo, qtype: Any) -> np.ndarray:
        """The tensor's bytes as ``gguf.quants.dequantize`` takes them: F32/F16 as typed arrays
        in numpy order, every other type as uint8 rows of blocks."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[qtype]
        shape = tuple(reversed(info.shape))
        n_bytes = int(np.prod(info.shape)) * size // block
        if info.offset + n_bytes > len(self._map):
            raise GGUFFormatError(
                f"tensor {info.name} ends at byte {info.offset + n_bytes} but the file has "
                f"{len(self._map)} bytes (truncated)"
            )
        raw = np.frombuffer(self._map, np.uint8, n_bytes, info.offset)
        if qtype == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(shape)
        if qtype == GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(shape)
        return raw.reshape(*shape[:-1], shape[-1] // block * size)
