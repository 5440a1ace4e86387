"""The allocator setting of the command line's long jobs (glibc only; elsewhere nothing changes).

A replay, a trajectory model and a surrogate step allocate and free arrays of a few hundred KB to
tens of MB thousands of times a generation. glibc hands freed heap above its adaptive trim
threshold back to the kernel, so the next arrays fault their pages in again (1.8-2.3 million
faults in four generations on the real data, a fifth of the process's CPU in the kernel). Serving
arrays up to 32 MB from the heap and keeping up to 256 MB of freed heap cut the faults about 2x
and a generation's wall time by about 5 % (docs/HISTORY.md, "Fewer page faults: the allocator
keeps freed arrays"), for the same resident memory. Results do not change.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set glibc's allocator as above; False where there is no glibc (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # the trim threshold too: with a fixed mmap threshold glibc would hand freed heap back at 128 KB
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
