"""Measured call costs: what a llama_decode call of k rows costs each model, on this machine.

Speculation pays only where scoring k tokens in one call costs little more than scoring one, and
on a CPU that depends on the weight type, the instruction set and the threads far more than on
the model's size. So every model is timed when it is loaded: calls of `PROFILE_ROWS` rows on a
scratch sequence (slot 0, emptied after), a fraction of a second per model. The profile is
cached in the user cache directory under a key made of everything that changes it (the file's
size, modification time and the digest of its first MiB, the llama.cpp build and its CPU
features, threads, offload, flash attention, weight repacking, the machine), so later loads
cost nothing; `--calibrate` measures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from ..core.speedmodel import CallProfile
from ..files import CACHE_HINT, atomic_write
from ..paths import cache_dir

# rows per call timed: single-token steps, CoS drafts and verifications; other
# counts are interpolated, larger ones extrapolated along the slope of 4 -> 6 (compute-bound, and
# within the budget below for a 1.5B model on 2 cores)
PROFILE_ROWS = (1, 2, 3, 4, 6)
# each model's profiling stops after the round that crosses this many seconds (one round at
# least; small models get several, and keep each count's fastest call)
PROFILE_SECONDS = 0.5
PROFILE_ROUNDS = 5
PROFILE_VERSION = 3


def cpu_name() -> str:
    """The CPU as figures that hold only for it need it named: its model name (as lscpu says it),
    family and model, and the vector units llama.cpp's kernels use (AVX2, AVX-512, AMX)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model", "flags") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break  # the first processor says it all
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or "?"
    flags = set(fields.get("flags", "").split())
    units = "AVX-512" + "".join(f" {n}" for f, n in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if f in flags) if "avx512f" in flags else (
        "AVX2" if "avx2" in flags else "no AVX2")  # fmt: skip
    units += ", AMX" if "amx_tile" in flags else ", no AMX"
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}; {units})"


def profile_key(model: Any) -> str:
    """The cache key of a model's profile: a digest of everything that changes its call costs."""
    import llama_cpp

    path = Path(model.path)
    stat = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))  # the header's start: the model's metadata and tensor layout
    parts = {
        "version": PROFILE_VERSION,
        "file": [stat.st_size, stat.st_mtime_ns, h.hexdigest()],
        "llama.cpp": [llama_cpp.__version__, llama_cpp.llama_print_system_info().decode(errors="replace")],
        "threads": getattr(model, "n_threads", None),
        "offload": [getattr(model, "n_gpu_layers", 0), getattr(model, "offloaded", None), getattr(model, "main_gpu", 0),
                    getattr(model, "split_mode", None), [str(e) for e in getattr(model, "rpc", ())]],
        "flash_attn": getattr(model, "flash_attn", None),
        "extra_buffers": getattr(model, "extra_buffers", None),
        "machine": [platform.machine(), cpu_name(), os.cpu_count()],
    }  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def measure(model: Any, rows: tuple[int, ...] = PROFILE_ROWS, seconds: float = PROFILE_SECONDS) -> CallProfile:
    """Time calls of `rows` rows (all their logits asked, as a verification asks) on the model's
    slot 0, which must be empty, and empty it again. Rounds go over every count in turn until
    `seconds` have passed; each count keeps its fastest call (the least disturbed)."""
    token = model.bos if model.bos >= 0 else 0
    best: dict[int, float] = {}
    start = time.perf_counter()
    # the first call pays for paging the weights in, and the first of the most rows for growing
    # llama.cpp's buffers to them (a large share of that call): neither is a cost that decoding
    # pays again
    model.evaluate([token] * max(rows), max(rows))
    model.reset()
    # one row twice a round: every b(k) is relative to it, and it is the cheapest to repeat
    order = [rows[0], *rows[1 : len(rows) // 2 + 1], rows[0], *rows[len(rows) // 2 + 1 :]]
    for _ in range(PROFILE_ROUNDS):
        for k in order:
            t0 = time.perf_counter()
            model.evaluate([token] * k, k)
            elapsed = time.perf_counter() - t0
            model.reset()
            best[k] = min(best.get(k, elapsed), elapsed)
        if time.perf_counter() - start >= seconds:
            break
    model.stats.reset()
    model.slots[0].stats.reset()
    model.call_times.reset()
    return CallProfile(best)


def _cache_file(key: str) -> Path:
    return cache_dir() / "profiles" / f"{key}.json"


def cached(key: str) -> CallProfile | None:
    """The cached profile under `key` (`profile_key`), if this machine measured it before."""
    try:
        data = json.loads(_cache_file(key).read_text())
        return CallProfile.from_dict(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def profile(model: Any, calibrate: bool = False) -> CallProfile:
    """The model's call profile: cached, or measured now (always with `calibrate`) and cached.
    Models that carry their own (`call_profile`: fakes, tests) keep it."""
    own = getattr(model, "call_profile", None)
    if own is not None:
        return own
    key = profile_key(model)
    found = None if calibrate else cached(key)
    if found is not None:
        return found
    measured = measure(model)
    record = {"model": os.fspath(model.path), "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": measured.to_dict()}
    with atomic_write(_cache_file(key), hint=CACHE_HINT) as f:
        json.dump(record, f, indent=1)
    return measured


def call_groups(model: Any, profile: CallProfile | None, parts: Sequence[tuple[Any, Sequence[int], int, int]]) -> list[range]:
    """`Model.decode` parts (slot, tokens, first, last) grouped into the calls that cost least
    at the model's `profile` (`CallProfile.group`; None: one call for as many as fit), each
    within the model's limits (n_batch tokens, max_logit_rows rows)."""
    ends, rows = [0], [0]
    for _, tokens, first, last in parts:
        ends.append(ends[-1] + len(tokens))
        rows.append(rows[-1] + last - first)

    def fits(i: int, j: int) -> bool:
        return ends[j] - ends[i] <= model.n_batch and rows[j] - rows[i] <= model.max_logit_rows

    return (profile or CallProfile.flat(1.0)).group([len(tokens) for _, tokens, _, _ in parts], fits)


def describe(profile: CallProfile) -> str:
    """b(2), b(4), b(8) and the one-row call time, as `models info`, `models quantize` and `bench`
    print them."""
    return (
        f"b(2) {profile.batch_cost(2):.2f}, b(4) {profile.batch_cost(4):.2f}, b(8) {profile.batch_cost(8):.2f} "
        f"(a call of k rows in one-row calls; 1 row {profile(1) * 1000:.1f} ms)"
    )


def measured(profile: CallProfile, times: Any, planned: CallProfile) -> str | None:
    """The calls a model made as they measured, beside its profile's prices, and whether the
    plans took them (`planned`, the profile as `Costs.current` corrects it, is another where they
    did); None before it made a call of up to 16 rows. `times`: its `backend.slot.CallTimes`."""
    means = {n: mean for n in sorted(times.calls) if (mean := times.mean(n)) is not None}
    if not means:
        return None
    counts = ", ".join(f"{n} row{'s' * (n > 1)} {mean * 1000:.1f} ms (profile {profile(n) * 1000:.1f})" for n, mean in means.items())
    verdict = "off the profile: the plans take these" if planned is not profile else "within the profile's band: the plans keep the profile"
    return f"its calls as measured: {counts}; {verdict}"


def advice(weights: str, profile: CallProfile) -> str | None:
    """One line for a user when the profile says batched calls are dear on this machine, naming
    weight types whose kernels batch cheaper on many CPUs (None when they are cheap)."""
    b4 = profile.batch_cost(4)
    if b4 <= 2.0:
        return None
    better = "Q4_0 or IQ4_NL" if weights.upper() not in ("Q4_0", "IQ4_NL") else "Q8_0"
    return (
        f"a 4-token call costs {b4:.2f} single calls here, so drafts pay little: llama.cpp's CPU kernels batch "
        f"{better} weights in groups of rows on many CPUs; try `localcos models quantize` and compare b(4)"
    )
