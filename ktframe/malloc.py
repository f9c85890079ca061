"""How ktframe takes memory on CPU, where the allocator's defaults cost the model time.

- :func:`pin_thresholds`: keep glibc from handing MB-sized blocks back to the kernel between the
  model's block loops. Without autograd a layer works through its tokens in cache-sized blocks,
  and every block allocates and frees temporaries of about a megabyte. glibc serves blocks that
  size with ``mmap`` until its adaptive threshold has grown, and trims the top of its heap
  whenever more than twice that is free, so the same megabyte can be returned to the kernel and
  faulted back in, page by page, thousands of times per layer: on a 2-core CPU that cost the
  exact model up to 1.6× per iteration. Pinning the two thresholds at the values glibc's own
  adaptation reaches at most (32 MiB for ``mmap``, 64 MiB kept at the heap top) removes the churn
  for at most 64 MiB of memory held back. Applied once, when ktframe is imported.
- :func:`zeros`: the token streams, tens to hundreds of MB at n = 10⁵, on pages fresh from the
  kernel, which come zero-filled (no pass of ours writes the zeros), and on transparent huge pages
  where the kernel offers them: 2 MiB faulted in at a time instead of 4 KiB. Faulting a 53 MB
  stream in 4 KiB pages took 20–50 ms on a 2-core VM, a quarter of ten Lloyd iterations at
  n = 10⁵, d = 32, k = 100; fresh huge pages took 6 ms.

``KTFRAME_KEEP_MALLOC=1`` leaves both alone. Elsewhere than Linux (and glibc) they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import sys
from typing import Sequence

import torch

KEEP_ENV = "KTFRAME_KEEP_MALLOC"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
# Tensors from this size up get fresh pages of their own: a few huge pages' worth.
FRESH_MIN = 4 << 20


def _kept() -> bool:
    return not sys.platform.startswith("linux") or os.environ.get(KEEP_ENV, "") not in ("", "0")


def pin_thresholds() -> bool:
    """Set the thresholds; True if glibc took them."""
    if _kept():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor; from :data:`FRESH_MIN` bytes up, on fresh (huge) pages of its
    own, which go back to the kernel when the tensor is freed."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < FRESH_MIN or _kept():
        return torch.zeros(shape, dtype=dtype)
    # Private: a shared anonymous mapping would be shmem, whose huge pages are set apart.
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(pages, dtype=dtype).view(tuple(shape))
