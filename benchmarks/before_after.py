"""This checkout's figures against another checkout's (the code before a change), in one run.

Benchmarks (1), (2), (3) and (5) of docs/performance.md — the estimator and the bare model against
scikit-learn, many small tasks, a training step, ``ktframe cluster`` — and the estimator and bare
model in a process of their own (ktframe_alone.py), each run as its own process from each checkout
(its own script, its own ktframe and plugins on ``PYTHONPATH``; a script the other checkout lacks,
which takes only the public API, is this checkout's, run on the other's ktframe), the two
checkouts taking turns round by round and in alternating order (A B, B A, ...), so that a slow
spell of a shared machine falls on both. Every figure is printed as the median of its rounds for
each checkout, with its range, the ratio after / before of the medians, and the ratio paired by
round: the geometric mean over the rounds of each round's after / before, with its 95 %
t-interval, which says how far the machine's noise leaves the ratio open. A ratio against the
competing tool is taken within one process, which cancels most of the machine's load. Not a test.

    python benchmarks/before_after.py ../ktframe-before            # each script's default sizes
    python benchmarks/before_after.py ../ktframe-before --quick --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import scipy.stats

HERE = Path(__file__).resolve().parent
# Per script: its arguments with --quick, and the figures read off its output, (label, pattern of
# one number); a pattern that matches once per setting (lloyd_vs_sklearn's) is labelled by setting.
BENCHMARKS = {
    "lloyd_vs_sklearn.py": (
        ["--settings", "50000,32,100", "50000,2,16", "--repeats", "7"],
        [
            ("model, ms / iteration", r"ktframe\s+([\d.]+) ms / iteration"),
            ("fit, ms / iteration", r"ktframe fit\s+([\d.]+) ms / iteration"),
            ("scikit-learn, ms / iteration", r"scikit-learn\s+([\d.]+) ms / iteration"),
            ("model / scikit-learn", r"ktframe / scikit-learn:\s+([\d.]+)x"),
            ("fit / scikit-learn", r"fit / scikit-learn:\s+([\d.]+)x"),
        ],
    ),
    "many_small_tasks.py": (
        ["--tasks", "256", "--repeats", "7"],
        [
            ("model, ms", r"one batched call\s+([\d.]+) ms"),
            ("steps one by one, ms", r"steps one by one\s+([\d.]+) ms"),
            ("fit, ms", r"TransformerKMeans.fit \(batched\)\s+([\d.]+) ms"),
            ("scikit-learn loop, ms", r"a loop of fits\s+([\d.]+) ms"),
            ("model: faster by", r"one batched call\s+[\d.]+ ms\s+([\d.]+)x"),
            ("fit: faster by", r"\(batched\)\s+[\d.]+ ms\s+([\d.]+)x"),
        ],
    ),
    "train_step_vs_naive.py": (
        ["--batch", "8", "--steps", "3"],
        [
            ("ktframe step, ms", r"ktframe learned layer:\s+([\d.]+) ms"),
            ("naive step, ms", r"naive cdist \+ softmax:\s+([\d.]+) ms"),
            ("naive / ktframe", r"ratio naive / ktframe:\s+([\d.]+)x"),
        ],
    ),
    "ktframe_alone.py": (
        ["--repeats", "7"],
        [
            ("fit alone, ms", r"TransformerKMeans\.fit\s+([\d.]+) ms"),
            ("model alone, ms", r"bare model\s+([\d.]+) ms"),
        ],
    ),
    "cluster_cli.py": (
        ["--n", "200000", "--rounds", "1"],
        [
            ("ktframe cluster, s", r"ktframe cluster \(\w+\)\s+median\s+([\d.]+) s"),
            ("loadtxt + scikit-learn, s", r"loadtxt \+ scikit-learn\s+median\s+([\d.]+) s"),
            ("ktframe / scikit-learn", r"ktframe / scikit-learn:\s+([\d.]+)x"),
        ],
    ),
}
SETTING = r"^n=(\d+) d=(\d+) k=(\d+)"


def paired(before: list[float], after: list[float]) -> str:
    """The geometric mean of the rounds' ratios after / before, with its 95 % t-interval."""
    logs = [math.log(a / b) for b, a in zip(before, after)]
    mean = statistics.mean(logs)
    if len(logs) < 2:
        return f"{math.exp(mean):5.2f}"
    half = scipy.stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return f"{math.exp(mean):5.2f} [{math.exp(mean - half):.2f}, {math.exp(mean + half):.2f}]"


def run(checkout: Path, script: str, arguments: list[str], threads: int | None) -> dict[str, float]:
    """One run of ``script`` from ``checkout`` (on ``threads`` threads, if given): its figures by label."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "plugins")])}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    folder = checkout / "benchmarks" if (checkout / "benchmarks" / script).exists() else HERE
    done = subprocess.run([sys.executable, script, *arguments], cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{script} failed in {checkout}:\n{done.stderr[-3000:]}")
    settings = [" ".join(f"{name}={value}" for name, value in zip("ndk", found)) for found in re.findall(SETTING, done.stdout, re.M)]
    figures = {}
    for label, pattern in BENCHMARKS[script][1]:
        values = [float(value) for value in re.findall(pattern, done.stdout)]
        if not values:
            sys.exit(f"{script} in {checkout} printed no {label!r}:\n{done.stdout}")
        for i, value in enumerate(values):
            figures[f"{label} ({settings[i]})" if len(values) > 1 else label] = value
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the other checkout of ktframe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (see BENCHMARKS)")
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS), help="these scripts only")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both (PyTorch's threads, and so the kernels')")
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": HERE.parent}
    scripts = args.only or list(BENCHMARKS)
    seen: dict[str, dict[str, dict[str, list[float]]]] = {script: {name: {} for name in checkouts} for script in scripts}
    start = time.perf_counter()
    for round_ in range(args.rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(checkouts)[::-1]
        for script in scripts:
            for name in order:
                for label, value in run(checkouts[name], script, BENCHMARKS[script][0] if args.quick else [], args.threads).items():
                    seen[script][name].setdefault(label, []).append(value)
        print(f"round {round_ + 1} of {args.rounds} done after {time.perf_counter() - start:.0f} s", file=sys.stderr)
    threads = "" if args.threads is None else f", OMP_NUM_THREADS={args.threads}"
    print(
        f"before: {checkouts['before']}\nafter:  {checkouts['after']}\n{args.rounds} rounds{threads}, medians [range]; after / before: of the medians,"
        " and paired by round (geometric mean [95 % interval])"
    )
    for script in scripts:
        print(f"\n{script} {' '.join(BENCHMARKS[script][0]) if args.quick else '(default sizes)'}")
        for label, before in seen[script]["before"].items():
            after = seen[script]["after"][label]
            b, a = statistics.median(before), statistics.median(after)
            span = "  ".join(f"{statistics.median(v):10.2f} [{min(v):.2f}-{max(v):.2f}]" for v in (before, after))
            print(f"  {label:<48} {span}   {a / b:5.2f}   {paired(before, after)}")


if __name__ == "__main__":
    main()
