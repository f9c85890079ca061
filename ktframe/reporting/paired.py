"""Paired differences of methods, pooled over runs and over sets of tasks (``ktframe report``).

``ktframe eval`` runs every method on the same tasks and reports, per setting, the mean over tasks
of the model's log objective minus each other method's, with its standard error (``versus`` in
eval.json). Several checkpoints evaluated on one set of tasks share that set's noise: their
differences are averaged, and the standard error of that average is at most the average of theirs
(the errors are correlated, not independent). Sets of other tasks (another ``eval.seed``) are
independent, so pooling them shrinks the error as a larger set would. A run's tasks are recognised
by what does not depend on the model: the baselines' objectives, which the same tasks reproduce to
the last digits and other tasks do not.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

Z95 = 1.959963984540054  # the normal 97.5 % quantile: a set has hundreds of tasks


@dataclass(frozen=True)
class Difference:
    """One run's paired difference ``method`` − ``other`` at the last step of one setting."""

    setting: tuple[str, int, int | None]  # (init, n, k); k None in an eval.json that predates eval.ks
    method: str
    other: str
    mean: float | None  # None: not finite
    sem: float | None  # None: not finite, or one task
    tasks: int
    baselines: dict[str, list[float | None]]  # the setting's model-free curves: they identify its tasks


def same_tasks(a: Difference, b: Difference) -> bool:
    """Whether two runs' differences come from the same tasks: the same number of tasks and every
    baseline both ran agreeing at every step, to rounding."""
    common = a.baselines.keys() & b.baselines.keys()
    return (
        a.tasks == b.tasks
        and bool(common)
        and all(len(a.baselines[m]) == len(b.baselines[m]) and all(map(_close, a.baselines[m], b.baselines[m])) for m in common)
    )


def _close(x: float | None, y: float | None) -> bool:
    return x is None and y is None or x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def pool(runs: list[list[Difference]]) -> list[dict[str, Any]]:
    """One row per (init, n, k, method, other), in order of first appearance: the mean difference
    over the runs of each set of tasks, then over the sets weighted by their tasks, its standard
    error (bounded within a set, the sets independent) and 95 % interval; and the median, least
    and greatest of the runs' own differences (where each run has its own tasks, as the authors
    evaluate their seeds, the form of their tables). Runs whose difference is not finite are left out."""
    grouped: dict[tuple, list[list[Difference]]] = {}  # row → sets of tasks → the runs' differences
    for differences in runs:
        for d in differences:
            sets = grouped.setdefault((*d.setting, d.method, d.other), [])
            if d.mean is None or d.sem is None:
                continue
            found = next((s for s in sets if same_tasks(s[0], d)), None)
            if found is None:
                sets.append([d])
            else:
                found.append(d)
    return [_row(key, sets) for key, sets in grouped.items() if sets]


def _row(key: tuple, sets: list[list[Difference]]) -> dict[str, Any]:
    weights = [s[0].tasks for s in sets]
    means = [sum(d.mean for d in s) / len(s) for s in sets]
    errors = [sum(d.sem for d in s) / len(s) for s in sets]
    total = sum(weights)
    mean = sum(w * m for w, m in zip(weights, means)) / total
    sem = math.sqrt(sum((w * e) ** 2 for w, e in zip(weights, errors))) / total
    each = sorted(d.mean for s in sets for d in s)
    return {
        "init": key[0],
        "n": key[1],
        "k": key[2],
        "method": key[3],
        "versus": key[4],
        "mean": mean,
        "sem": sem,
        "ci95": [mean - Z95 * sem, mean + Z95 * sem],
        "median": statistics.median(each),
        "min": each[0],
        "max": each[-1],
        "runs": sum(len(s) for s in sets),
        "task_sets": len(sets),
        "tasks": total,
    }
