"""The exact ``lloyd`` transformer against scikit-learn's Lloyd, per iteration, in one run.

Both start from the same initial centers on the same data; the printed figure is a ratio, since
absolute times on a shared machine mean little. Not a test: nothing here asserts a time.

    python benchmarks/lloyd_vs_sklearn.py                # n=100 000, d=32, k=100, 10 iterations
    python benchmarks/lloyd_vs_sklearn.py --n 10000 --k 10
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
import warnings

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

import ktframe
from ktframe import reference
from ktframe.tasks import mixture


def best_of(repeats: int, run) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()

    # k-means++ starts, so that no cluster empties: scikit-learn moves an empty cluster's center to
    # a far point where ktframe keeps it, and the two would then compute different things.
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(args.seed)
    X, _ = mixture(1, args.n, args.d, args.k, generator=generator, dtype=dtype)
    C0 = reference.kmeans_plusplus(X, args.k, generator, greedy=True)
    X_np, C0_np = X[0].numpy(), C0[0].numpy()

    model = ktframe.build_model("lloyd", d=args.d, k=args.k, n_layers=args.iterations, reset="identity", dtype=dtype)

    def transformer():
        with torch.no_grad():
            return model(X, C0)

    def sklearn():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return KMeans(args.k, algorithm="lloyd", init=C0_np, n_init=1, max_iter=args.iterations, tol=0.0).fit(X_np)

    transformer()  # warm-up: first calls allocate
    t_model, result = best_of(args.repeats, transformer)
    t_sklearn, fitted = best_of(args.repeats, sklearn)
    per_model = t_model / args.iterations
    per_sklearn = t_sklearn / fitted.n_iter_

    same = np.abs(result.centers[0].numpy() - fitted.cluster_centers_).max() if fitted.n_iter_ == args.iterations else math.nan
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"data: n={args.n} d={args.d} k={args.k}, {args.dtype}, {args.iterations} iterations from the same k-means++ centers, best of {args.repeats}")
    print(f"ktframe lloyd (gamma=inf, reset=identity): {per_model * 1e3:8.2f} ms / iteration")
    print(f"scikit-learn KMeans(algorithm='lloyd'):    {per_sklearn * 1e3:8.2f} ms / iteration ({fitted.n_iter_} iterations)")
    print(f"max |center difference| after {args.iterations} iterations: {same:.2e}")
    print(f"ratio ktframe / scikit-learn: {per_model / per_sklearn:.2f}x (below 1 means ktframe is faster)")


if __name__ == "__main__":
    main()
