"""``ktframe.fast.memory``: freed memory handed back to the system."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from ktframe.fast import memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or memory._malloc_trim() is None,
    reason="release_freed calls glibc's malloc_trim and does nothing without it; the fragmented heap below is glibc's behaviour",
)
def test_release_freed_hands_back_what_was_freed():
    # 1 000 blocks of 100 KiB from the C heap (below glibc's mmap threshold), every other one then
    # freed: the freed ones lie between blocks still in use, so their pages stay with the process
    # until released.
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE / 2**20

    blocks = []
    for _ in range(1000):
        blocks.append(libc.malloc(100 << 10))
        ctypes.memset(blocks[-1], 1, 100 << 10)
    for block in blocks[::2]:
        libc.free(block)
    held = rss_mib()
    memory.release_freed()
    try:
        assert rss_mib() < held - 30  # most of the 49 MiB freed handed back
    finally:
        for block in blocks[1::2]:
            libc.free(block)
