"""What every benchmark shares: best-of timing and a line describing the machine."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def best_of(repeats: int, runs: dict[str, Callable[[], T]], *, device: str = "cpu") -> dict[str, tuple[float, T]]:
    """For each named run, the fastest of ``repeats`` calls (the least disturbed by other work on
    the machine) and the last result. The runs take turns, round by round, so that a slow spell
    of a shared machine falls on all of them rather than on whichever ran then; each timed call
    comes right after an untimed call of the same run, so that every run is timed warm (its
    threads awake, its data in cache) rather than cold after whichever ran before it. On a GPU
    the clock stops only once the device has finished."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    results: dict[str, T] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            run()
            sync(device)
            start = time.perf_counter()
            results[name] = run()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: (min(times[name]), results[name]) for name in runs}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def machine(device: str = "cpu") -> str:
    where = (
        torch.cuda.get_device_name()
        if device.startswith("cuda")
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    )
    return f"machine: {where}; torch {torch.__version__}"
