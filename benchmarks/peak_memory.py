"""Peak memory of the exact ``lloyd`` transformer at n = 10^6, d = 32, k = 100, beside scikit-learn's
KMeans on the same data, each measured in a fresh process (its peak resident set size), in one run.

``ktframe fit`` is ``TransformerKMeans(k, n_layers=iterations, init=C0, dtype="float32").fit(X)``,
what users call, from the same centers as the bare model and scikit-learn.

The data alone (n·d float32 = 128 MB) and the interpreter with torch loaded are measured too, in a
process that builds the data and stops, so that the figures can be read as "on top of that".

    python benchmarks/peak_memory.py
    python benchmarks/peak_memory.py --n 2000000
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import warnings

import torch
from common import machine

TOOLS = ("data only", "ktframe", "ktframe fit", "scikit-learn")


def child(tool: str, n: int, d: int, k: int, iterations: int) -> None:
    import ktframe
    from ktframe.core.tasks import mixture

    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(1, n, d, k, generator=generator, dtype=torch.float32)
    C0 = X[:, torch.randperm(n, generator=generator)[:k]].clone()
    if tool == "ktframe":
        model = ktframe.build_model("lloyd", d=d, k=k, n_layers=iterations, reset="identity", dtype=torch.float32)
        with torch.no_grad():
            model(X, C0)
    elif tool == "ktframe fit":  # what users call: the estimator, from the same centers
        ktframe.TransformerKMeans(k, n_layers=iterations, init=C0[0].numpy(), dtype="float32").fit(X[0].numpy())
    elif tool == "scikit-learn":
        from sklearn.cluster import KMeans
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            KMeans(k, algorithm="lloyd", init=C0[0].numpy(), n_init=1, max_iter=iterations, tol=0.0).fit(X[0].numpy())


def peak_mib(tool: str, args: argparse.Namespace) -> float:
    argv = [sys.executable, __file__, "--child", tool, "--n", str(args.n), "--d", str(args.d), "--k", str(args.k), "--iterations", str(args.iterations)]
    return float(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--child", choices=TOOLS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.d, args.k, args.iterations)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux: KiB
        return
    peaks = {tool: peak_mib(tool, args) for tool in TOOLS}
    print(machine())
    print(f"n={args.n} d={args.d} k={args.k}, float32, {args.iterations} iterations; peak resident memory of a fresh process")
    for tool, peak in peaks.items():
        extra = (
            "" if tool == "data only" else f"   (+{peak - peaks['data only']:7.0f} MiB over the data; {peak / peaks['scikit-learn']:.2f}x scikit-learn's peak)"
        )
        print(f"  {tool:<13} {peak:8.0f} MiB{extra}")


if __name__ == "__main__":
    main()
