"""ktframe's estimator and bare model in a process that runs nothing else.

The scripts that time ktframe against scikit-learn (lloyd_vs_sklearn.py, many_small_tasks.py) take
turns with it in one process, and scikit-learn brings an OpenMP runtime of its own, whose threads
spin on the cores after each of its fits. This one times ktframe alone, as a program that only
clusters with it runs: ``TransformerKMeans.fit`` and the bare ``lloyd`` model, 10 iterations from
given centers (``tol=0``), on one large task at two shapes and on 256 small tasks. It uses only
the public API and NumPy's random numbers, so that ``before_after.py`` can run it against a
checkout that predates it. Not a test: nothing here asserts a time.

    python benchmarks/ktframe_alone.py [--repeats 7]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import best_of, machine

import ktframe

# (tasks, n, d, k): one large task at the two shapes of lloyd_vs_sklearn.py, and many_small_tasks.py's tasks.
SETTINGS = ((1, 50_000, 2, 16), (1, 50_000, 32, 100), (256, 100, 2, 8))
ITERATIONS = 10
# tol=0: each task runs until an iteration changes nothing, which an estimator without ``tol`` did.
STOP = {"tol": 0.0} if "tol" in ktframe.TransformerKMeans(2).get_params() else {}


def problem(tasks: int, n: int, d: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Points of a mixture of k Gaussian blobs per task, (tasks, n, d), and k of them as the starting centers."""
    means = rng.normal(scale=4.0, size=(tasks, k, d))
    X = means[np.arange(tasks)[:, None], rng.integers(k, size=(tasks, n))] + rng.normal(size=(tasks, n, d))
    starts = X[np.arange(tasks)[:, None], np.stack([rng.choice(n, k, replace=False) for _ in range(tasks)])]
    return X.astype(np.float32), starts.astype(np.float32)


def timed(tasks: int, n: int, d: int, k: int, rng: np.random.Generator, repeats: int) -> dict[str, float]:
    """The best of ``repeats`` seconds of the estimator's fit and of the bare model, taken in turn."""
    X, starts = problem(tasks, n, d, k, rng)
    points, centers = (X[0], starts[0]) if tasks == 1 else (X, starts)
    estimator = ktframe.TransformerKMeans(k, n_layers=ITERATIONS, init=centers, dtype="float32", **STOP)
    model = ktframe.build_model("lloyd", d=d, k=k, n_layers=ITERATIONS, reset="identity")
    X_t, starts_t = torch.from_numpy(X), torch.from_numpy(starts)

    def bare_model():
        with torch.no_grad():
            return model(X_t, starts_t)

    best = best_of(repeats, {"fit": lambda: estimator.fit(points), "model": bare_model})
    return {name: seconds for name, (seconds, _) in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(machine("cpu"))
    rng = np.random.default_rng(0)
    for tasks, n, d, k in SETTINGS:
        seconds = timed(tasks, n, d, k, rng, args.repeats)
        print(f"\nn={n} d={d} k={k}, {tasks} task{'s' if tasks > 1 else ''}, float32, {ITERATIONS} iterations from given centers, best of {args.repeats}")
        print(f"  TransformerKMeans.fit {seconds['fit'] * 1e3:9.2f} ms")
        print(f"  bare model            {seconds['model'] * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
