"""The exact ``lloyd`` transformer against scikit-learn's and faiss's k-means, per iteration, in one run.

All start from the same initial centers on the same data; the printed figures are ratios, since
absolute times on a shared machine mean little. Not a test: nothing here asserts a time. faiss is
optional (``pip install -e ".[bench]"``); without it its column is skipped.

    python benchmarks/lloyd_vs_sklearn.py                      # n=1e5: d=32 k=100, then d=128 k=1000
    python benchmarks/lloyd_vs_sklearn.py --settings 10000,2,10 --iterations 20
    python benchmarks/lloyd_vs_sklearn.py --device cuda        # ktframe on the GPU, the others on CPU
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from common import best_of, machine
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

import ktframe
from ktframe.core import reference
from ktframe.core.tasks import mixture

try:
    import faiss
except ImportError:  # optional competitor
    faiss = None


def setting(text: str) -> tuple[int, int, int]:
    n, d, k = (int(v) for v in text.split(","))
    return n, d, k


def run_setting(n: int, d: int, k: int, args: argparse.Namespace) -> None:
    # k-means++ starts, so that no cluster empties: scikit-learn and faiss move an empty cluster's
    # center elsewhere where ktframe keeps it, and they would then compute different things.
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(args.seed)
    X, _ = mixture(1, n, d, k, generator=generator, dtype=dtype)
    C0 = reference.kmeans_plusplus(X, k, generator)
    X_np, C0_np = X[0].numpy(), C0[0].numpy()
    iters = args.iterations

    model = ktframe.build_model("lloyd", d=d, k=k, n_layers=iters, reset="identity", dtype=dtype).to(args.device)
    X_dev, C0_dev = X.to(args.device), C0.to(args.device)

    def transformer():
        with torch.no_grad():
            return model(X_dev, C0_dev)

    # what users call: the estimator, from the same starting centers (it also computes the labels
    # and inertia of its result); on the CPU only, since it takes numpy arrays. tol=0.0 on both
    # sides: each runs until an iteration changes nothing or the iterations run out
    estimator = ktframe.TransformerKMeans(k, n_layers=iters, init=C0_np, tol=0.0, dtype=args.dtype)

    def sklearn():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return KMeans(k, algorithm="lloyd", init=C0_np, n_init=1, max_iter=iters, tol=0.0).fit(X_np)

    runs = {"ktframe": transformer, "scikit-learn": sklearn}
    if args.device == "cpu":
        runs["ktframe fit"] = lambda: estimator.fit(X_np)
    if faiss is not None:

        def faiss_kmeans():
            # No subsampling (faiss trains on at most 256 points per centroid by default).
            km = faiss.Kmeans(d, k, niter=iters, max_points_per_centroid=n, seed=args.seed, verbose=False)
            km.train(np.ascontiguousarray(X_np, dtype=np.float32), init_centroids=np.ascontiguousarray(C0_np, dtype=np.float32))
            return km

        runs["faiss"] = faiss_kmeans

    transformer()  # warm-up: first calls allocate
    timed = best_of(args.repeats, runs, device=args.device)
    (t_model, result), (t_sklearn, fitted) = timed["ktframe"], timed["scikit-learn"]
    centers = result.centers[0].cpu().numpy()
    # Both stop once an iteration leaves the labels as they were: each is timed per iteration it
    # ran, and their centers are compared where they stopped at the same one.
    n_iter = int(result.n_iter[0])
    per = {"ktframe": t_model / n_iter, "scikit-learn": t_sklearn / fitted.n_iter_}
    gaps = {"scikit-learn": np.abs(centers - fitted.cluster_centers_).max() if fitted.n_iter_ == n_iter else np.nan}
    if faiss is not None:
        t_faiss, km = timed["faiss"]
        per["faiss"] = t_faiss / iters
        gaps["faiss"] = np.abs(centers - km.centroids).max()

    fit_line = ""
    if "ktframe fit" in timed:
        t_fit, fitted_estimator = timed["ktframe fit"]
        fit_iters = int(np.max(fitted_estimator.n_iter_))
        fit_line = (
            f"  {'ktframe fit':<13} {t_fit / fit_iters * 1e3:9.2f} ms / iteration"
            f"   fit / scikit-learn: {t_fit / fit_iters / per['scikit-learn']:5.2f}x   ({t_fit:.3f} s in all for {fit_iters} iterations,"
            f" scikit-learn {t_sklearn:.3f} s; TransformerKMeans.fit, init= the same centers)"
        )
    print(f"\nn={n} d={d} k={k}, {args.dtype}, {iters} iterations from the same k-means++ centers, best of {args.repeats} rounds taken in turn")
    print(f"  iterations run: ktframe {n_iter}, scikit-learn {fitted.n_iter_}" + ("" if faiss is None else f", faiss {iters}"))
    for name, seconds in per.items():
        ratio = "" if name == "ktframe" else f"   ktframe / {name}: {per['ktframe'] / seconds:5.2f}x   max |center gap| {gaps[name]:.1e}"
        print(f"  {name:<13} {seconds * 1e3:9.2f} ms / iteration{ratio}")
    if fit_line:
        print(fit_line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=setting, nargs="+", default=[(100_000, 32, 100), (100_000, 128, 1000)], metavar="N,D,K")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(machine(args.device) + ("" if faiss is None else f"; faiss {faiss.__version__}") + " (ratios below 1: ktframe is faster)")
    for n, d, k in args.settings:
        run_setting(n, d, k, args)


if __name__ == "__main__":
    main()
