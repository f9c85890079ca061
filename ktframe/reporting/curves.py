"""Training curves for ``ktframe report``: the training loss and the validation ratio against the
step, as each run's history holds them (``csv/metrics.csv``, which every run keeps whatever its
``logger.kind``), pooled over
the runs of a setting as the median and the interquartile range at every step — the form of the
paper's Figures 9 and 10, where a handful of seeds per setting make a mean ± std band misleading.

The training loss is one batch's loss every ``trainer.log_every`` steps: noisy, so each run's is
averaged over windows of steps (at most :data:`MAX_POINTS` windows per curve) before the runs are
pooled. A run that stopped early adds to the steps it reached; each point says how many runs it pools.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from ktframe.core.errors import InputError

HISTORY = Path("csv", "metrics.csv")
LOSS, RATIO = "train/loss", "val/ratio"
MAX_POINTS = 200

History = dict[str, tuple[np.ndarray, np.ndarray]]  # metric → (steps, values) of one run


def read_history(run: Path) -> History | None:
    """Per metric (LOSS, RATIO): the steps at which ``run`` logged it and the values logged; None
    when the run has no csv/metrics.csv (a run of a ktframe that kept none beside W&B)."""
    path = run / HISTORY
    if not path.is_file():
        return None
    try:
        with path.open(newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); expected the metrics.csv of the run's CSV logger") from None
    if rows and "step" not in rows[0]:
        raise InputError(f"{path}: has no step column; expected the metrics.csv of the run's CSV logger")
    history: History = {}
    for metric in (LOSS, RATIO):
        pairs = []
        for line, row in enumerate(rows, start=2):
            value = row.get(metric)
            if value in (None, ""):
                continue
            try:
                pairs.append((int(row["step"]), float(value)))
            except (TypeError, ValueError):
                raise InputError(f"{path}: line {line}: step {row['step']!r}, {metric} {value!r}; expected a whole step and a number") from None
        if pairs:
            steps, values = zip(*pairs)
            history[metric] = (np.array(steps), np.array(values))
    return history


def _windowed(steps: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` averaged over the windows ``[w·width, (w+1)·width)`` of steps, each at its last step."""
    window = steps // width
    ends, where = np.unique(window, return_inverse=True)
    return (ends + 1) * width - 1, np.bincount(where, weights=values) / np.bincount(where)


def pool(histories: list[History]) -> dict[str, dict[str, list]]:
    """Per metric: at every step that some run logged, the median, 25th and 75th percentiles over
    the runs with a finite value there, and how many those are. Empty without histories."""
    pooled: dict[str, dict[str, list]] = {}
    for metric in (LOSS, RATIO):
        curves = [history[metric] for history in histories if metric in history]
        if not curves:
            continue
        if metric == LOSS:
            width = max(1, math.ceil((max(int(steps.max()) for steps, _ in curves) + 1) / MAX_POINTS))
            curves = [_windowed(steps, values, width) for steps, values in curves]
        grid = np.unique(np.concatenate([steps for steps, _ in curves]))
        table = np.full((len(curves), len(grid)), np.nan)
        for row, (steps, values) in zip(table, curves):
            row[np.searchsorted(grid, steps)] = values
        table[~np.isfinite(table)] = np.nan
        counts = np.isfinite(table).sum(axis=0)
        keep = counts > 0
        q25, median, q75 = np.nanpercentile(table[:, keep], [25, 50, 75], axis=0)
        pooled[metric] = {
            "step": grid[keep].tolist(),
            "median": median.tolist(),
            "q25": q25.tolist(),
            "q75": q75.tolist(),
            "runs": counts[keep].tolist(),
        }
    return pooled


def summary(histories: list[History]) -> dict[str, Any] | None:
    """Of the validation ratio: each run's last and lowest value, pooled as the median and the
    interquartile range, and the last step reached; None when no run logged it."""
    curves = [history[RATIO] for history in histories if RATIO in history]
    if not curves:
        return None
    last = np.array([values[-1] for _, values in curves])
    lowest = np.array([np.nanmin(values) if np.isfinite(values).any() else np.nan for _, values in curves])

    def spread(values: np.ndarray) -> list[float] | None:
        finite = values[np.isfinite(values)]
        return np.percentile(finite, [25, 50, 75]).tolist() if len(finite) else None

    return {"runs": len(curves), "last_step": max(int(steps[-1]) for steps, _ in curves), "last": spread(last), "lowest": spread(lowest)}


def _groups(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's --by groups, or all of its runs as one group of no setting."""
    return report.get("groups") or [{"setting": {}, "training": report.get("training")}]


def markdown(report: dict[str, Any]) -> list[str]:
    """A table of :func:`summary` per group of runs (or over all of them), under a heading."""
    by = report.get("by") or []
    rows = [group for group in _groups(report) if group["training"] and group["training"]["summary"]]
    lines = ["", f"## Training curves ({HISTORY.as_posix()}): the validation ratio, median [25 %, 75 %] over runs", ""]
    if not rows:
        return [*lines, f"No run holds {HISTORY.as_posix()} with val/ratio (every run of ktframe fit keeps it, whatever its logger)."]
    lines += ["| " + " | ".join([*by, "runs", "last step", "val/ratio at the last step", "lowest val/ratio"]) + " |", "|" + "---|" * (len(by) + 4)]
    for group in rows:
        s = group["training"]["summary"]
        cells = [str(s["runs"]), str(s["last_step"]), _quartiles(s["last"], s["runs"]), _quartiles(s["lowest"], s["runs"])]
        lines.append("| " + " | ".join([*(str(group["setting"][key]) for key in by), *cells]) + " |")
    return lines


def _quartiles(q: list[float] | None, runs: int) -> str:
    """Median [25 %, 75 %]; one run's value alone, as it has no spread."""
    if q is None:
        return "—"
    return f"{q[1]:.4f}" if runs == 1 else f"{q[1]:.4f} [{q[0]:.4f}, {q[2]:.4f}]"


def setting_order(value: Any) -> tuple:
    """Numbers in numeric order (d = 8 before d = 16), before anything else in text order."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if number else (1, 0, str(value))


def figure_png(report: dict[str, Any], root: Path) -> bytes | None:
    """The training loss and the validation ratio against the step, the median over runs with the
    interquartile range as a band. With ``--by`` keys, one line per value of the last key, one column
    per value of the one before, and a pair of rows (loss, ratio) per value of the keys before those
    (``--by data.d,optim.loss_lambda,model.embedding``: the paper's Figure 9, both of its panels).
    PNG bytes, or None when no run has a training history."""
    by = report.get("by") or []
    groups = [group for group in _groups(report) if group["training"] and group["training"]["curves"]]
    if not groups:
        return None
    from ktframe.reporting.figures import plt, png  # pyplot on the Agg backend

    line_key, column_key, row_keys = (by[-1] if by else None), (by[-2] if len(by) > 1 else None), by[:-2]
    values = lambda key: sorted(dict.fromkeys(g["setting"][key] for g in groups), key=setting_order) if key else [None]  # noqa: E731
    lines, columns = values(line_key), values(column_key)
    blocks = list(dict.fromkeys(tuple(g["setting"][key] for key in row_keys) for g in groups))  # the groups come in setting order, the row keys first
    metrics = [m for m in (LOSS, RATIO) if any(m in g["training"]["curves"] for g in groups)]
    rows = [(block, metric) for block in blocks for metric in metrics]
    fig, axes = plt.subplots(len(rows), len(columns), figsize=(max(6.4, 4.2 * len(columns)), 3.2 * len(rows)), squeeze=False, sharex=True, layout="constrained")
    colours = {value: f"C{i % 10}" for i, value in enumerate(lines)}
    for (block, metric), row_axes in zip(rows, axes):
        for column, ax in zip(columns, row_axes):
            for group in groups:
                setting = group["setting"]
                if tuple(setting[key] for key in row_keys) != block or (column_key and setting[column_key] != column):
                    continue
                curve = group["training"]["curves"].get(metric)
                if curve is None:
                    continue
                value = setting[line_key] if line_key else None
                most = max(curve["runs"])  # the runs this line pools (fewer at the steps some runs did not reach)
                runs = f"{most} run{'s' if most != 1 else ''}"
                label = f"{line_key}={value} ({runs})" if line_key else runs
                ax.plot(curve["step"], curve["median"], color=colours[value], linewidth=1.0, label=label)
                ax.fill_between(curve["step"], curve["q25"], curve["q75"], color=colours[value], alpha=0.2)
            if metric == RATIO:
                ax.axhline(1.0, color="black", linestyle=":", linewidth=0.8)  # one Lloyd step
            ax.set_yscale("log", base=2)
            context = ", ".join(f"{key}={value}" for key, value in zip(row_keys, block))
            ax.set_title(", ".join(part for part in (context, f"{column_key}={column}" if column_key else "") if part), fontsize="medium")
            ax.set_ylabel("training loss" if metric == LOSS else "val/ratio (to one Lloyd step)")
            ax.grid(alpha=0.4)
            if ax.get_legend_handles_labels()[0]:  # a setting of a sweep that no run has reached yet draws nothing
                ax.legend(fontsize="small")
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    fig.suptitle(f"training curves of the runs in {root}\nmedian over runs, band 25–75 %")
    return png(fig, dpi=100)
