"""What a GGUF file is, read from its header without loading weights.

`gguf.GGUFReader` parses every metadata value into NumPy objects, which takes seconds for a
152k-token vocabulary; this reader walks the same format (the gguf package's value and tensor
types) with `struct`, keeps scalars and strings, and reads long arrays only where needed (the
token list, for the tokenizer fingerprint).
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType

from ..backend import check_gguf_file
from ..errors import ModelFileError

_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class Field:
    """One metadata value exactly as stored: its GGUF type, its value (strings as raw bytes,
    arrays as lists) and, for arrays, the type of their items."""

    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None


@dataclass
class GGUFInfo:
    """A GGUF file's metadata (long arrays as lengths) and its tensors' shapes and types;
    `fields` holds the values of the keys asked for exactly as stored (see `read_info`)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tokens: list[bytes]
    tensor_types: Counter = field(default_factory=Counter)
    n_params: int = 0
    size_bytes: int = 0
    fields: dict[str, Field] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def context_length(self) -> int | None:
        return self.metadata.get(f"{self.architecture}.context_length")

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    @property
    def quantization(self) -> str:
        ft = self.metadata.get("general.file_type")
        try:
            name = LlamaFileType(ft).name.replace("MOSTLY_", "") if ft is not None else None
        except ValueError:
            name = None
        if name is None and self.tensor_types:
            name = self.tensor_types.most_common(1)[0][0]
        return name or "?"

    @property
    def tokenizer_fingerprint(self) -> str:
        """SHA-256 over the token texts (as the backend's `vocab_fingerprint`), shortened."""
        h = hashlib.sha256()
        for t in self.tokens:
            h.update(t)
            h.update(b"\0")
        return h.hexdigest()[:16]


def read_info(path: str | Path, keep: Callable[[str], bool] | None = None) -> GGUFInfo:
    """Read the header of a GGUF file (`ModelFileError` if it is not one or is cut short).

    The values of the keys `keep` selects are kept exactly as stored in `GGUFInfo.fields` (long
    arrays included), e.g. to copy a tokenizer into another file.
    """
    p = check_gguf_file(path)
    try:
        with open(p, "rb") as f:
            return _read(f, p, keep or (lambda key: False))
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(f"{p}: cannot read the GGUF header ({e}); the file may be truncated or corrupt") from None


def _read(f: BinaryIO, path: Path, keep: Callable[[str], bool]) -> GGUFInfo:
    def unpack(fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = f.read(size)
        if len(data) != size:
            raise ValueError("unexpected end of file")
        return struct.unpack(fmt, data)[0]

    def string() -> bytes:
        n = unpack("<Q")
        data = f.read(n)
        if len(data) != n:
            raise ValueError("unexpected end of file")
        return data

    f.read(4)  # magic
    version = unpack("<I")
    n_tensors = unpack("<Q")
    n_kv = unpack("<Q")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    tokens: list[bytes] = []
    fields: dict[str, Field] = {}
    for _ in range(n_kv):
        key = string().decode("utf-8")
        vtype = GGUFValueType(unpack("<I"))
        if vtype == GGUFValueType.STRING:
            raw = string()
            metadata[key] = raw.decode("utf-8", errors="replace")
            value: Any = raw
        elif vtype == GGUFValueType.ARRAY:
            etype = GGUFValueType(unpack("<I"))
            n = unpack("<Q")
            lengths[key] = n
            value = None
            if etype == GGUFValueType.STRING:
                items = [string() for _ in range(n)]
                if key == _TOKENS:
                    tokens = items
                value = items
            elif etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype]) * n
                if keep(key):
                    data = f.read(size)
                    if len(data) != size:
                        raise ValueError("unexpected end of file")
                    value = np.frombuffer(data, dtype=np.dtype(_SCALARS[etype])).tolist()
                else:
                    f.seek(size, 1)
            else:
                raise ValueError(f"nested array in {key}")
            if keep(key):
                fields[key] = Field(vtype, value, etype)
            continue
        else:
            value = metadata[key] = unpack(_SCALARS[vtype])
        if keep(key):
            fields[key] = Field(vtype, value)
    types: Counter = Counter()
    n_params = 0
    for _ in range(n_tensors):
        string()  # name
        n_dims = unpack("<I")
        count = 1
        for _ in range(n_dims):
            count *= unpack("<Q")
        ttype = GGMLQuantizationType(unpack("<I"))
        unpack("<Q")  # offset
        types[ttype.name] += count
        n_params += count
    return GGUFInfo(path, version, metadata, lengths, tokens, types, n_params, path.stat().st_size, fields)
