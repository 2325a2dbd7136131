"""GGUF files as localcos reads them: the one header reader, bounded.

People point localcos at files they downloaded (sometimes partly), copied or made, so nothing in
a header is trusted: every string length, array count and tensor field is checked against the
bytes the file has left before anything is read or allocated, unknown value types and absurd
counts are refused, and each tensor's place in the data section is checked as llama.cpp's own
loader checks it (aligned, in order, inside the file). A damaged header raises
`ModelHeaderError` naming the field and its byte offset; tensor data that runs past the end of
the file is reported as incomplete (`GGUFInfo.incomplete`, `check_model_file`).

The file is memory-mapped and walked with `struct` (`gguf.GGUFReader` parses every value into
NumPy objects, which takes seconds for a 152k-token vocabulary and trusts the lengths it reads).
Scalars and strings are kept; long arrays are kept only where asked (the token list for the
tokenizer fingerprint, `keep` for copying a tokenizer).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from collections.abc import Callable

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from ..errors import IncompleteModelError, ModelFileError, ModelHeaderError
from .tokenizers import TokenTable

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what llama.cpp reads
MAX_DIMS = 4  # GGML_MAX_DIMS
# Beyond these a count is damage, not a model: the largest vocabularies have ~10^6 tokens, the
# largest models ~10^5 tensors, and no metadata string (chat templates included) nears 64 MiB.
MAX_COUNT = 1 << 24
MAX_STRING = 1 << 26
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20

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
_U64 = struct.Struct("<Q")


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Raise `ModelFileError` unless `path` is a readable file that starts with the GGUF magic."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelFileError(f"not a file: {p}")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot read {p}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{p} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return p


@dataclass(frozen=True)
class Field:
    """One metadata value exactly as stored: its GGUF type, its value (strings as raw bytes,
    arrays as lists) and, for arrays, the type of their items."""

    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def model_label(general_name: object, path: Path) -> str:
    """A model's short name for people, the one rule: its GGUF's general.name, else its file's
    name (`Model.label`, `GGUFInfo.label`)."""
    return str(general_name) if general_name else path.name


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
    n_tensors: int = 0
    data_offset: int = 0  # where the tensor data starts (the header's end, aligned)
    data_end: int = 0  # where the last tensor's data ends (bytes from the start of the file)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def label(self) -> str:
        """The name the loaded model goes by (`Model.label`), read before it loads."""
        return model_label(self.metadata.get("general.name"), self.path)

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

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        """SHA-256 over the token texts (as the backend's `vocab_fingerprint`), shortened
        (computed once: a pass over every token)."""
        return self.vocab_fingerprint(len(self.tokens))[:16]

    def vocab_fingerprint(self, n: int) -> str:
        """SHA-256 over the texts of token ids [0, n), as `Model.vocab_fingerprint` (each
        length computed once)."""
        cache = self.__dict__.setdefault("_fingerprints", {})
        if n not in cache:
            h = hashlib.sha256()
            for t in self.tokens[:n]:
                h.update(t)
                h.update(b"\0")
            cache[n] = h.hexdigest()
        return cache[n]

    def token_table(self) -> TokenTable:
        """Its tokenizer as the rule that joins models at the token level reads it
        (`tokenizers.tokenizer_mismatch`), before anything loads."""
        m = self.metadata
        return TokenTable(str(self.path), len(self.tokens), m.get("tokenizer.ggml.bos_token_id"), m.get("tokenizer.ggml.eos_token_id"),
                          self.tokens.__getitem__, self.vocab_fingerprint)  # fmt: skip

    @property
    def incomplete(self) -> str | None:
        """What is missing when the tensor data runs past the end of the file (None: complete)."""
        if self.data_end <= self.size_bytes:
            return None
        return (
            f"incomplete: tensor data ends at {_megabytes(self.data_end)}, the file has "
            f"{_megabytes(self.size_bytes)}; download or copy it again"
        )


class _Cursor:
    """Reads a header from a buffer, refusing every length that the bytes left cannot hold."""

    def __init__(self, data: Any, path: Path) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.path = path

    def fail(self, what: str, at: int, problem: str) -> ModelHeaderError:
        return ModelHeaderError(f"{self.path}: damaged GGUF header: {what} at byte {at} {problem}; the file is corrupt or cut short")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(what, self.pos, f"needs {n} bytes, the file has {self.size - self.pos} left")

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return value

    def count(self, what: str, limit: int, item_bytes: int) -> int:
        """A u64 count of items of at least `item_bytes` bytes each, checked before use."""
        at = self.pos
        n = self.scalar("<Q", what)
        if n > limit:
            raise self.fail(what, at, f"is {n}, more than any model has ({limit})")
        if n * item_bytes > self.size - self.pos:
            raise self.fail(what, at, f"is {n}, more than the {self.size - self.pos} bytes left can hold")
        return n

    def string(self, what: str) -> bytes:
        at = self.pos
        n = self.scalar("<Q", f"the length of {what}")
        if n > MAX_STRING or n > self.size - self.pos:
            raise self.fail(f"the length of {what}", at, f"is {n}, more than the {self.size - self.pos} bytes left")
        value = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return value

    def strings(self, n: int, what: str, keep: bool) -> list[bytes]:
        """n strings (an array's items), kept or only walked over; one tight loop, as the
        arrays are long (a vocabulary and its merges: 10^5 to 10^6 items)."""
        data, size, pos = self.data, self.size, self.pos
        length = _U64.unpack_from
        out: list[bytes] = []
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"the length of item {i} of {what}")
            (m,) = length(data, pos)
            if m > size - pos - 8 or m > MAX_STRING:
                raise self.fail(f"the length of item {i} of {what}", pos, f"is {m}, more than the {size - pos - 8} bytes left")
            pos += 8
            if keep:
                out.append(data[pos : pos + m])
            pos += m
        self.pos = pos
        return out

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        code = self.scalar("<I", what)
        try:
            return GGUFValueType(code)
        except ValueError:
            raise self.fail(what, at, f"is {code}, not a GGUF value type") from None


def read_info(path: str | os.PathLike[str], keep: Callable[[str], bool] | None = None, *, tokens: bool = True) -> GGUFInfo:
    """Read the header of a GGUF file: `ModelFileError` if it is not one, `ModelHeaderError`
    (naming the field and its byte offset) if the header is damaged. Tensor data missing at the
    end is not an error here: see `GGUFInfo.incomplete`.

    The values of the keys `keep` selects are kept exactly as stored in `GGUFInfo.fields` (long
    arrays included), e.g. to copy a tokenizer into another file; `tokens=False` skips keeping
    the token list. Without `keep`, a header already read while the file stays as it is (path,
    size, modification time) is given again, with its token list where it was read with one.
    """
    p = check_gguf_file(path)
    if keep is not None:
        return _read_file(p, keep, tokens)
    # one command reads a header several times (the level, the check, the lead): read once while
    # the file stays as it is; a few files' headers kept (a vocabulary's texts each)
    stat = p.stat()
    name, size, mtime = os.fspath(p.resolve()), stat.st_size, stat.st_mtime_ns
    with _headers_lock:
        info = _headers.get((name, size, mtime, True)) or _headers.get((name, size, mtime, tokens))
    if info is None:
        info = _read_file(p, lambda key: False, tokens)
        with _headers_lock:
            _headers[(name, size, mtime, tokens)] = info
            while len(_headers) > _HEADERS_KEPT:
                _headers.popitem(last=False)
    return info


_HEADERS_KEPT = 8
_headers: OrderedDict[tuple[str, int, int, bool], GGUFInfo] = OrderedDict()
_headers_lock = threading.Lock()


def _read_file(p: Path, keep: Callable[[str], bool], tokens: bool) -> GGUFInfo:
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read(_Cursor(data, p), keep, tokens)
    except OSError as e:
        raise ModelFileError(f"cannot read {p}: {e.strerror or e}") from None


def _read(c: _Cursor, keep: Callable[[str], bool], want_tokens: bool) -> GGUFInfo:
    c.pos = 4  # the magic, checked
    at = c.pos
    version = c.scalar("<I", "the version")
    if version not in VERSIONS:
        raise c.fail("the version", at, f"is {version}; llama.cpp reads GGUF versions {' and '.join(map(str, VERSIONS))}")
    n_tensors = c.count("the tensor count", MAX_TENSORS, 32)
    n_kv = c.count("the metadata count", MAX_KV, 13)
    metadata, lengths, tokens, fields = _read_metadata(c, n_kv, keep, want_tokens)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise c.fail("general.alignment", 0, f"is {alignment!r}, not a power of two")
    types, n_params, data_size = _read_tensors(c, n_tensors, alignment)
    data_offset = (c.pos + alignment - 1) // alignment * alignment
    data_end = data_offset + data_size if n_tensors else c.pos
    if c.size - data_end > alignment:  # writers pad to the alignment at most
        raise c.fail("the tensor count", 8, f"is {n_tensors}, but {c.size - data_end} bytes follow the last tensor's data (a tensor's info is missing?)")
    return GGUFInfo(c.path, version, metadata, lengths, tokens, types, n_params, c.size, fields, n_tensors, data_offset, data_end)


def _read_metadata(
    c: _Cursor, n_kv: int, keep: Callable[[str], bool], want_tokens: bool
) -> tuple[dict[str, Any], dict[str, int], list[bytes], dict[str, Field]]:
    """The metadata's `n_kv` keys: (scalar and string values, array lengths, the token texts where
    wanted, the fields `keep` asks for as stored)."""
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    tokens: list[bytes] = []
    fields: dict[str, Field] = {}
    for k in range(n_kv):
        at = c.pos
        raw_key = c.string(f"metadata key {k}")
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise c.fail(f"metadata key {k}", at, "is not UTF-8 text") from None
        if key in metadata or key in lengths:
            raise c.fail(f"metadata key {key!r}", at, "appears twice")
        vtype = c.value_type(f"the type of {key}")
        if vtype == GGUFValueType.STRING:
            value: Any = c.string(key)
            metadata[key] = value.decode("utf-8", errors="replace")
        elif vtype == GGUFValueType.ARRAY:
            etype = c.value_type(f"the item type of {key}")
            if etype == GGUFValueType.ARRAY:
                raise c.fail(f"the item type of {key}", c.pos - 4, "is array (nested arrays are not GGUF)")
            item_bytes = 8 if etype == GGUFValueType.STRING else struct.calcsize(_SCALARS[etype])
            n = lengths[key] = c.count(f"the length of {key}", MAX_COUNT, item_bytes)
            value = None
            if etype == GGUFValueType.STRING:
                value = c.strings(n, key, keep(key) or (want_tokens and key == _TOKENS))
                if key == _TOKENS:
                    tokens = value
            else:
                size = item_bytes * n
                if keep(key):
                    value = list(struct.unpack_from(f"<{n}{_SCALARS[etype][1]}", c.data, c.pos))
                c.pos += size
            if keep(key):
                fields[key] = Field(vtype, value, etype)
            continue
        else:
            value = metadata[key] = c.scalar(_SCALARS[vtype], key)
        if keep(key):
            fields[key] = Field(vtype, value)
    return metadata, lengths, tokens, fields


def _read_tensors(c: _Cursor, n_tensors: int, alignment: int) -> tuple[Counter, int, int]:
    """The tensors' infos, each checked (name, shape, type, where its data starts): (elements by
    type, parameters, the data section's size up to the last tensor's own bytes)."""
    types: Counter = Counter()
    n_params = 0
    names: set[bytes] = set()
    expected = 0  # where the next tensor's data must start, from the start of the data section
    end = 0
    for t in range(n_tensors):
        at = c.pos
        name = c.string(f"the name of tensor {t}")
        if name in names:
            raise c.fail(f"tensor {name.decode('utf-8', 'replace')!r}", at, "appears twice")
        names.add(name)
        label = f"tensor {name.decode('utf-8', 'replace')!r}"
        dims_at = c.pos
        n_dims = c.scalar("<I", f"the dimension count of {label}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"the dimension count of {label}", dims_at, f"is {n_dims}, not 1 to {MAX_DIMS}")
        shape = []
        count = 1
        for d in range(n_dims):
            dim_at = c.pos
            dim = c.scalar("<Q", f"dimension {d} of {label}")
            count *= dim
            if dim >= 1 << 63 or count >= 1 << 63:
                raise c.fail(f"dimension {d} of {label}", dim_at, f"makes {count} elements, more than llama.cpp can address")
            shape.append(dim)
        type_at = c.pos
        code = c.scalar("<I", f"the type of {label}")
        try:
            ttype = GGMLQuantizationType(code)
            block, block_bytes = GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise c.fail(f"the type of {label}", type_at, f"is {code}, not a tensor type this llama.cpp knows") from None
        if shape[0] % block:
            raise c.fail(f"dimension 0 of {label}", dims_at + 4, f"is {shape[0]}, not a multiple of the {ttype.name} block ({block})")
        offset_at = c.pos
        offset = c.scalar("<Q", f"the data offset of {label}")
        if offset != expected:
            raise c.fail(f"the data offset of {label}", offset_at, f"is {offset}, but its data must start at {expected}")
        nbytes = count // block * block_bytes
        expected = offset + (nbytes + alignment - 1) // alignment * alignment
        end = offset + nbytes  # the last tensor needs its own bytes, not the padding after them
        types[ttype.name] += count
        n_params += count
    return types, n_params, end


_checked: dict[tuple[str, int, int], None] = {}
_checked_lock = threading.Lock()


def check_model_file(path: str | os.PathLike[str]) -> Path:
    """`path` if it is a whole GGUF file: its header read in bounds (`ModelHeaderError` names
    what is damaged) and its tensor data all there (`IncompleteModelError` with both sizes).
    llama.cpp is never handed a file that fails here. A file checked once is not read again
    while its size and modification time stay."""
    p = check_gguf_file(path)
    stat = p.stat()
    key = (os.fspath(p.resolve()), stat.st_size, stat.st_mtime_ns)
    with _checked_lock:
        if key in _checked:
            return p
    info = read_info(p)  # with its tokens: the fingerprint and the level read the same header
    if info.incomplete:
        raise IncompleteModelError(f"{p}: {info.incomplete}")
    with _checked_lock:
        _checked[key] = None
    return p
