"""Keep freed request buffers in the process's heap instead of handing them back to the kernel.

A request of B=8 full-length users is half a megabyte. glibc serves an allocation that size with
its own mmap and returns it with munmap when freed, so every request's buffers are faulted in
anew, page by page (about 130 minor faults per 537 KB; measured in BENCHMARKS.md, "Load
generator cost", at 600-770 faults and half the client's CPU per request). With the mmap
threshold fixed above any request and the heap's top kept, freed buffers are reused as they
are. The heap then stays at its high-water mark: a few request sizes of memory.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20  # larger than any request the published model takes (40,000 x 8 bytes)
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process; False where the C library is not glibc. Looks
    the function up in the running process (no library search: `ctypes.util.find_library`
    starts a subprocess, and under gevent that lets other greenlets run in the middle of setup)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
