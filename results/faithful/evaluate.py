"""Every evaluation behind the authors'-form tables of docs/results.md ("As the authors evaluate"),
one at a time, in order of importance; each is skipped when its eval.json exists, so that the
script goes on where it stopped. From the repository root:

    nice python results/faithful/evaluate.py            # run what is missing
    python results/faithful/evaluate.py --list          # the `ktframe eval` command of each, and whether it is done

Each evaluation is the ``ktframe eval`` command that ``--list`` prints, run in this one process
(the kernels compile once). All at n = 512 from random starts, 320 tasks, 20 steps:

- ``paper/``, ``paper-none/``, ``families/FAMILY/``, ``fig9/``, ``fig10a/``, ``fig10b/``: the
  authors' form, each seed's checkpoint on tasks of its own (``eval.seed_per_run=true``);
- ``shared/``: one set of tasks for every seed (ktframe's form): the new log-normal family for
  every ``paper`` seed, and for each other task setting one checkpoint, for Lloyd with
  re-seeding, which does not depend on the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path("results", "faithful")
CHEAP = ["eval.ns=[512]", "eval.inits=[random]"]
AUTHORS = [*CHEAP, "eval.seed_per_run=true"]
SEEDS = range(10)


def _sweep_runs(sweep: str) -> list[tuple[Path, dict[str, str]]]:
    """The finished runs of a committed sweep (those holding a checkpoint) and their settings."""
    folder = Path("results", "sweeps", sweep)
    jobs = json.loads((folder / "multirun.json").read_text())["jobs"]
    return [(folder / str(job["index"]), job["swept"]) for job in jobs if (folder / str(job["index"]) / "checkpoints" / "best.ckpt").is_file()]


# The settings that each sweep varies, and how a folder names them (d4-lambda10.0-onehot, k16-none, ...).
AXES = {
    "fig9": [("data.d", "d"), ("optim.loss_lambda", "lambda"), ("model.embedding", "")],
    "fig10a": [("data.k", "k"), ("model.embedding", "")],
    "fig10b": [("data.d", "d"), ("model.embedding", "")],
}


def _setting(sweep: str, swept: dict[str, str], axes: int | None = None) -> str:
    """A sweep run's setting as a folder name, of its first ``axes`` axes (all: None)."""
    return "-".join(prefix + swept[key] for key, prefix in AXES[sweep][:axes])


def jobs() -> list[tuple[Path, str, list[str]]]:
    """(output folder, checkpoint or run folder, overrides) of every evaluation, most needed first."""
    found: list[tuple[Path, str, list[str]]] = []
    found += [(OUT / "paper" / f"seed{s}", f"results/paper-seed{s}.ckpt", AUTHORS) for s in SEEDS]
    found += [
        (OUT / "shared" / family / "seed0", "results/paper-seed0.ckpt", [*CHEAP, f"eval.family={family}"])
        for family in ("gaussian", "cauchy", "gumbel", "laplace", "lognormal-noise")
    ]
    for sweep in ("fig10b", "fig10a", "fig9"):  # Lloyd with re-seeding on each task setting's shared tasks: one run each
        firsts = {}
        for run, swept in _sweep_runs(sweep):
            firsts.setdefault(_setting(sweep, swept, 1), run)  # the first axis (d or k) sets the tasks
        found += [(OUT / "shared" / sweep / setting / "seed0", str(run), CHEAP) for setting, run in firsts.items()]
    found += [(OUT / "shared" / "lognormal" / f"seed{s}", f"results/paper-seed{s}.ckpt", [*CHEAP, "eval.family=lognormal"]) for s in SEEDS]
    found += [(OUT / "families" / "lognormal" / f"seed{s}", f"results/paper-seed{s}.ckpt", [*AUTHORS, "eval.family=lognormal"]) for s in SEEDS]
    found += [(OUT / "paper-none" / f"seed{s}", f"results/paper-none-seed{s}.ckpt", AUTHORS) for s in SEEDS]
    for sweep in ("fig10b", "fig10a", "fig9"):
        found += [(OUT / sweep / _setting(sweep, swept) / f"seed{swept['trainer.seed']}", str(run), AUTHORS) for run, swept in _sweep_runs(sweep)]
    for family in ("cauchy", "gumbel", "laplace"):
        found += [(OUT / "families" / family / f"seed{s}", f"results/paper-seed{s}.ckpt", [*AUTHORS, f"eval.family={family}"]) for s in SEEDS]
    return found


def command(out: Path, checkpoint: str, overrides: list[str]) -> str:
    quoted = " ".join(f'"{o}"' if "[" in o else o for o in overrides)
    return f"ktframe eval {checkpoint} {quoted} --out {out.as_posix()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print each evaluation's command and whether it is done; run nothing")
    args = parser.parse_args()
    os.chdir(ROOT)
    planned = jobs()
    if args.list:
        for out, checkpoint, overrides in planned:
            print(("done  " if (out / "eval.json").is_file() else "to do ") + command(out, checkpoint, overrides))
        return 0
    from ktframe.evaluation.evaluate import evaluate_checkpoint

    for i, (out, checkpoint, overrides) in enumerate(planned, start=1):
        if (out / "eval.json").is_file():
            continue
        started = time.monotonic()
        evaluate_checkpoint(checkpoint, overrides, out)
        (out / "eval.png").unlink()  # the numbers are in eval.json; the tables' pictures come from the reports
        print(f"[{i}/{len(planned)}] {time.monotonic() - started:.0f} s: {command(out, checkpoint, overrides)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
