"""ktframe pins glibc's malloc thresholds on import (ktframe/malloc.py): a freed block of a few MB
stays in the heap for the next block loop instead of going back to the kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
