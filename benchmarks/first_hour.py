"""What a new user waits for in the first hour, each command in fresh processes, in one run.

1. ``ktframe fit`` (the README's main job, the quick preset) with ``trainer.max_steps=STEPS``
   under three thread settings, taking turns round by round: PyTorch's default (``trainer.threads``
   = the cores PyTorch would use), one thread (``trainer.threads=1``) and ktframe's choice (no
   setting: :func:`ktframe.training.console.thread_count`). Wall time of the whole command (its
   imports, W&B offline, the figures) and of its training alone (``summary.json``'s ``seconds``),
   the median over rounds, and their ratios to ktframe's choice. ``--full`` also times the main job
   itself, ``ktframe fit`` as the README runs it.
2. ``ktframe cluster`` on a CSV of 2 000 points in 2-D (k = 5), first with an empty kernel cache
   (``KTFRAME_CACHE_DIR`` a new folder), then again: a problem this small runs on PyTorch's own
   operations and waits for no compilation (``ktframe.kernels.jit.MIN_NUMBERS``). ``--large N``
   does the same for N points, above that size, where the first call compiles the kernels once.
3. The CPU time (user + system, of the child process) of ``ktframe --help``, of a usage error
   (``ktframe fit --trainer.max_steps=20``), of ``import torch`` and of ``import ktframe`` with
   the estimator (``from ktframe import TransformerKMeans``), the least of ``--rounds`` runs each.

Not a test: nothing here asserts a time. The machine's other work moves the figures; the ratios
within one run are what compares.

    python benchmarks/first_hour.py                      # 300 steps, 3 rounds
    python benchmarks/first_hour.py --steps 3000 --full  # the whole main job as well
    python benchmarks/first_hour.py --large 100000       # and a problem that compiles the kernels
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KTFRAME = [sys.executable, "-m", "ktframe.cli.main"]


def environment(**extra: str) -> dict[str, str]:
    """The benchmark's environment: no thread count set (the settings under test set their own),
    W&B offline and quiet about it."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KTFRAME_NO_KERNELS")}
    return {**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **extra}


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one child process, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 2):  # 2: the usage error timed on purpose
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def default_threads() -> int:
    """What PyTorch uses in a fresh process with no thread count set."""
    probe = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    return int(subprocess.run(probe, env=environment(), capture_output=True, text=True, check=True).stdout)


def fit_threads(folder: Path, steps: int, rounds: int, full: bool) -> None:
    torch_default = default_threads()
    settings = {f"PyTorch's default ({torch_default})": [f"trainer.threads={torch_default}"], "one thread": ["trainer.threads=1"], "ktframe's choice": []}
    walls: dict[str, list[float]] = {name: [] for name in settings}
    trains: dict[str, list[float]] = {name: [] for name in settings}
    for r in range(rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            run = f"r{r}-{len(walls[name])}-{name.split()[0].strip('(').lower()}"
            argv = [*KTFRAME, "--quiet", "fit", f"trainer.max_steps={steps}", "logger.mode=offline", f"root={folder / 'runs'}", f"name={run}", *settings[name]]
            wall, _ = timed(argv, folder, environment())
            walls[name].append(wall)
            trains[name].append(json.loads((folder / "runs" / run / "summary.json").read_text())["seconds"])
            print(f"  round {r + 1}: {name:<24} {wall:7.1f} s (training {trains[name][-1]:.1f} s)", flush=True)
    mine_wall, mine_train = statistics.median(walls["ktframe's choice"]), statistics.median(trains["ktframe's choice"])
    print(f"\nktframe fit trainer.max_steps={steps} (the quick preset), median of {rounds} rounds:")
    for name in settings:
        wall, train = statistics.median(walls[name]), statistics.median(trains[name])
        print(f"  {name:<24} {wall:7.1f} s, training {train:6.1f} s; {wall / mine_wall:5.2f}x and {train / mine_train:5.2f}x ktframe's choice")
    if full:
        wall, _ = timed([*KTFRAME, "--quiet", "fit", "logger.mode=offline", f"root={folder / 'runs'}", "name=main-job"], folder, environment())
        print(f"  the main job, `ktframe fit` (3 000 steps): {wall:.1f} s")


def cluster_calls(folder: Path, n: int, label: str) -> None:
    rng = np.random.default_rng(0)
    centers = rng.random((5, 2))
    points = centers[rng.integers(0, 5, n)] + rng.normal(0.0, 0.05, (n, 2))
    data = folder / f"points-{n}.csv"
    np.savetxt(data, points, delimiter=",", header="x,y", comments="")
    env = environment(KTFRAME_CACHE_DIR=str(folder / f"cache-{n}"))  # empty: nothing compiled yet
    argv = [*KTFRAME, "cluster", str(data), "--k", "5", "--out", str(folder / "labels.csv")]
    first, _ = timed(argv, folder, env)
    second, _ = timed(argv, folder, env)
    compiled = (folder / f"cache-{n}").exists()
    print(
        f"ktframe cluster, {n} points ({label}): first call {first:.1f} s, second {second:.1f} s, each a fresh process; kernels compiled: {'yes' if compiled else 'no'}"
    )


def startup(folder: Path, rounds: int) -> None:
    probes = {
        "ktframe --help": [*KTFRAME, "--help"],
        "ktframe fit --trainer.max_steps=20 (a usage error)": [*KTFRAME, "fit", "--trainer.max_steps=20"],
        "import torch": [sys.executable, "-c", "import torch"],
        "from ktframe import TransformerKMeans": [sys.executable, "-c", "from ktframe import TransformerKMeans"],
    }
    cpu = {name: min(timed(argv, folder, environment())[1] for _ in range(rounds)) for name, argv in probes.items()}
    print(f"\nCPU time (user + system), the least of {rounds} runs:")
    for name, seconds in cpu.items():
        print(f"  {name:<52} {seconds:5.2f} s")
    print(f"  import ktframe with its estimator, beyond import torch: {cpu['from ktframe import TransformerKMeans'] - cpu['import torch']:+.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="trainer.max_steps of the timed fits (default: 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the fits and of the start-up probes (default: 3)")
    parser.add_argument("--full", action="store_true", help="also time the main job itself (3 000 steps)")
    parser.add_argument("--large", type=int, default=None, metavar="N", help="also time ktframe cluster on N points (enough to compile the kernels)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        startup(folder, args.rounds)
        print()
        cluster_calls(folder, 2000, "below the kernels' size")
        if args.large:
            cluster_calls(folder, args.large, "above it")
        print()
        fit_threads(folder, args.steps, args.rounds, args.full)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
