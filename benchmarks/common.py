"""What every benchmark shares: best-of timing and a line describing the machine."""

from __future__ import annotations

import os
import platform
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def best_of(repeats: int, run: Callable[[], T], *, device: str = "cpu") -> tuple[float, T]:
    """The fastest of ``repeats`` calls (the least disturbed by other work on the machine), and
    the last result. On a GPU the clock stops only once the device has finished."""
    times, result = [], None
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = run()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times), result


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def machine(device: str = "cpu") -> str:
    where = torch.cuda.get_device_name() if device.startswith("cuda") else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    return f"machine: {where}; torch {torch.__version__}"
