"""What PyTorch's OpenMP threads cost the kernels that follow them, in one process.

Prints (1) the CPU time PyTorch's other threads spend after one large operation (spinning, waiting
for more work), (2) the first arg-max of a bare `lloyd` model call at n = 5·10⁴, d = 2, k = 16
right after such an operation and after the threads have gone to sleep, (3) the cost of one
launch of a bare numba parallel loop in the threading layer in use, (4) that arg-max on two
threads, on one, and on two again, and (5) a parallel loop of two equal halves of busy work on two threads,
launched after 100 µs of Python work as a model's step launches its kernels: the wall time
against one half's, which is 1 where the second thread takes its half at once and 2 where the
calling thread ends up doing both, and (6) the arg-max on two threads right after a two-iteration
scikit-learn fit of the same points (its OpenMP threads are PyTorch's: scikit-learn's OpenMP calls,
like those of numba's omp layer, bind to the libgomp that PyTorch put in the process's global
scope), as a benchmark that takes turns with scikit-learn times it. Run it once per setting:

    python benchmarks/idle_threads.py                               # ktframe's layer: omp on Linux
    NUMBA_THREADING_LAYER=tbb python benchmarks/idle_threads.py
    NUMBA_THREADING_LAYER=workqueue python benchmarks/idle_threads.py
    NUMBA_THREADING_LAYER=workqueue OMP_WAIT_POLICY=PASSIVE python benchmarks/idle_threads.py

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import torch
from common import machine
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

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
    for threads in (2, 1, 2):  # two threads before and after a pass on one
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

    @numba.njit(parallel=True, nogil=True)
    def halves(out, spins, workers):
        for i in numba.prange(workers):
            x = 0.0
            for _ in range(spins):
                x = x * 0.999999 + 1.0
            out[i] = x

    torch.set_num_threads(2)
    numba.set_num_threads(2)
    out = np.zeros(2)
    for micros in (50, 200, 1000):
        spins = calibrated(lambda n: halves(out, n, 1), micros * 1e-6)
        half, both = [], []
        for _ in range(200):
            python_work(100e-6)
            start = time.perf_counter()
            halves(out, spins, 1)
            half.append(time.perf_counter() - start)
            python_work(100e-6)
            start = time.perf_counter()
            halves(out, spins, 2)
            both.append(time.perf_counter() - start)
        print(f"(5) two halves of {micros} µs each on two threads, after 100 µs of Python: {np.median(both) / np.median(half):.2f}x one half's time")

    points, starts = X[0].double().numpy(), C0[0].double().numpy()
    seconds = []
    for _ in range(20):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            KMeans(16, init=starts, n_init=1, max_iter=2, tol=0.0).fit(points)
        start = time.perf_counter()
        cpu.argmax_dot(q, k, 2.0, -1.0, values=q)
        seconds.append(time.perf_counter() - start)
    print(f"(6) the arg-max pass on two threads right after a scikit-learn fit: median {np.median(seconds) * 1e3:.2f} ms")
    torch.set_num_threads(budget)


def python_work(seconds: float) -> None:
    """Busy the calling thread in Python for about ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def calibrated(run, seconds: float) -> int:
    """The count of spins for which ``run(count)`` takes about ``seconds`` on the calling thread."""
    spins = 1000
    run(spins)
    while True:
        start = time.perf_counter()
        run(spins)
        took = time.perf_counter() - start
        if took >= seconds / 4:
            return max(1, int(spins * seconds / took))
        spins *= 4


if __name__ == "__main__":
    main()
