"""Keep glibc from handing MB-sized blocks back to the kernel between the model's block loops.

Without autograd a layer works through its tokens in cache-sized blocks, and every block
allocates and frees temporaries of about a megabyte. glibc serves blocks that size with ``mmap``
until its adaptive threshold has grown, and trims the top of its heap whenever more than twice
that is free, so the same megabyte can be returned to the kernel and faulted back in, page by
page, thousands of times per layer: on a 2-core CPU that cost the exact model up to 1.6× per
iteration. Pinning the two thresholds at the values glibc's own adaptation reaches at most
(32 MiB for ``mmap``, 64 MiB kept at the heap top) removes the churn for at most 64 MiB of memory
held back. Applied once, when ktframe is imported; ``KTFRAME_KEEP_MALLOC=1`` leaves malloc alone.
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

KEEP_ENV = "KTFRAME_KEEP_MALLOC"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20


def pin_thresholds() -> bool:
    """Set the thresholds; True if glibc took them."""
    if not sys.platform.startswith("linux") or os.environ.get(KEEP_ENV, "") not in ("", "0"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
