"""Greedy k-means++ seeding: ``ktframe.fast.seeding.kmeans_plusplus`` (what
``TransformerKMeans(init="k-means++")`` calls) against scikit-learn's ``kmeans_plusplus`` (both
greedy, ``2 + ⌊ln k⌋`` local trials) on the same data, in one run.

Printed as a ratio (best of ``--repeats`` rounds taken in turn); not a test.

    python benchmarks/seeding_vs_sklearn.py                     # n=1e5 d=32 k=100, float64
    python benchmarks/seeding_vs_sklearn.py --n 1000000 --dtype float32
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import best_of, machine
from sklearn.cluster import kmeans_plusplus as sklearn_kmeans_plusplus

from ktframe.core import reference
from ktframe.fast import seeding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X_np = (rng.uniform(-10, 10, (args.k, args.d))[rng.integers(args.k, size=args.n)] + rng.normal(size=(args.n, args.d))).astype(args.dtype)
    X = torch.from_numpy(X_np)[None]
    runs = {
        "ktframe": lambda: seeding.kmeans_plusplus(X, args.k, torch.Generator().manual_seed(0), greedy=True),
        "scikit-learn": lambda: sklearn_kmeans_plusplus(X_np, args.k, random_state=0)[0],
    }
    timed = best_of(args.repeats, runs)
    (t_ours, C), (t_sklearn, C_sk) = timed["ktframe"], timed["scikit-learn"]
    potential = {"ktframe": float(reference.objective(X, C)[0]), "scikit-learn": float(reference.objective(X, torch.from_numpy(C_sk)[None])[0])}
    print(machine())
    print(f"n={args.n} d={args.d} k={args.k}, {args.dtype}, greedy k-means++ ({2 + int(np.log(args.k))} local trials), best of {args.repeats}")
    print(f"  ktframe kmeans_plusplus   {t_ours:8.3f} s   potential {potential['ktframe']:.6g}")
    print(f"  scikit-learn              {t_sklearn:8.3f} s   potential {potential['scikit-learn']:.6g}")
    print(f"  ktframe / scikit-learn: {t_ours / t_sklearn:.2f}x (below 1: ktframe is faster)")


if __name__ == "__main__":
    main()
