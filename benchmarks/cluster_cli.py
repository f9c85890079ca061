"""``ktframe cluster`` end to end against numpy + scikit-learn on the same CSV, in one run.

Makes a CSV of a Gaussian mixture (a header row, ``n`` points, ``d`` columns, about 290 MB at the
default 10⁶ × 32) in a temporary folder, then times, each as its own process:

- ``ktframe cluster FILE --k K --layers L --out labels.csv`` (read, k-means++, L layers, write);
- ``np.loadtxt`` + ``KMeans(K, n_init=1, max_iter=L)`` + ``np.savetxt`` of the labels.

and prints both wall times, their ratio and both peak resident set sizes (each process is run
from a fresh helper that reads ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, so the figures
are not mixed). The two pipelines take turns for ``--rounds`` rounds, the first of each round
alternating, and each timed process comes right after an untimed one of the same pipeline: the
file is in the page cache for both, and neither pays for memory that the machine hands to a
process for the first time after the other freed it warm. The figure of each is the median of its
rounds. Not a test: nothing here asserts a time.

    python benchmarks/cluster_cli.py                  # n=1e6 d=32 k=100, 10 layers / iterations
    python benchmarks/cluster_cli.py --n 100000       # a smaller file
    python benchmarks/cluster_cli.py --dtype float32  # ktframe cluster --dtype float32
    python benchmarks/cluster_cli.py --rounds 5       # more rounds (default 3)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# runs ``argv`` as a child and prints its peak RSS in KiB (Linux ru_maxrss) on the last line
MEASURE = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
)

SKLEARN = """
import sys, warnings
import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
path, k, iters, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
X = np.loadtxt(path, delimiter=",", skiprows=1)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    km = KMeans(k, n_init=1, max_iter=iters, random_state=0).fit(X)
np.savetxt(out, km.labels_, fmt="%d", header="label", comments="")
print(f"inertia {km.inertia_:.6g}")
"""


def make_csv(path: Path, n: int, d: int, k: int, seed: int) -> None:
    """A mixture of ``k`` Gaussians, written block by block (``%.5f``: about 9 bytes a value)."""
    rng = np.random.default_rng(seed)
    means = rng.uniform(-10, 10, (k, d))
    with path.open("w") as handle:
        handle.write(",".join(f"x{j}" for j in range(d)) + "\n")
        for start in range(0, n, 100_000):
            m = min(100_000, n - start)
            block = means[rng.integers(k, size=m)] + rng.normal(0, 1, (m, d))
            np.savetxt(handle, block, fmt="%.5f", delimiter=",")


def timed(argv: list[str], cwd: Path) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) and output of ``argv`` run as a process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", MEASURE, *argv], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr}")
    *output, rss = done.stdout.strip().splitlines()
    return seconds, int(rss) * 1024, "\n".join(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--layers", type=int, default=10, help="ktframe layers = scikit-learn max_iter (default 10)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="ktframe cluster --dtype (default float64, as np.loadtxt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both pipelines, taking turns (default 3)")
    parser.add_argument("--folder", help="where to make the file (default: a temporary folder, removed afterwards)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        data = folder / "points.csv"
        start = time.perf_counter()
        make_csv(data, args.n, args.d, args.k, args.seed)
        print(
            f"n={args.n} d={args.d} k={args.k}, {args.layers} iterations; CSV {data.stat().st_size / 1e6:.0f} MB made in {time.perf_counter() - start:.0f} s; {os.cpu_count()} CPUs"
        )
        ktframe_cmd = [
            sys.executable,
            "-m",
            "ktframe.cli.main",
            "cluster",
            str(data),
            "--k",
            str(args.k),
            "--layers",
            str(args.layers),
            "--out",
            "labels.csv",
            "--dtype",
            args.dtype,
        ]
        sklearn_cmd = [sys.executable, "-c", SKLEARN, str(data), str(args.k), str(args.layers), "sklearn-labels.csv"]
        commands = {f"ktframe cluster ({args.dtype})": ktframe_cmd, "loadtxt + scikit-learn": sklearn_cmd}
        runs: dict[str, list[tuple[float, int, str]]] = {name: [] for name in commands}
        for round_ in range(args.rounds):
            for name in sorted(commands, reverse=round_ % 2 == 1):
                timed(commands[name], folder)  # untimed: the same pipeline warm before it is timed
                runs[name].append(timed(commands[name], folder))
            print(f"  round {round_ + 1}: " + ", ".join(f"{name} {runs[name][-1][0]:.1f} s" for name in commands))
        for name in ("labels.csv", "sklearn-labels.csv"):
            lines = sum(1 for _ in (folder / name).open())
            assert lines == args.n + 1, f"{name}: {lines} lines"
        medians = {}
        for name, results in runs.items():
            medians[name] = statistics.median(seconds for seconds, _, _ in results)
            peak = max(rss for _, rss, _ in results)
            print(f"  {name:28s} median {medians[name]:6.1f} s   peak RSS {peak / 2**30:5.2f} GiB   ({results[-1][2].strip()})")
        ours, theirs = medians.values()
        print(f"  ktframe / scikit-learn: {ours / theirs:.2f}x (medians of {args.rounds} rounds; below 1: ktframe is faster)")


if __name__ == "__main__":
    main()
