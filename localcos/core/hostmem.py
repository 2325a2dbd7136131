"""Host memory settings for the decoding loop.

Every token, the decoder makes and drops a few arrays the size of the vocabulary (logits rows,
softmaxes, r). glibc hands freed memory at the top of its heap back to the operating system, so
each new array is fresh memory again and costs a page fault per 4 KiB page on first touch: at a
152k vocabulary that was ~1.5 ms of host time per token on a 2-core EPYC, most of the loop. Asking
glibc to keep some padding at the top of the heap makes those arrays reuse memory the process
already has (~0.35 ms per token; benchmarks/host_loop.py measures it). Allocations below 32 MiB
then come from the heap instead of their own mappings.
"""

from __future__ import annotations

import ctypes
import sys

from ..paths import env_switch

# glibc's mallopt parameters
M_TOP_PAD = -2  # bytes of slack kept at the top of the heap when it shrinks
M_MMAP_THRESHOLD = -3  # allocations at least this large get their own mapping (and lose it on free)
TOP_PAD_BYTES = 64 << 20
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own ceiling for its adaptive threshold

_done = False


def keep_freed_memory(pad_bytes: int = TOP_PAD_BYTES) -> bool:
    """Ask glibc to keep `pad_bytes` of freed heap in the process (once; Linux with glibc only).

    Returns whether the setting is in effect. LOCALCOS_KEEP_MEMORY=0 turns it off.
    """
    global _done
    if _done:
        return True
    if env_switch("LOCALCOS_KEEP_MEMORY") is False:
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Fix the threshold (glibc's adaptive one starts at 128 KiB, below a 152k-float row, and stops
    # adapting once any parameter is set) and keep the padding. musl's mallopt is a stub: 0.
    _done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TOP_PAD, pad_bytes) == 1
    return _done
