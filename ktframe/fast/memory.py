"""Memory that the C allocator holds free, handed back to the system.

glibc keeps freed blocks of a few megabytes to serve later requests; a call that allocates and
frees one every time, with small allocations made in between that stay (``torch.multinomial``
over a million weights, a hundred times in a k-means++ seeding), leaves them split, so that the
next request takes new memory: hundreds of megabytes that the process then keeps to its end.
:func:`release_freed` gives back what is free once such a loop is over. Nothing about the
allocator's settings changes.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


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
    ``malloc_trim``; elsewhere nothing)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
