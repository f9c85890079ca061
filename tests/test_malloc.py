"""ktframe's memory on CPU (ktframe/malloc.py): glibc's malloc thresholds are pinned on import, so a
freed block of a few MB stays in the heap for the next block loop instead of going back to the
kernel; large token streams take fresh pages of their own, on transparent huge pages where the
kernel offers them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ktframe import malloc

PROBE = """
import ctypes, torch
import ktframe

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
block = torch.ones(1 << 20)  # 4 MiB
del block
print(libc.mallinfo2().fordblks)
"""


def free_heap_bytes_after_a_4mib_block(keep_malloc: bool) -> int:
    env = {key: value for key, value in os.environ.items() if key != "KTFRAME_KEEP_MALLOC"}
    if keep_malloc:
        env["KTFRAME_KEEP_MALLOC"] = "1"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc only")
def test_a_freed_block_stays_in_the_heap_unless_switched_off():
    assert free_heap_bytes_after_a_4mib_block(keep_malloc=False) >= 4 << 20
    assert free_heap_bytes_after_a_4mib_block(keep_malloc=True) < 4 << 20


def test_zeros_are_zeros_of_their_own_large_or_small():
    large = malloc.zeros((3, 1 << 20), torch.float64)  # 24 MiB
    small = malloc.zeros((3, 5), torch.float32)
    for t, shape, dtype in ((large, (3, 1 << 20), torch.float64), (small, (3, 5), torch.float32)):
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and not t.any()
        t += 1  # writable, and each element its own
        assert t.sum() == t.numel()


HUGE_PROBE = """
import torch
from ktframe import malloc

def huge_kib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])

before = huge_kib()
stream = malloc.zeros((16, 1 << 20), torch.float32)  # 64 MiB
stream[:, ::1024] = 1  # touch every page
print(huge_kib() - before, stream.untyped_storage().resizable())
"""


def probe_huge_pages(keep_malloc: bool) -> tuple[int, bool]:
    env = {key: value for key, value in os.environ.items() if key != "KTFRAME_KEEP_MALLOC"}
    if keep_malloc:
        env["KTFRAME_KEEP_MALLOC"] = "1"
    out = subprocess.run([sys.executable, "-c", HUGE_PROBE], env=env, capture_output=True, text=True, check=True).stdout.split()
    return int(out[-2]), out[-1] == "True"


def transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


@pytest.mark.skipif(transparent_huge_pages() == "never", reason="the kernel offers no transparent huge pages")
def test_a_large_stream_sits_on_huge_pages_unless_switched_off():
    huge_kib, resizable = probe_huge_pages(keep_malloc=False)
    # At least one 2 MiB page (here all 32 of them): on a machine whose memory is fragmented the
    # kernel may fall back to small pages for some of the range.
    assert huge_kib >= 2 << 10
    assert not resizable  # a buffer of its own, not torch's allocator's
    _, resizable = probe_huge_pages(keep_malloc=True)
    assert resizable
