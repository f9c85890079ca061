"""Multirun: ``ktframe fit -m KEY=a,b,c KEY2=x,y ...`` runs the cartesian product of the comma
lists, each combination a run of its own, gathered in one sweep folder.

As in Hydra, a value with a comma outside brackets and quotes is a sweep (``data.seed=0,1,2``, or
``data.seed=range(0,10)``); ``eval.ns=[64,128]`` is one list value. Every job's config is resolved
before anything starts, so a bad key or value in any of them is an error with nothing written.
Each job is its own ``ktframe fit`` process — so a DDP job launches its ranks as a single run
would, and a failing job cannot take the others down — with its output in ``JOB/fit.log``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ktframe.core.errors import InputError
from ktframe.core.io import write_atomically
from ktframe.learning.config import load_config, parse_overrides
from ktframe.training.folders import SWEEP_FILE, FolderLock, check_unused
from ktframe.training.relative import relative

# Keys each job sets for itself: sweeping them, or fixing one for every job, makes no sense.
_PER_JOB = ("name", "run_id", "root")
_RANGE = re.compile(r"range\((-?\d+),\s*(-?\d+)(?:,\s*(-?\d+))?\)")
# Variables a job must not inherit: they would give every job the same run id or folder.
_RUN_ENV = ("KTFRAME_RUN_ID", "KTFRAME_RUN_DIR", "KTFRAME_RESUME_FROM", "WANDB_RUN_ID")


@dataclass
class Job:
    index: int
    swept: dict[str, str]  # the swept keys' values of this job
    overrides: list[str]  # every override its `ktframe fit` gets
    run_dir: str
    status: str = "pending"  # pending, ok, failed
    returncode: int | None = None
    summary: dict = field(default_factory=dict)

    def label(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.swept.items()) or "(no sweep)"


@dataclass
class Sweep:
    name: str
    folder: Path
    jobs: list[Job]
    resuming: bool = False  # resume=auto: the sweep may go on in a folder that holds it


def split_values(item: str) -> tuple[str, list[str]] | None:
    """``KEY=a,b,c`` as ``(KEY, [a, b, c])``; None for a single value. Commas inside brackets,
    braces, parentheses or quotes do not split."""
    key, _, value = item.partition("=")
    if (match := _RANGE.fullmatch(value.strip())) is not None:
        start, stop, step = (int(g) if g is not None else None for g in match.groups())
        if step == 0:
            raise InputError(f"sweep {item!r}: range step must not be 0")
        values = [str(v) for v in range(start, stop, step or 1)]
        if not values:
            raise InputError(f"sweep {item!r}: the range is empty; expected range(start, stop[, step]) with values")
        return key, values
    parts, depth, quote, current = [], 0, None, ""
    for char in value:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    if not parts:
        return None
    parts.append(current)
    if any(not part.strip() for part in parts):
        raise InputError(f"sweep {item!r} has an empty value; expected KEY=a,b,c with no empty item")
    return key, [part.strip() for part in parts]


def refuse_sweeps(overrides: Sequence[str]) -> None:
    """Outside a multirun, a comma list is a mistake: say how to run it."""
    for item in overrides:
        if "=" in item and split_values(item) is not None:
            raise InputError(
                f"{item!r} is a sweep over several values; expected `ktframe fit -m {item}` to run each, or a list in brackets ([a,b]) for one list value"
            )


def plan(overrides: Sequence[str], new_name: Callable[[], str]) -> Sweep:
    """The jobs of ``overrides``, each config resolved and checked."""
    fixed, axes = [], []
    for item in overrides:
        if "=" not in item:
            raise InputError(f"override {item!r} is not of the form key=value (e.g. data.seed=0,1,2)")
        split = split_values(item)
        key = item.partition("=")[0]
        if split is None:
            fixed.append(item)
            continue
        if key in _PER_JOB:
            raise InputError(f"{key} cannot be swept: each job of a multirun has its own; expected a sweep of other keys")
        if any(existing == key for existing, _ in axes):
            raise InputError(f"{key} is swept twice; expected one comma list per key")
        axes.append(split)
    given = parse_overrides(fixed)
    if "run_id" in given:
        raise InputError("run_id cannot be fixed in a multirun: every job is a run of its own; leave it out")
    base = load_config(fixed)  # the preset and fixed values, checked once
    name = base.name or new_name()
    folder = Path(base.root) / name
    check_unused(folder, sweep=True, resuming=base.resume == "auto")
    per_job = [f"root={folder}"]
    if base.logger.group is None:
        per_job.append(f"logger.group={name}")
    if "progress_bar" not in (given.get("trainer") or {}):
        per_job.append("trainer.progress_bar=false")  # a job's output goes to a file
    fixed = [item for item in fixed if item.partition("=")[0] != "name"]
    jobs = []
    for index, combination in enumerate(itertools.product(*(values for _, values in axes))):
        swept = {key: value for (key, _), value in zip(axes, combination)}
        job_overrides = [*fixed, *(f"{key}={value}" for key, value in swept.items()), *per_job, f"name={index}"]
        load_config(job_overrides)  # every job's config is valid before any starts
        jobs.append(Job(index, swept, job_overrides, str(folder / str(index))))
    return Sweep(name, folder, jobs, resuming=base.resume == "auto")


def _record(sweep: Sweep) -> None:
    """multirun.json, its paths relative to the sweep folder (``root=`` overrides too), so that it holds no machine's."""
    jobs = [
        {
            **asdict(job),
            "overrides": [f"root={relative(o[5:], sweep.folder)}" if o.startswith("root=") else o for o in job.overrides],
            "run_dir": relative(job.run_dir, sweep.folder),
        }
        for job in sweep.jobs
    ]
    state = {"name": sweep.name, "folder": ".", "jobs": jobs}
    write_atomically(sweep.folder / SWEEP_FILE, [json.dumps(state, indent=2)])


def _environment(parallel: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _RUN_ENV}
    if parallel > 1 and "OMP_NUM_THREADS" not in env:  # jobs side by side share the cores
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // parallel))
    return env


def _finished(job: Job) -> dict | None:
    """With ``resume=auto``, the summary of a job whose run already ended as this job would end
    it (at its ``max_steps``, evaluated if ``eval.after_fit`` asks): resuming it would only load
    its last checkpoint, train no step and evaluate it again. None otherwise."""
    cfg = load_config(job.overrides)
    summary = Path(job.run_dir) / "summary.json"
    if cfg.resume != "auto" or not summary.is_file():
        return None
    done = json.loads(summary.read_text())
    if done.get("global_step", -1) < cfg.trainer.max_steps or (cfg.eval.after_fit and "eval" not in done):
        return None
    return done


def run(sweep: Sweep, parallel: int = 1, cli_flags: Sequence[str] = (), report: Callable[[str], None] = print) -> list[Job]:
    """Run every job (``parallel`` at a time), holding the sweep folder's lock; the failed ones."""
    with FolderLock(sweep.folder, "ktframe fit -m"):
        check_unused(sweep.folder, sweep=True, resuming=sweep.resuming)  # again, under the lock: no sweep ran here since plan() looked
        return _run(sweep, parallel, cli_flags, report)


def _run(sweep: Sweep, parallel: int, cli_flags: Sequence[str], report: Callable[[str], None]) -> list[Job]:
    _record(sweep)
    env = _environment(parallel)
    finished = itertools.count(1)  # next() of a count is atomic: jobs in threads report in turn

    def run_job(job: Job) -> Job:
        Path(job.run_dir).mkdir(parents=True, exist_ok=True)
        done = _finished(job)
        if done is None:
            command = [sys.executable, "-m", "ktframe.cli.main", *cli_flags, "fit", *job.overrides]
            with open(Path(job.run_dir) / "fit.log", "a") as log:  # a resumed job's log goes on
                job.returncode = subprocess.call(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
            summary = Path(job.run_dir) / "summary.json"
            job.status = "ok" if job.returncode == 0 and summary.is_file() else "failed"
            if job.status == "ok":
                job.summary = json.loads(summary.read_text())
        else:
            job.returncode, job.status, job.summary = 0, "ok", done
        outcome = f"best val/ratio {job.summary.get('best_val_ratio')}" if job.status == "ok" else f"FAILED (exit {job.returncode}; see {job.run_dir}/fit.log)"
        outcome += " (finished before: not run again)" if done is not None else ""
        report(f"[{next(finished)}/{len(sweep.jobs)}] job {job.index} {job.label()}: {outcome}")
        return job

    report(f"multirun {sweep.name}: {len(sweep.jobs)} runs in {sweep.folder}, {parallel} at a time")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(run_job, sweep.jobs))
    _record(sweep)
    return [job for job in sweep.jobs if job.status != "ok"]
