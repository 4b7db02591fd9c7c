"""A GGUF file read the fast way: its key-value metadata and its tensors' places in the file.

``gguf.GGUFReader`` builds numpy views for every part of every value, ~0.5 million of them for
SmolLM2's 49k-token vocabulary and 49k merges: seconds of CPU per parse, and `radixray serve`
parses the file three times at start-up (the router's metadata, each worker's model). This
reader walks the same layout with ``struct`` over one read-only memory map and answers what
radixray asks of a reader, the same values as ``gguf.GGUFReader`` (tests compare the two):

- ``fields[key].contents()``: a value as Python data (str, int, float, bool or a list);
- ``tensors``: name, ``shape`` (ggml order: fastest dimension first), ``tensor_type`` and
  ``data``, a read-only numpy view of the file (bytes per row for quantised types).

Layout (little-endian)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv x     string key, u32 value_type, value   (array: u32 item_type, u64 count, items)
    n_tensors x string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset
    padding to general.alignment (32), then the tensor data, each at its offset

A string is a u64 length and that many UTF-8 bytes.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = ["GGUFFile", "GGUFField", "GGUFTensor"]

_STRING, _ARRAY = 8, 9
# GGUF value types -> struct format (and numpy dtype, for arrays).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {k: np.dtype(v) for k, v in _SCALARS.items()}
# ggml types stored as plain numbers (the rest are quantised blocks, exposed as bytes).
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64}
_PLAIN[28] = np.float64


class GGUFField:
    """One metadata value; ``contents()`` as ``gguf.ReaderField.contents()`` returns it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def contents(self) -> Any:
        return list(self.value) if isinstance(self.value, list) else self.value


class GGUFTensor(NamedTuple):
    name: str
    shape: tuple[int, ...]  # ggml order: the fastest-varying dimension first
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # read-only view of the file


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._map
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{self.path}: not a little-endian GGUF v2/v3 file")
        self._offs = 24
        # The header as gguf.GGUFReader lists it, then the file's own keys.
        self.fields: dict[str, GGUFField] = {
            "GGUF.version": GGUFField(version),
            "GGUF.tensor_count": GGUFField(n_tensors),
            "GGUF.kv_count": GGUFField(n_kv),
        }
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = GGUFField(self._value(self._u32()))
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = self.fields["general.alignment"].value if "general.alignment" in self.fields else 32
        start = self._offs + (-self._offs) % align
        self.tensors = [self._tensor(start, *info) for info in infos]

    # --- the walk -------------------------------------------------------------------------------

    def _unpack(self, fmt: str):
        out = struct.unpack_from(fmt, self._map, self._offs)
        self._offs += struct.calcsize(fmt)
        return out

    def _u32(self) -> int:
        return self._unpack("<I")[0]

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        start = self._offs
        self._offs += n
        return str(self._map[start : self._offs], encoding="utf-8")

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype])[0]
        if vtype != _ARRAY:
            raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")
        item, count = self._unpack("<IQ")
        if item in _NUMPY:  # one numpy read for a numeric array
            dtype = _NUMPY[item]
            values = np.frombuffer(self._map, dtype, count, self._offs).tolist()
            self._offs += dtype.itemsize * count
            return values
        return [self._value(item) for _ in range(count)]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        n_dims = self._u32()
        dims = self._unpack(f"<{n_dims}Q")
        ggml_type, offset = self._unpack("<IQ")
        return name, dims, ggml_type, offset

    def _tensor(self, start: int, name: str, dims, ggml_type: int, offset: int) -> GGUFTensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        qtype = GGMLQuantizationType(ggml_type)
        n_elems = int(np.prod(dims))
        np_dims = tuple(reversed(dims))
        if ggml_type in _PLAIN:
            dtype, count = np.dtype(_PLAIN[ggml_type]), n_elems
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            dtype, count = np.dtype(np.uint8), n_elems * size // block
            np_dims = quant_shape_to_byte_shape(np_dims, qtype)
        data = np.frombuffer(self._map, dtype, count, start + offset).reshape(np_dims)
        return GGUFTensor(name, tuple(int(d) for d in dims), qtype, data)
