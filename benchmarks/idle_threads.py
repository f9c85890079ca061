"""What PyTorch's OpenMP threads cost the kernels that follow them, in one process.

Prints (1) the CPU time PyTorch's other threads spend after one large operation (spinning, waiting
for more work), (2) the first arg-max of a bare `lloyd` model call at n = 5·10⁴, d = 2, k = 16
right after such an operation and after the threads have gone to sleep, (3) the cost of one
launch of a bare numba parallel loop in the threading layer in use, and (4) that arg-max on one
thread and on two. Run it once per setting:

    python benchmarks/idle_threads.py                               # ktframe's layer: tbb
    NUMBA_THREADING_LAYER=workqueue python benchmarks/idle_threads.py
    NUMBA_THREADING_LAYER=workqueue OMP_WAIT_POLICY=PASSIVE python benchmarks/idle_threads.py
    NUMBA_THREADING_LAYER=omp python benchmarks/idle_threads.py

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch
from common import machine

import ktframe
from ktframe.core import reference
from ktframe.core.tasks import mixture
from ktframe.kernels import cpu, jit


def other_threads_cpu_seconds() -> float:
    """CPU time, so far, of every thread of this process but the calling one."""
    me, total = threading.get_native_id(), 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    print(machine("cpu"))
    big = torch.empty(2_000_000)
    big.fill_(0.0)
    time.sleep(0.5)
    before = other_threads_cpu_seconds()
    for _ in range(20):
        big.fill_(1.0)  # one operation on PyTorch's threads, then nothing for 50 ms
        time.sleep(0.05)
    spun = (other_threads_cpu_seconds() - before) / 20
    print(f"(1) after one PyTorch operation on 2e6 numbers, its other threads use {spun * 1e3:.1f} ms of CPU")

    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(1, 50_000, 2, 16, generator=generator)
    C0 = reference.kmeans_plusplus(X, 16, generator)
    model = ktframe.build_model("lloyd", d=2, k=16, n_layers=1, reset="identity")
    with torch.no_grad():
        model(X, C0)  # compiles (or loads) the kernels
        q, k = X.clone(), C0.clone()
        times = {"right after a PyTorch operation": [], "after 100 ms idle": []}
        for _ in range(7):
            for label in times:
                big.fill_(1.0)
                if label.startswith("after 100"):
                    time.sleep(0.1)
                start = time.perf_counter()
                cpu.argmax_dot(q, k, 2.0, -1.0, values=q)
                times[label].append(time.perf_counter() - start)
    for label, seconds in times.items():
        print(f"(2) one arg-max pass (n=5e4, d=2, k=16) {label}: median {np.median(seconds) * 1e3:.2f} ms")
    budget = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)  # the kernels run on as many threads as PyTorch does
        seconds = []
        for _ in range(15):
            start = time.perf_counter()
            cpu.argmax_dot(q, k, 2.0, -1.0, values=q)
            seconds.append(time.perf_counter() - start)
        print(f"(4) the same arg-max pass, back to back, on {threads} thread{'s' if threads > 1 else ''}: median {np.median(seconds) * 1e3:.2f} ms")
    torch.set_num_threads(budget)

    numba = jit.load_numba()

    @numba.njit(parallel=True, nogil=True)
    def touch(a, workers):
        for i in numba.prange(workers):
            a[i] += 1.0

    a = np.zeros(8)
    touch(a, 2)
    start = time.perf_counter()
    for _ in range(2000):
        touch(a, 2)
    print(f"(3) one launch of a bare parallel loop, {numba.threading_layer()} layer: {(time.perf_counter() - start) / 2000 * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
