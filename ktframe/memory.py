"""Memory of large CPU arrays: taken zeroed on transparent huge pages where the kernel gives them
on request (:func:`zeros`, :func:`tensor_zeros`), and handed back to the system once freed
(:func:`release_freed`).

A fresh array is paid for at its first touch, a page fault per page: the gigabyte of point tokens
of a fit at n = 10⁶ (d = 32, k = 100, float64) is 262 144 pages of 4 KiB, and faulting them in
can cost more than the layers' arithmetic on them. An anonymous private mapping advised
``MADV_HUGEPAGE`` is faulted in 2 MiB at a time where transparent huge pages are ``always`` or
``madvise`` (Linux), comes zeroed from the kernel, and needs fewer TLB entries while it is read.
Only the arrays made here are advised: nothing about the process changes (its allocator, its
environment), and a mapping is unmapped when the last array on it is freed.

Below :data:`THRESHOLD`, off Linux, or where the mapping cannot be made, the arrays are NumPy's
and PyTorch's usual ones.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
from collections.abc import Callable

import numpy as np
import torch

HUGE_PAGE = 2 << 20
THRESHOLD = 32 << 20  # a smaller array faults in few pages: not worth a mapping of its own


def _advised(nbytes: int) -> np.ndarray | None:
    """``nbytes`` zeroed bytes that start on a huge-page boundary, in a mapping advised
    ``MADV_HUGEPAGE``; None where that cannot be had."""
    if nbytes < THRESHOLD or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    raw = np.frombuffer(area, np.uint8)  # keeps the mapping alive as long as any view of it
    start = -raw.ctypes.data % HUGE_PAGE  # mappings start on a 4 KiB page; huge pages need 2 MiB
    return raw[start : start + nbytes]


def zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """``np.zeros(shape, dtype)``, on huge pages where it is large (see the module)."""
    dtype = np.dtype(dtype)
    raw = _advised(math.prod(shape) * dtype.itemsize)
    return np.zeros(shape, dtype) if raw is None else raw.view(dtype).reshape(shape)


def tensor_zeros(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """``like.new_zeros(shape)``, on huge pages where it is large and on the CPU (see the module)."""
    raw = _advised(math.prod(shape) * like.element_size()) if like.device.type == "cpu" else None
    return like.new_zeros(shape) if raw is None else torch.frombuffer(raw, dtype=like.dtype).view(shape)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's; absent elsewhere
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed() -> None:
    """Hand the memory that the C allocator holds free back to the system (glibc's
    ``malloc_trim``; elsewhere nothing). Freed blocks of a few megabytes stay with the allocator,
    and calls that allocate and free one every time (``torch.multinomial`` over a million weights,
    a hundred times in a seeding) can leave hundreds of megabytes of them, split by small
    allocations in between, which the process keeps to its end. Nothing about the allocator's
    settings changes."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
