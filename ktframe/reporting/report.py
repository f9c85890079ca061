"""Every training run below a folder, aggregated into mean ± spread (``ktframe report``).

A run is any folder holding ``summary.json`` (written by ``ktframe fit``): its final validation
metrics come from there and, when the run has been evaluated, the objective per step from
``eval/eval.json``. A folder holding ``eval.json`` alone (``ktframe eval CHECKPOINT --out DIR``:
say, checkpoints of several seeds evaluated on another distribution) counts as a run with an
evaluation and no validation metrics. Runs differ by seed; a reader needs the mean, the spread over runs and how sure
the mean is, so every number comes with its sample standard deviation and a 95 % Student-t
interval (there are usually only a handful of runs, too few for a normal interval). The paired
differences that each evaluation reports (``versus``: the model against every baseline, task by
task) are pooled over runs and sets of tasks by :mod:`ktframe.reporting.paired`.

Runs whose configs differ in more than their seeds, names and the way they ran or logged (a 3 000-step
run beside 20-step ones, two learning rates) are never pooled unsaid: the report is also given per
setting of the keys in which they differ, and names those keys (``differing``), as ``--by`` would.

A value that is not a finite number (a diverged run's NaN) counts as missing: it is left out of
the mean, and ``n`` / ``runs`` say how many values were used. Runs whose evaluation of one
(init, n, method) has a different number of steps are refused with one line, rather than silently
dropped from the mean: they were evaluated under different settings and belong in separate reports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from ktframe.core.errors import InputError
from ktframe.core.io import check_writable, claim_folder, write_atomically
from ktframe.core.names import canonical
from ktframe.reporting import curves as training_curves
from ktframe.reporting import paired

SUMMARY = "summary.json"
CONFIG = "config.yaml"
EVAL = Path("eval", "eval.json")
OUTPUTS = ("report.json", "report.md", "report.png", "training.png")
PICTURES = OUTPUTS[2:]

Key = tuple[str, int, "int | None", str]  # (init, n, k, method) of an evaluation; k None in an eval.json of one k that predates eval.ks
Curves = dict[Key, list[float | None]]  # the mean log objective at every step; None: not finite


def find_runs(root: Path) -> list[Path]:
    """Every folder at or below ``root`` that holds a summary.json, or an eval.json outside a run
    folder's eval/ (an evaluation written with ``ktframe eval --out``), sorted by path."""
    if not root.exists():
        raise InputError(f"{root}: no such folder; expected a run folder or a folder holding run folders")
    if not root.is_dir():
        raise InputError(f"{root}: not a folder; expected a run folder or a folder holding run folders")
    runs = {path.parent for path in root.rglob(SUMMARY) if path.is_file()}
    their_own = {run / EVAL for run in runs}
    evaluations = {path.parent for path in root.rglob(EVAL.name) if path.is_file() and path not in their_own}
    if not runs | evaluations:
        raise InputError(f"no runs (no {SUMMARY} or {EVAL.name}) below {root}; expected folders written by ktframe fit or ktframe eval --out")
    return sorted(runs | evaluations)


def _eval_file(run: Path) -> Path:
    """Where a run keeps its evaluation: eval/eval.json in a training run, eval.json in an evaluation's folder."""
    return run / EVAL if (run / SUMMARY).is_file() else run / EVAL.name


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a file that cannot be read or parsed is named in one line."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc}); expected a readable file") from None
    except ValueError as exc:  # bad UTF-8 or bad JSON
        raise InputError(f"{path}: not valid JSON ({exc}); expected the file ktframe writes there") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: holds a JSON {type(value).__name__}; expected a JSON object")
    return value


def _number(value: Any, path: Path, where: str) -> float | None:
    """``value`` as a float, or None when it is not finite (counted as missing); anything that is
    not a number means a broken file."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{path}: {where} is a {type(value).__name__}; expected a number")
    return float(value) if math.isfinite(value) else None


def _run_metrics(path: Path) -> dict[str, float | None]:
    """The ``val/`` metrics of one run's summary.json: its final validation."""
    metrics = _read_json(path).get("metrics")
    if not isinstance(metrics, dict):
        raise InputError(f'{path}: no "metrics" object; expected the summary.json ktframe fit writes')
    return {name: _number(value, path, f"metrics[{name!r}]") for name, value in metrics.items() if name.startswith("val/")}


def _run_evaluation(path: Path) -> tuple[Curves, list[paired.Difference]]:
    """One run's eval.json: per (init, n, k, method) its mean log objective at every evaluation step
    (a baseline reported at convergence only, ``final``, as a curve of that one value), and its
    paired differences (``versus``), each with the setting's baselines that identify its tasks."""
    evaluation = _read_json(path)
    settings = evaluation.get("settings")
    if not isinstance(settings, list):
        raise InputError(f'{path}: no "settings" list; expected the eval.json ktframe eval writes')
    curves: Curves = {}
    differences: list[paired.Difference] = []
    for i, setting in enumerate(settings):
        where = f"settings[{i}]"
        if (
            not isinstance(setting, dict)
            or not isinstance(setting.get("init"), str)
            or type(setting.get("n")) is not int
            or not isinstance(setting.get("log_objective"), dict)
            or type(setting.get("k", 0)) is not int
            or not isinstance(setting.get("final", {}), dict)
            or not isinstance(setting.get("versus", {}), dict)
        ):
            raise InputError(
                f"{path}: {where} is not an object with init (text), n and k (integers), log_objective, final and versus; expected the eval.json ktframe eval writes"
            )
        setting_key = (canonical(setting["init"]), setting["n"], setting.get("k"))  # kmeans++ in older files
        for method, values in setting["log_objective"].items():
            if not isinstance(values, list) or not values:
                raise InputError(f"{path}: {where}.log_objective[{method!r}] is not a list of numbers; expected one value per step")
            curves[(*setting_key, canonical(method))] = [_number(v, path, f"{where}.log_objective[{method!r}]") for v in values]
        for method, value in setting.get("final", {}).items():
            curves[(*setting_key, method)] = [_number(value, path, f"{where}.final[{method!r}]")]
        differences += _setting_differences(path, evaluation.get("tasks"), setting, where, setting_key, curves)
    return curves, differences


def _setting_differences(path: Path, tasks: Any, setting: dict[str, Any], where: str, key: tuple, curves: Curves) -> list[paired.Difference]:
    """The paired differences of one setting (``key``: init, n, k) of an eval.json that evaluated
    ``tasks`` tasks per setting; none in one that predates ``versus``."""
    versus = setting.get("versus", {})
    if not versus:
        return []
    if type(tasks) is not int or tasks < 1:
        raise InputError(f'{path}: "tasks" is {tasks!r}; expected the number of tasks each setting was evaluated on (an integer ≥ 1)')
    baselines = {canonical(method): curves[(*key, canonical(method))] for method in setting["log_objective"] if method not in versus}
    found = []
    for method, others in versus.items():
        if not isinstance(others, dict):
            raise InputError(f"{path}: {where}.versus[{method!r}] is a {type(others).__name__}; expected an object of other methods")
        for other, difference in others.items():
            at = f"{where}.versus[{method!r}][{other!r}]"
            if not isinstance(difference, dict) or not {"mean", "sem"} <= difference.keys():
                raise InputError(f"{path}: {at} is not an object with mean and sem; expected the eval.json ktframe eval writes")
            mean = _number(difference["mean"], path, f"{at}.mean")
            sem = None if difference["sem"] is None else _number(difference["sem"], path, f"{at}.sem")  # None: one task
            found.append(paired.Difference(key, canonical(method), canonical(other), mean, sem, tasks, baselines))
    return found


def describe(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (ddof=1) and 95 % Student-t interval of the mean; one value
    has no spread (std 0.0) and no interval (None). Beside them the median, least and greatest
    value: the authors report the median over their seeds and its range (``--stat median``)."""
    n = len(values)
    mean = float(np.mean(values))
    order = {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}
    if n < 2:
        return {"mean": mean, "std": 0.0, "n": n, "ci95": None, **order}
    std = float(np.std(values, ddof=1))
    # the t quantile, as scipy.stats.t.ppf computes it, without the second that importing scipy.stats takes
    half = float(special.stdtrit(n - 1, 0.975)) * std / math.sqrt(n)
    return {"mean": mean, "std": std, "n": n, "ci95": [mean - half, mean + half], **order}


def _aggregate_metrics(runs: list[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    """Per metric, in order of first appearance: ``describe`` over the runs with a finite value."""
    names = dict.fromkeys(name for metrics in runs for name in metrics)
    values = {name: [m[name] for m in runs if m.get(name) is not None] for name in names}
    return {name: describe(found) for name, found in values.items() if found}


def _aggregate_eval(runs: list[tuple[Path, Curves]]) -> list[dict[str, Any]]:
    """One row per (init, n, k, method), in order of first appearance: the final step over runs, and
    the whole curve's mean and std. Curves with a non-finite value are left out."""
    grouped: dict[Key, list[tuple[Path, list[float]]]] = {}
    for path, curves in runs:
        for key, curve in curves.items():
            seen = grouped.setdefault(key, [])  # the first appearance fixes the row's place, finite or not
            finite = [value for value in curve if value is not None]
            if len(finite) < len(curve):
                continue
            if seen and len(seen[0][1]) != len(finite):
                first, length = seen[0][0], len(seen[0][1]) - 1
                raise InputError(
                    f"{path}: init={key[0]}, n={key[1]}, k={key[2]}, {key[3]} has {len(finite) - 1} steps but {first} has {length}; "
                    "expected runs evaluated with the same eval.steps (report on them separately)"
                )
            seen.append((path, finite))
    return [_eval_row(key, [curve for _, curve in seen]) for key, seen in grouped.items() if seen]


def _eval_row(key: Key, curves: list[list[float]]) -> dict[str, Any]:
    final = describe([curve[-1] for curve in curves])
    steps = np.array(curves)
    std = steps.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(steps.shape[1])
    return {
        "init": key[0],
        "n": key[1],
        "k": key[2],
        "method": key[3],
        "mean": final["mean"],
        "std": final["std"],
        "runs": final["n"],
        "ci95": final["ci95"],
        "median": final["median"],
        "min": final["min"],
        "max": final["max"],
        "curve": {
            "mean": steps.mean(axis=0).tolist(),
            "std": std.tolist(),
            "median": np.median(steps, axis=0).tolist(),
            "min": steps.min(axis=0).tolist(),
            "max": steps.max(axis=0).tolist(),
        },
    }


# Config keys in which the runs of one experiment differ by design (their seeds and names, where
# and on how many devices or threads they ran, how they logged): runs that differ in these alone
# are pooled.
POOLED = ("name", "run_id", "root", "resume", "preset", "trainer.seed", "data.seed", "data.num_workers", "trainer.progress_bar", "trainer.threads")
POOLED += ("trainer.accelerator", "trainer.devices", "trainer.strategy", "trainer.num_nodes", "eval.after_fit")
POOLED_SECTIONS = ("logger.",)
ABSENT = None  # a run folder without config.yaml (an evaluation's folder) has no setting


def _config(run: Path) -> dict[str, Any] | None:
    """A run's config.yaml as dotted keys and their values (lists as tuples); None without one."""
    import yaml

    path = run / CONFIG
    if not path.is_file():
        return None
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); expected the config.yaml that ktframe fit writes in a run folder") from None
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for name, value in node.items():
                walk(value, f"{prefix}{name}.")
        else:
            flat[prefix[:-1]] = tuple(node) if isinstance(node, list) else node

    walk(config if isinstance(config, dict) else {}, "")
    return flat


def differing_keys(configs: list[dict[str, Any] | None]) -> list[str]:
    """The config keys, other than :data:`POOLED` ones, to which the runs that have them give
    more than one value (a key some runs have not, as older runs lack newer keys, counts only
    among those that have it)."""
    values: dict[str, set] = {}
    for config in (c for c in configs if c is not None):
        for key, value in config.items():
            if key not in POOLED and not key.startswith(POOLED_SECTIONS):
                values.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def _setting(run: Path, config: dict[str, Any] | None, keys: list[str], given: list[str]) -> tuple:
    """The values of the dotted config ``keys`` in a run's config; the ``given`` ones (``--by``)
    must be there, the others may be absent (:data:`ABSENT`)."""
    values = []
    for key in keys:
        if key in given and (config is None or key not in config):
            what = "has no config.yaml" if config is None else f"the config has no key {key}"
            raise InputError(f"{run / CONFIG}: {what}; expected --by keys of the runs' config, e.g. optim.loss_lambda,data.d")
        values.append(ABSENT if config is None else config.get(key, ABSENT))
    return tuple(values)


def _read_run(run: Path) -> dict[str, Any]:
    """What a report takes from one run folder, each file read and checked once: the final
    validation metrics, the evaluation's curves and the training history (None where absent)."""
    summary, evaluation = run / SUMMARY, _eval_file(run)
    return {
        "metrics": _run_metrics(summary) if summary.is_file() else None,
        "eval": (evaluation, *_run_evaluation(evaluation)) if evaluation.is_file() else None,
        "history": training_curves.read_history(run),
    }


def _aggregate(root: Path, runs: list[Path], read: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    """The aggregates over ``runs``, from what :func:`_read_run` found in each (``read``)."""
    metrics = [read[run]["metrics"] for run in runs if read[run]["metrics"] is not None]
    evaluations = [read[run]["eval"] for run in runs if read[run]["eval"] is not None]
    histories = [read[run]["history"] for run in runs if read[run]["history"] is not None]
    return {
        "runs": len(runs),
        "paths": [run.relative_to(root).as_posix() for run in runs],
        "metrics": _aggregate_metrics(metrics),
        "eval": _aggregate_eval([(path, curves) for path, curves, _ in evaluations]),
        "versus": paired.pool([differences for _, _, differences in evaluations]),
        "training": {"curves": training_curves.pool(histories), "summary": training_curves.summary(histories)} if histories else None,
    }


def build_report(root: Path, by: list[str] | None = None, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The report of every run below ``root`` and of each group of runs that share the values of
    the dotted config keys ``by`` (a sweep's settings, its seeds pooled) and of every key in which
    the runs' configs differ otherwise (:func:`differing_keys`, named in ``differing``); every file
    is read and checked before anything is written, so that a broken one stops the report with
    nothing behind. ``progress(done, total)`` hears of each run read."""
    runs = find_runs(root)
    read, configs = {}, {}
    for done, run in enumerate(runs, start=1):  # each once, whatever the number of groups it is in
        read[run], configs[run] = _read_run(run), _config(run)
        if progress is not None:
            progress(done, len(runs))
    report = _aggregate(root, runs, read)
    given = list(by or [])
    differing = [key for key in differing_keys(list(configs.values())) if key not in given]
    keys = [*given, *differing]
    if keys:
        groups: dict[tuple, list[Path]] = {}
        for run in runs:
            groups.setdefault(_setting(run, configs[run], keys, given), []).append(run)
        report["by"], report["differing"] = keys, differing
        report["groups"] = [
            {"setting": dict(zip(keys, (list(v) if isinstance(v, tuple) else v for v in key))), **_aggregate(root, groups[key], read)}
            for key in sorted(groups, key=lambda key: [training_curves.setting_order(v) for v in key])
        ]
    return report


def _interval(ci95: list[float] | None) -> str:
    return "—" if ci95 is None else f"[{ci95[0]:.4f}, {ci95[1]:.4f}]"


# What each table cell shows of a :func:`describe` (``ktframe report --stat``): ktframe's mean ± std
# over runs, or the authors' median over their seeds with its range.
STATS = {"mean": "mean ± std", "median": "median [min, max]"}


def _mean_std(s: dict[str, Any], stat: str = "mean") -> str:
    """A :func:`describe` as "mean ± std" (or "median [min, max]"); one value (no interval) alone, as it has no spread."""
    if s["ci95"] is None:
        return f"{s[stat]:.4f}"
    return f"{s['mean']:.4f} ± {s['std']:.4f}" if stat == "mean" else f"{s['median']:.4f} [{s['min']:.4f}, {s['max']:.4f}]"


def markdown(report: dict[str, Any], root: Path, stat: str = "mean") -> str:
    """Two tables a reader can paste: the final validation metrics and the evaluation's last step,
    each cell the ``stat`` over runs (:data:`STATS`)."""
    plural = "s" if report["runs"] != 1 else ""
    lines = [
        f"# ktframe report: {report['runs']} run{plural} in {root}",
        "",
        "Runs: " + ", ".join(f"`{path}`" for path in report["paths"]),
        "",
        *(_differing_note(report) if report.get("differing") else []),
        "## Final validation metrics (summary.json)",
        "",
    ]
    if report["metrics"]:
        lines += [f"| metric | {STATS[stat]} | 95 % interval | n |", "|---|---|---|---|"]
        lines += [f"| {name} | {_mean_std(s, stat)} | {_interval(s['ci95'])} | {s['n']} |" for name, s in report["metrics"].items()]
    else:
        lines.append("No finite val/ metric was found (an evaluation folder, from ktframe eval --out, has none).")
    lines += ["", "## Evaluation: mean log objective at the last step (a run's eval/eval.json, an evaluation folder's eval.json)", ""]
    if report["eval"]:
        lines += [f"| init | n | k | method | {STATS[stat]} | 95 % interval | runs |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['init']} | {r['n']} | {_k(r)} | {r['method']} | {_mean_std(r, stat)} | {_interval(r['ci95'])} | {r['runs']} |" for r in report["eval"]]
    else:
        lines.append(f"No evaluation was found: no run holds {EVAL.as_posix()} (write one with `ktframe eval CHECKPOINT`).")
    lines += _difference_table("Evaluation: paired differences at the last step (eval.json's versus)", [([], row) for row in report["versus"]], [], stat)
    if report.get("groups"):
        lines += _group_tables(report, stat)
    lines += training_curves.markdown(report)
    return "\n".join(lines)


def _differing_note(report: dict[str, Any]) -> list[str]:
    """Which config keys the runs differ in, and what that does to the tables."""
    keys = report["differing"]
    values = {key: list(dict.fromkeys(str(group["setting"][key]) for group in report["groups"])) for key in keys}
    named = "; ".join(f"{key}: {', '.join(seen)}" for key, seen in values.items())
    return [
        f"**The runs' configs differ** ({named}): each setting is reported on its own below (By {', '.join(report['by'])});",
        "the tables over every run pool the settings.",
        "",
    ]


def _group_tables(report: dict[str, Any], stat: str = "mean") -> list[str]:
    """One row per group: its setting, its runs, each final metric (and each evaluated method at
    the last step) as mean ± std (or ``stat``) over the group's runs."""
    by, groups = report["by"], report["groups"]
    cell = lambda s: _mean_std(s, stat) if s else "—"  # noqa: E731
    names = list(report["metrics"])
    lines = [
        "",
        f"## By {', '.join(by)}: final validation metrics",
        "",
        "| " + " | ".join([*by, "runs", *names]) + " |",
        "|" + "---|" * (len(by) + 1 + len(names)),
    ]
    for group in groups:
        values = [str(group["setting"][key]) for key in by]
        lines.append("| " + " | ".join([*values, str(group["runs"]), *(cell(group["metrics"].get(name)) for name in names)]) + " |")
    rows = [(group, row) for group in groups for row in group["eval"]]
    if rows:
        lines += [
            "",
            f"## By {', '.join(by)}: evaluation at the last step",
            "",
            "| " + " | ".join([*by, "init", "n", "k", "method", STATS[stat], "runs"]) + " |",
        ]
        lines.append("|" + "---|" * (len(by) + 6))
        for group, row in rows:
            values = [str(group["setting"][key]) for key in by]
            lines.append("| " + " | ".join([*values, row["init"], str(row["n"]), _k(row), row["method"], cell(row), str(row["runs"])]) + " |")
    differences = [([str(group["setting"][key]) for key in by], row) for group in groups for row in group["versus"]]
    return lines + _difference_table(f"By {', '.join(by)}: paired differences at the last step", differences, by, stat)


def _difference_table(title: str, rows: list[tuple[list[str], dict[str, Any]]], keys: list[str], stat: str = "mean") -> list[str]:
    """A section of pooled paired differences (:func:`paired.pool`), each row led by its values of
    ``keys`` (a group's setting), with ``stat="median"`` the median [min, max] of the runs' own
    differences beside; nothing when no evaluation reported any."""
    if not rows:
        return []
    spread = ["median [min, max] over runs"] if stat == "median" else []
    columns = [*keys, "init", "n", "k", "method", "− other", "mean ± SE", "95 % interval", *spread, "runs", "task sets", "tasks"]
    lines = [
        "",
        f"## {title}",
        "",
        "method − other on the same tasks, task by task; the mean over the runs evaluated on one set of tasks, then over the sets;",
        "± its standard error over the tasks (within a set at most the runs' mean standard error, the sets independent); a normal 95 % interval.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for lead, r in rows:
        cells = [*lead, r["init"], str(r["n"]), _k(r), r["method"], r["versus"], f"{r['mean']:+.4f} ± {r['sem']:.4f}"]
        cells += [f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]"]
        cells += [f"{r['median']:+.4f} [{r['min']:+.4f}, {r['max']:+.4f}]"] if stat == "median" else []
        cells += [str(r["runs"]), str(r["task_sets"]), str(r["tasks"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _k(row: dict[str, Any]) -> str:
    """A row's k, or a dash for an eval.json that predates eval.ks (its k is the checkpoint's)."""
    return "—" if row["k"] is None else str(row["k"])


def figure_png(report: dict[str, Any], root: Path, stat: str = "mean") -> bytes | None:
    """The objective per step of every method, mean over runs with a ± std band (``stat="median"``:
    the median with the range), one subplot per (init, n); PNG bytes, or None when no run was evaluated. Rendered in memory, so that the file is
    written with the others, after everything has been computed."""
    if not report["eval"]:
        return None
    from ktframe.reporting.figures import LABELS, plt, png  # pyplot on the Agg backend; imported here, so that bad input is answered without waiting for it

    settings = list(dict.fromkeys((row["init"], row["n"], row["k"]) for row in report["eval"]))
    cols = min(3, len(settings))
    fig, axes = plt.subplots(math.ceil(len(settings) / cols), cols, figsize=(5.5 * cols, 4 * math.ceil(len(settings) / cols)), squeeze=False)
    # one colour per method in every panel (a horizontal line would not take the next one of the cycle)
    colours = {method: f"C{i % 10}" for i, method in enumerate(dict.fromkeys(row["method"] for row in report["eval"]))}
    for ax, (init, n, k) in zip(axes.flat, settings):
        for row in (r for r in report["eval"] if (r["init"], r["n"], r["k"]) == (init, n, k)):
            curve = row["curve"]
            mean = np.array(curve[stat])
            low, high = (mean - np.array(curve["std"]), mean + np.array(curve["std"])) if stat == "mean" else (np.array(curve["min"]), np.array(curve["max"]))
            label, colour = f"{LABELS.get(row['method'], row['method'])} ({row['runs']} runs)", colours[row["method"]]
            if len(mean) == 1:  # a baseline reported at convergence: its level, dashed
                ax.axhline(mean[0], linestyle="--", color=colour, label=label)
                continue
            steps = np.arange(len(mean))
            ax.plot(steps, mean, marker="o", markersize=3, color=colour, label=label)
            ax.fill_between(steps, low, high, color=colour, alpha=0.2)
        ax.set(title=f"init={init}, n={n}" + ("" if k is None else f", k={k}"), xlabel="step", ylabel="mean log objective")
        ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
        ax.legend(fontsize="small")
    for ax in axes.flat[len(settings) :]:
        ax.axis("off")
    fig.suptitle(f"objective per step, {stat} over the runs in {root} (band: {'± std' if stat == 'mean' else 'min to max'})")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # half an inch kept for the title, whatever the rows
    return png(fig)


def pictures(report: dict[str, Any], root: Path, stat: str = "mean") -> dict[str, bytes | None]:
    """report.png (the evaluation per step, its ``stat`` over runs) and training.png (the training
    curves), each None where no run has what it draws."""
    return {"report.png": figure_png(report, root, stat), "training.png": training_curves.figure_png(report, root)}


def write(out: Path, report: dict[str, Any], text: str, pngs: dict[str, bytes | None], force: bool = False) -> list[Path]:
    """Write report.json, report.md and the pictures that are not None into ``out`` (claimed as
    report's: a new folder, or with ``force`` its earlier one or another), each one atomically; in
    report's own folder a picture of an earlier report that this one has not (no evaluation, no
    training history) is removed, so that it never shows a figure of other runs."""
    check_writable(out, OUTPUTS)
    own = claim_folder(out, "report", force=force)
    paths = [out / "report.json", out / "report.md"]
    write_atomically(paths[0], [json.dumps(report, indent=2, allow_nan=False)])
    write_atomically(paths[1], [text])
    for name in PICTURES:
        picture, png = out / name, pngs.get(name)
        if png is None:
            if own:
                picture.unlink(missing_ok=True)
        else:
            write_atomically(picture, png)
            paths.append(picture)
    return paths
