"""Keep freed heap memory for reuse, so that the batched models' large temporary arrays do
not page-fault on every allocation.

glibc's malloc serves a block above M_MMAP_THRESHOLD (128 KiB at start, raised on each free
up to 32 MiB on 64-bit) by mmap and returns it to the kernel on free, and trims the top of the
heap past M_TRIM_THRESHOLD (128 KiB, or twice the raised mmap threshold): mallopt(3). The
memory model's temporaries are (stage slot, layout) int64 arrays, 4 x 135,345 x 8 B = 4.3 MB
on the 405B search's batch, made and freed by the hundred per call; each is mapped afresh, so
its pages fault again on first touch. Measured on the 2-core machine (bench/speed.py's 405B
batch, one memory_batch call): 19,185 minor faults and 80 ms of system time of 177 ms CPU
with glibc's defaults; 0.4 faults and 83 ms CPU with the thresholds below. Freed memory stays
with the process until it exits (a plan is a short process: the peak resident size is what it
was). Other C libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3          # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 * 2**20                    # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD_BYTES = 2**30


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (mallopt(3)); True where it took."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                 TRIM_THRESHOLD_BYTES))
