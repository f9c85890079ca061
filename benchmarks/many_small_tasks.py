"""Many small clustering tasks in one batched call against a loop of scikit-learn fits, in one run.

1 024 independent tasks of n=100 points in d=2 with k=8, at most 10 Lloyd iterations each, all
from the same initial centers: ktframe's estimator fits the whole (1024, 100, 2) array at once
(the bare model is timed too, and again with its steps one by one, its plan's
``one_kernel_call=False``, where it would take them all in one kernel call); scikit-learn fits one task after another. Both stop a
task once an iteration leaves its labels as they were (ktframe skips it in the remaining layers).
Printed as a ratio; not a test.

    python benchmarks/many_small_tasks.py
    python benchmarks/many_small_tasks.py --tasks 4096 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import warnings

import numpy as np
import torch
from common import best_of, machine
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

import ktframe
from ktframe.core import reference
from ktframe.core.tasks import mixture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1024)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--d", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(args.tasks, args.n, args.d, args.k, generator=generator, dtype=dtype)
    C0 = reference.kmeans_plusplus(X, args.k, generator)
    X_np, C0_np = X.numpy(), C0.numpy()
    # tol=0.0 as scikit-learn's below: a task runs until an iteration changes nothing
    estimator = ktframe.TransformerKMeans(args.k, n_layers=args.iterations, init=C0_np, tol=0.0, dtype=args.dtype)
    model = ktframe.build_model("lloyd", d=args.d, k=args.k, n_layers=args.iterations, reset="identity", dtype=dtype).to(args.device)
    stepwise = copy.deepcopy(model)
    stepwise.plan = dataclasses.replace(model.plan, one_kernel_call=False)
    X_dev, C0_dev = X.to(args.device), C0.to(args.device)

    def batched_model(one_call=True):
        with torch.no_grad():
            return (model if one_call else stepwise)(X_dev, C0_dev)

    def sklearn_loop():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fits = [KMeans(args.k, algorithm="lloyd", init=C0_np[t], n_init=1, max_iter=args.iterations, tol=0.0).fit(X_np[t]) for t in range(args.tasks)]
        return np.stack([fit.cluster_centers_ for fit in fits]), np.array([fit.n_iter_ for fit in fits])

    batched_model()  # warm-up
    runs = {"model": batched_model, "steps": lambda: batched_model(one_call=False), "estimator": lambda: estimator.fit(X_np), "scikit-learn": sklearn_loop}
    timed = best_of(args.repeats, runs, device=args.device)
    (t_model, result), (t_steps, _), (t_estimator, _) = timed["model"], timed["steps"], timed["estimator"]
    t_sklearn, (sk_centers, sk_iters) = timed["scikit-learn"]
    gap = np.abs(result.centers.cpu().numpy() - sk_centers).max()
    same_iters = float((result.n_iter.cpu().numpy() == sk_iters).mean())

    print(machine(args.device))
    print(f"{args.tasks} tasks of n={args.n} d={args.d} k={args.k}, {args.iterations} iterations, {args.dtype}, same k-means++ starts")
    print(f"  ktframe model, one batched call        {t_model * 1e3:9.1f} ms   {t_sklearn / t_model:7.1f}x faster than the loop")
    print(f"  the same, its steps one by one         {t_steps * 1e3:9.1f} ms   {t_sklearn / t_steps:7.1f}x faster than the loop")
    print(f"  ktframe TransformerKMeans.fit (batched) {t_estimator * 1e3:9.1f} ms   {t_sklearn / t_estimator:7.1f}x faster than the loop")
    print(f"  scikit-learn KMeans, a loop of fits    {t_sklearn * 1e3:9.1f} ms")
    print(f"  max |center gap| ktframe vs scikit-learn: {gap:.1e}")
    print(
        f"  iterations per task: ktframe {result.n_iter.float().mean():.2f}, scikit-learn {sk_iters.mean():.2f} on average; equal in {same_iters:.0%} of tasks"
    )


if __name__ == "__main__":
    main()
