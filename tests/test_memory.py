"""``ktframe.memory``: large zeroed arrays on huge pages, and freed memory handed back."""

from __future__ import annotations

import ctypes
import gc
import mmap
import sys

import numpy as np
import pytest
import torch

from ktframe import memory

LINUX = sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


def mapping_of(address: int) -> tuple[str, list[str]] | None:
    """The /proc/self/smaps line range of the mapping holding ``address``, and its VmFlags."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(x, 16) for x in head.split("-"))
            if start <= address < end:
                flags = next(entry for entry in lines[i + 1 :] if entry.startswith("VmFlags:"))
                return head, flags.split()[1:]
    return None


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.uint8])
def test_zeros_is_np_zeros(dtype):
    shape = (memory.THRESHOLD // np.dtype(dtype).itemsize // 4 + 3, 4)
    array = memory.zeros(shape, dtype)
    assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
    assert not array.any()
    array[-1, -1] = 7  # writable to its last element
    assert array[-1, -1] == 7


def test_small_arrays_are_the_usual_ones():
    array = memory.zeros((100, 3), np.float64)
    assert array.base is None  # NumPy's own
    like = torch.ones(2, dtype=torch.float32)
    tensor = memory.tensor_zeros((10, 3), like)
    assert tensor.dtype == torch.float32 and not tensor.any()


@pytest.mark.skipif(not LINUX, reason="transparent huge pages are Linux's")
def test_large_arrays_are_advised_huge_pages_and_start_on_one():
    array = memory.zeros((memory.THRESHOLD // 8 + 10,), np.float64)
    address = array.ctypes.data
    assert address % memory.HUGE_PAGE == 0
    found = mapping_of(address)
    assert found is not None and "hg" in found[1]  # MADV_HUGEPAGE


@pytest.mark.skipif(not LINUX, reason="transparent huge pages are Linux's")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tensor_zeros_outlives_its_helpers_and_is_unmapped_when_freed(dtype):
    like = torch.ones(1, dtype=dtype)
    shape = (2, memory.THRESHOLD // like.element_size() // 8 + 1, 4)
    tensor = memory.tensor_zeros(shape, like)
    assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
    gc.collect()  # nothing but the tensor holds the mapping now
    tensor[1, -1, -1] = 5.0
    assert float(tensor.sum()) == 5.0
    head = mapping_of(tensor.data_ptr())[0]
    del tensor
    gc.collect()
    assert head not in open("/proc/self/maps").read()


def test_tensor_zeros_off_the_cpu_or_small_follows_like():
    like = torch.ones(3, dtype=torch.float64)
    assert memory.tensor_zeros((4, 4), like).equal(torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._malloc_trim() is None, reason="glibc's malloc_trim")
def test_release_freed_hands_back_what_was_freed():
    # 1 000 blocks of 100 KiB from the C heap (below glibc's mmap threshold), every other one then
    # freed: the freed ones lie between blocks still in use, so their pages stay with the process
    # until released.
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_mib() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * mmap.PAGESIZE / 2**20

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
