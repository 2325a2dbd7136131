"""Damaged copies of a GGUF file, seeded, for the bad-file tests: byte flips in the header, lengths
and counts set to absurd values, truncations at every section boundary, a tensor too many or too
few. A mutant is a list of (offset, bytes) patches and an optional length to cut the file to, so
one copy of a large file serves them all (patch, test, restore)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path

from localcos.backend import read_info


@dataclass(frozen=True)
class Mutant:
    kind: str
    patches: tuple[tuple[int, bytes], ...] = ()
    cut: int | None = None


def _field_offsets(data: bytes) -> dict[str, int]:
    """Offsets of u64 fields worth setting to absurd values, found by their keys' bytes."""
    out = {"tensor count": 8, "metadata count": 16, "first key length": 24}
    for key in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.merges", b"tokenizer.ggml.token_type"):
        at = data.find(key)
        if at > 0:  # key, then value type u32, item type u32, count u64
            out[f"length of {key.decode()}"] = at + len(key) + 8
            out[f"first item of {key.decode()}"] = at + len(key) + 16
    at = data.find(b"token_embd.weight")
    if at > 0:  # name, then n_dims u32, dims u64..., type u32, offset u64
        out["token_embd dim 0"] = at + len(b"token_embd.weight") + 4
    return out


def mutants(path: Path, n_flips: int, seed: int) -> list[Mutant]:
    info = read_info(path, tokens=False)
    header_end = info.data_offset
    with open(path, "rb") as f:
        data = f.read(header_end)
    rng = random.Random(seed)
    out = []
    for _ in range(n_flips):
        spots = sorted(rng.sample(range(4, header_end), rng.randint(1, 8)))
        out.append(Mutant("flip", tuple((i, bytes([rng.randrange(256)])) for i in spots)))
    for name, at in _field_offsets(data).items():
        for value in (1 << 32, 1 << 63, (1 << 64) - 1):
            out.append(Mutant(f"{name} = {value}", ((at, struct.pack("<Q", value)),)))
    n_tensors = struct.unpack_from("<Q", data, 8)[0]
    out.append(Mutant("a tensor too many", ((8, struct.pack("<Q", n_tensors + 1)),)))
    out.append(Mutant("a tensor too few", ((8, struct.pack("<Q", n_tensors - 1)),)))
    tokens = data.find(b"tokenizer.ggml.tokens")
    cuts = {
        "after the magic": 4, "after the version": 8, "after the tensor count": 16, "after the metadata count": 24,
        "at the vocabulary": tokens, "inside the vocabulary": tokens + 40, "inside the tensor infos": header_end - 8,
        "where the tensor data begins": header_end, "halfway through the tensor data": (header_end + info.data_end) // 2,
        "a byte short": info.data_end - 1,
    }  # fmt: skip
    for where, cut in cuts.items():
        out.append(Mutant(f"cut {where} (byte {cut})", cut=cut))
    return out


def magic_and_noise(seed: int) -> bytes:
    """The GGUF magic followed by 4 KB of random bytes."""
    return b"GGUF" + random.Random(seed).randbytes(4096)


class Patched:
    """One writable copy of a file that takes each mutant in turn and is restored after it."""

    def __init__(self, original: Path, copy: Path) -> None:
        self.original, self.path = original, copy
        copy.write_bytes(original.read_bytes())

    def apply(self, mutant: Mutant) -> list[tuple[int, bytes]]:
        saved = []
        with open(self.path, "r+b") as f:
            for at, value in mutant.patches:
                f.seek(at)
                saved.append((at, f.read(len(value))))
                f.seek(at)
                f.write(value)
            if mutant.cut is not None:
                f.truncate(mutant.cut)
        return saved

    def restore(self, mutant: Mutant, saved: list[tuple[int, bytes]]) -> None:
        if mutant.cut is not None:
            self.path.write_bytes(self.original.read_bytes())
            return
        with open(self.path, "r+b") as f:
            for at, value in saved:
                f.seek(at)
                f.write(value)
