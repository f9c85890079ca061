"""The paper's evaluation protocol for a trained checkpoint.

Unseen tasks; the trained layer applied ``steps`` times with re-embedding; beside it, from the
same initial centers, Lloyd's algorithm twice: ``lloyd`` keeps an emptied cluster's center,
``lloyd-reseed`` re-seeds it at a random point of its task as the authors' evaluation does
(:mod:`ktframe.evaluation.reseed`); and, seeded on their own, plain k-means++ + Lloyd and greedy
k-means++ + Lloyd. Figure of merit: the mean over tasks of log Σ_i min_j ‖x_i − c_j‖², at
every step. Initial centers random data points or k-means++; any n; any distribution family; any
k the model takes (``eval.ks``: the trained k, or any up to its maximum for a model trained on a
``data.k_range``). ``eval.baselines`` adds methods that run to convergence on their own
(:mod:`ktframe.clustering.baselines`), reported by their final objective alone. ``eval.lloyd_last=N``
adds ``model+lloyd``: the model's first steps, then N of Lloyd's, which the hand-built
construction takes exactly (its γ = ∞ limit) — the same number of steps in all. ``eval.swaps=T``
adds ``model+swaps`` (``model+lloyd+swaps`` with ``eval.lloyd_last``): T swaps
(:mod:`ktframe.fast.swaps`) after the model's final centers, each followed by ``eval.steps``
Lloyd iterations, and the same swaps after Lloyd's as ``lloyd+swaps``: what they do without the
model; both reported by their final objective alone.

A run folder is evaluated at its best checkpoint or, with ``eval.checkpoint=last``, its last
(the authors'); ``eval.seed_per_run=true`` draws each run's tasks from its own seed (the
authors' per-seed task sets), where by default every run is evaluated on the same tasks. Paths in
eval.json are relative: to the run folder for its ``eval/``, else to the eval.json's own folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from ktframe.clustering import baselines
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.io import check_writable, relative_path, write_atomically
from ktframe.core.tasks import TaskDistribution
from ktframe.evaluation.reseed import lloyd_reseed
from ktframe.fast import lloyd as fast
from ktframe.fast.swaps import swap
from ktframe.learning.checkpoint_io import check_dimensions, load_weights, model_weights, read_checkpoint
from ktframe.learning.config import check_keys, load_config, merge, parse_overrides, to_dict
from ktframe.learning.data import draw
from ktframe.learning.module import model_from_config
from ktframe.plugin.build import get_variant

METHODS = ("model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++")
MODEL_METHODS = ("model", "model+lloyd", "model+swaps", "model+lloyd+swaps")  # the checkpoint's; every other method is compared with them (``versus``)
SWAPPED_LLOYD = "lloyd+swaps"


def load_checkpoint(path: str | Path) -> tuple[dict, torch.nn.Module]:
    """The training config and the trained model of a Lightning checkpoint, read with
    ``weights_only=True``: a file that would need to run code to load is refused."""
    _, config, model = _load(path)
    return config, model


def _load(path: str | Path) -> tuple[dict, dict, torch.nn.Module]:
    """The checkpoint itself, and what :func:`load_checkpoint` returns."""
    checkpoint = read_checkpoint(path)
    config = checkpoint["hyper_parameters"]["config"]
    model = model_from_config(config)
    load_weights(model, model_weights(checkpoint), path)
    check_dimensions(checkpoint, model, path)
    return checkpoint, config, model.eval()


def checkpoint_of(path: str | Path, overrides: Sequence[str] = ()) -> Path:
    """The checkpoint file that ``ktframe eval PATH`` evaluates: ``PATH`` itself, or for a run
    folder its ``checkpoints/best.ckpt`` or ``last.ckpt``, as ``eval.checkpoint`` among the
    overrides says (else as the run's config.yaml says, else best)."""
    path = Path(path)
    asked = parse_overrides(overrides).get("eval")
    asked = asked.get("checkpoint") if isinstance(asked, dict) else None
    if not path.is_dir():
        if asked is not None:
            raise InputError(
                f"eval.checkpoint={asked} chooses the checkpoint of a run folder, but {path} is a checkpoint file; "
                f"expected a run folder (ktframe eval RUN eval.checkpoint={asked}) or no eval.checkpoint"
            )
        return path
    which = asked if asked is not None else _run_setting(path, "checkpoint", "best")
    if which not in ("best", "last"):
        raise InputError(f"config key 'eval.checkpoint' must be best or last; got {which!r}")
    checkpoint = path / "checkpoints" / f"{which}.ckpt"
    if not checkpoint.is_file():
        raise InputError(f"{path}: holds no checkpoints/{which}.ckpt; expected a run folder written by ktframe fit (eval.checkpoint=best or last)")
    return checkpoint


def _run_setting(run: Path, key: str, default: Any) -> Any:
    """The run's ``eval.KEY`` in its config.yaml, or ``default`` where it has none (an older run)."""
    config = run / "config.yaml"
    if not config.is_file():
        return default
    settings = OmegaConf.to_container(OmegaConf.load(config)).get("eval") or {}
    return settings.get(key, default)


# Everything else was fixed by training: the model's shape, the data it was trained on. data.k
# at evaluation names the k to evaluate (eval.ks=[K]); the checkpoint's own data.k stays.
EVAL_OVERRIDES = ("eval.*", "data.family", "data.k")


def _check_eval_overrides(values: dict) -> None:
    for section, keys in values.items():
        for key in keys if isinstance(keys, dict) else [None]:
            name = f"{section}.{key}" if key is not None else section
            if section != "eval" and name not in EVAL_OVERRIDES:
                raise InputError(f"{name} cannot be changed at evaluation: the checkpoint fixes it; expected overrides of {' or '.join(EVAL_OVERRIDES)}")


def _k_as_ks(values: dict) -> dict:
    """The overrides with ``data.k=K`` turned into ``eval.ks=[K]`` (unless eval.ks is given too),
    so that the checkpoint's data.k, the k it was trained and validated at, stays as it was."""
    data = values.get("data")
    if not isinstance(data, dict) or "k" not in data:
        return values
    k = data.pop("k")
    if type(k) is not int or k < 1:
        raise InputError(f"config key 'data.k' must be an integer >= 1; got {k!r}")
    if not data:
        del values["data"]
    if isinstance(values.get("eval"), dict):
        values["eval"].setdefault("ks", [k])
    elif "eval" not in values:
        values["eval"] = {"ks": [k]}
    return values


def eval_config(config: dict, overrides: list[str]) -> dict:
    """The checkpoint's eval settings, with ``eval.*`` / ``data.family`` / ``data.k`` overrides
    applied; with ``eval.task_preset``, the data keys that describe its tasks taken from that
    preset (a model evaluated on tasks of another distribution than it was trained on)."""
    values = parse_overrides(overrides)
    check_keys(values)
    _check_eval_overrides(values)
    merged = to_dict(merge(config, _k_as_ks(values)))
    preset = merged["eval"].get("task_preset")
    if preset is not None:
        tasks = load_config([f"preset={preset}"]).data
        merged["data"].update({name: to_dict(tasks)[name] for name in TASK_KEYS if name in tasks})
    return merged


# The data keys that describe a task distribution (ktframe.core.tasks.TaskDistribution): those an
# evaluation on another preset's tasks takes from it; the model's d and the ks stay the checkpoint's.
TASK_KEYS = tuple(field.name for field in dataclasses.fields(TaskDistribution))


def eval_ks(model: torch.nn.Module, config: dict) -> list[int]:
    """The k of every setting (``eval.ks``; null: the checkpoint's data.k), each checked against
    what the model takes and against every n of ``eval.ns``, before anything runs."""
    data, ev = config["data"], config["eval"]
    ks = list(ev["ks"] or [data["k"]])
    any_k = model.embedding.any_k
    for k in ks:
        if any_k and k > model.k:
            raise InputError(f"eval.ks holds k={k} but the checkpoint's model takes at most k={model.k}; expected every k <= {model.k}")
        if not any_k and k != data["k"]:
            raise InputError(
                f"eval.ks holds k={k} but the checkpoint was trained for k={data['k']} only; expected k={data['k']} "
                "(a model for many k is trained with data.k_range=[lo,hi])"
            )
        for n in ev["ns"]:
            if n < k:
                raise InputError(f"eval.ns holds n={n}, fewer points than k={k}; expected every n >= k")
    return ks


# What a derived seed is for, so that the tasks, the baselines' restarts, lloyd-reseed's draws and
# each run's own tasks and the swaps' draws are independent streams.
_TASKS, _BASELINES, _RESEEDS, _RUNS, _SWAPS = 1, 2, 3, 4, 5


def _derived_seed(purpose: int, *numbers: int) -> int:
    """A 32-bit seed (scikit-learn's random_state takes no more) mixed from ``purpose`` and
    ``numbers`` by numpy's SeedSequence, so that neighbouring values give unrelated streams."""
    return int(np.random.SeedSequence([purpose, *(v % 2**64 for v in numbers)]).generate_state(1)[0])


def task_seed(config: dict) -> int:
    """The seed of the evaluation's tasks: ``eval.seed``, or with ``eval.seed_per_run`` one mixed
    from it and the run's ``trainer.seed``, so that each run (seed) has tasks of its own."""
    ev = config["eval"]
    return _derived_seed(_RUNS, ev["seed"], config["trainer"]["seed"]) if ev.get("seed_per_run") else ev["seed"]


def baseline_seed(seed: int, n: int, k: int, task: int) -> int:
    """The seed every baseline gets for task ``task`` (0, 1, ...) of the settings of n points and k
    clusters under the task seed ``seed``: each task its own, reproducible from the report's settings."""
    return _derived_seed(_BASELINES, seed, n, k, task)


def reseed_seed(seed: int, n: int, k: int, task: int) -> int:
    """The seed of the generator from which ``lloyd-reseed`` draws task ``task``'s new centers."""
    return _derived_seed(_RESEEDS, seed, n, k, task)


def swapped_name(lloyd_last: int) -> str:
    """The name of the model's centers after the swaps: after ``model+lloyd``'s where there are
    those (``lloyd_last``), else after the model's."""
    return f"{'model+lloyd' if lloyd_last else 'model'}+swaps"


def _swapped_runs(ev: dict) -> dict[str, str]:
    """With ``eval.swaps``, the swapped methods, each with the run whose final centers it starts
    from: the model's (``model+lloyd``'s where there are those) and Lloyd's."""
    if not ev.get("swaps"):
        return {}
    return {swapped_name(ev["lloyd_last"]): "model+lloyd" if ev["lloyd_last"] else "model", SWAPPED_LLOYD: "lloyd"}


def _swapped(X: torch.Tensor, runs: dict[str, torch.Tensor], ev: dict, seed: int, n: int, k: int, start: int) -> dict[str, torch.Tensor]:
    """The log objectives ``(B,)`` of ``eval.swaps`` swaps after each run of
    :func:`_swapped_runs`, the draws of all from one seed."""
    draws = _derived_seed(_SWAPS, seed, n, k, start)
    return {
        method: swap(X, runs[run][:, -1].to(X.dtype), ev["swaps"], ev["steps"], torch.Generator().manual_seed(draws)).objective.log()
        for method, run in _swapped_runs(ev).items()
    }


def _task_generator(config: dict, n: int, k: int) -> torch.Generator:
    """The generator of a setting's tasks (and seedings), seeded alike for every init (so the first
    batch's tasks are the same; later ones follow each init's own draws). At the trained k it is
    seeded as it always was, so that a report without eval.ks keeps its numbers."""
    seed = task_seed(config)
    return torch.Generator().manual_seed(seed * 100_003 + n if k == config["data"]["k"] else _derived_seed(_TASKS, seed, n, k))


def _log_means(X: torch.Tensor, trajectory: torch.Tensor) -> torch.Tensor:
    """Per step: log of the objective of every task, ``(B, T + 1)``, in float64."""
    return torch.stack([fast.objective(X, trajectory[:, t].double()).log() for t in range(trajectory.shape[1])], dim=1)


def _finish_with_lloyd(X: torch.Tensor, trajectory: torch.Tensor, steps: int) -> torch.Tensor:
    """The model's ``trajectory`` ``(B, T + 1, k, d)`` with its last ``steps`` steps replaced by
    Lloyd's from the centers it had reached before them."""
    head = trajectory[:, : trajectory.shape[1] - steps]
    tail = fast.lloyd(X, head[:, -1], steps).trajectory[:, 1:].to(head.dtype)
    return torch.cat([head, tail], dim=1)


def _evaluate_setting(model: torch.nn.Module, config: dict, init: str, n: int, k: int, tasks_done: Callable[[int], None]) -> dict[str, Any]:
    """One setting: the mean log objective of every method at every step over ``eval.tasks``
    tasks of n points and k clusters, and of every baseline at its end (``final``); each batch's
    number of tasks is handed to ``tasks_done`` once it is evaluated. ``reseeded``: the tasks in
    which lloyd-reseed re-seeded a cluster."""
    data, ev = config["data"], config["eval"]
    variant = get_variant(config["model"]["variant"])
    data_cfg = OmegaConf.create(data)
    generator, seed, reseeded = _task_generator(config, n, k), task_seed(config), 0
    methods = (*METHODS, *(["model+lloyd"] if ev["lloyd_last"] else []), *(["reference"] if variant.reference is not None else []))
    sums = {method: torch.zeros(ev["steps"] + 1, dtype=torch.float64) for method in methods}
    finals = [*ev["baselines"], *_swapped_runs(ev)]
    last: dict[str, list[torch.Tensor]] = {method: [] for method in (*methods, *finals)}  # per task, at the end
    for start in range(0, ev["tasks"], ev["batch_size"]):
        batch = min(ev["batch_size"], ev["tasks"] - start)
        X, C0, _ = draw(data_cfg, batch, generator, n=n, k=k, family=ev["family"] or data["family"], init=init)
        plain = reference.kmeans_plusplus(X, k, generator)
        greedy = reference.kmeans_plusplus(X, k, generator, greedy=True)
        reseed, emptied = lloyd_reseed(X, C0, ev["steps"], [reseed_seed(seed, n, k, start + i) for i in range(batch)])
        reseeded += int(emptied.sum())
        runs = {
            "model": model(X, C0, n_steps=ev["steps"], reembed=True).trajectory,
            "lloyd": fast.lloyd(X, C0, ev["steps"]).trajectory,
            "lloyd-reseed": reseed,
            "k-means++": fast.lloyd(X, plain, ev["steps"]).trajectory,
            "greedy-k-means++": fast.lloyd(X, greedy, ev["steps"]).trajectory,
        }
        if ev["lloyd_last"]:
            runs["model+lloyd"] = _finish_with_lloyd(X, runs["model"], ev["lloyd_last"])
        if variant.reference is not None:  # the classical algorithm the model's variant claims
            runs["reference"] = variant.run_reference(X, C0, ev["steps"], config["model"]["gamma"], config["model"].get("options")).trajectory
        X64 = X.double()
        for method, trajectory in runs.items():
            logs = _log_means(X64, trajectory)
            sums[method] += logs.sum(dim=0)
            last[method].append(logs[:, -1])
        seeds = [baseline_seed(seed, n, k, start + i) for i in range(batch)]
        for name in ev["baselines"]:
            last[name].append(fast.objective(X64, baselines.BASELINES[name](X64, k, seeds)).log())
        for name, logs in _swapped(X, runs, ev, seed, n, k, start).items():
            last[name].append(logs)
        tasks_done(batch)
    ends = {method: torch.cat(values) for method, values in last.items()}
    return {
        "init": init,
        "n": n,
        "k": k,
        "log_objective": {m: (s / ev["tasks"]).tolist() for m, s in sums.items()},
        "final": {name: float(ends[name].mean()) for name in finals},
        "versus": _versus(ends),
        "reseeded": reseeded,
    }


def _versus(ends: dict[str, torch.Tensor]) -> dict[str, dict[str, dict[str, float | None]]]:
    """For each of the model's methods against every other method: the mean over tasks of the
    difference of their log objectives at the end and the standard error of that mean. Both ran on
    the same tasks, so the difference is taken task by task (paired): how far apart two methods are
    on this many tasks, and how sure that is."""
    versus = {}
    for ours in (method for method in MODEL_METHODS if method in ends):
        versus[ours] = {}
        for other in (method for method in ends if method not in MODEL_METHODS):
            difference = ends[ours] - ends[other]
            sem = float(difference.std() / math.sqrt(len(difference))) if len(difference) > 1 else None
            versus[ours][other] = {"mean": float(difference.mean()), "sem": sem}
    return versus


@torch.no_grad()
def evaluate(model: torch.nn.Module, config: dict, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Every setting (init × n × k, k innermost) of the protocol, and the primary one: the
    checkpoint's data.k (else the first k), its training n (else the first n), the first init.
    ``progress(done, total)`` hears how many tasks of all settings are evaluated, after each batch."""
    data, ev = config["data"], config["eval"]
    ks = eval_ks(model, config)
    baselines.require(ev["baselines"])
    variant = get_variant(config["model"]["variant"])
    grid = [(init, n, k) for init in ev["inits"] for n in ev["ns"] for k in ks]
    done = 0

    def tasks_done(batch: int) -> None:
        nonlocal done
        done += batch
        if progress is not None:
            progress(done, len(grid) * ev["tasks"])

    settings = [_evaluate_setting(model, config, init, n, k, tasks_done) for init, n, k in grid]
    at_k = [s for s in settings if s["k"] == (data["k"] if data["k"] in ks else ks[0])]
    primary = next((s for s in at_k if s["n"] == data["n"]), at_k[0])
    return {
        "variant": variant.name,
        "reference": variant.classical if variant.reference is not None else None,
        "family": ev["family"] or data["family"],
        "tasks": ev["tasks"],
        "steps": ev["steps"],
        "task_seed": task_seed(config),
        "seed_per_run": bool(ev.get("seed_per_run")),
        "primary": {"init": primary["init"], "n": primary["n"], "k": primary["k"]},
        "log_objective": primary["log_objective"],
        "final": primary["final"],
        "versus": primary["versus"],
        "settings": settings,
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as a table, one row per setting (init, n, k): each method's mean log objective
    at the last step (and at step 1), the model's lead over Lloyd (and over lloyd-reseed, where
    the report has it), then each baseline's at its end. Reports written before k and baselines
    existed have neither: their k column is blank."""
    finals = list(report.get("final", {}))
    leads = [other for other in ("lloyd", "lloyd-reseed") if other in report["log_objective"]]
    lines = [
        *([f"variant {report['variant']}; reference: {report['reference']}"] if report.get("reference") else []),
        f"{report['tasks']} unseen {report['family']} tasks, {report['steps']} steps; mean log objective at the last step (and at step 1)"
        + (f"; {', '.join(finals)}: at their end only" if finals else ""),
        f"{'init':<9} {'n':>5} {'k':>4}  "
        + "  ".join(f"{m:>17}" for m in report["log_objective"])
        + "".join(f"  {f'model - {other} (± se)':>27}" for other in leads)
        + "".join(f"  {name:>10}" for name in finals),
    ]
    for s in report["settings"]:
        lo, final = s["log_objective"], s.get("final", {})
        cells = "  ".join(f"{lo[m][-1]:>8.4f} ({lo[m][1]:>6.3f})" for m in lo)
        baseline_cells = "".join(f"  {final[name]:>{max(10, len(name))}.4f}" for name in finals)
        lead_cells = "".join(f"  {_lead(s, other):>27}" for other in leads)
        lines.append(f"{s['init']:<9} {s['n']:>5} {s.get('k', ''):>4}  {cells}{lead_cells}{baseline_cells}")
    return "\n".join(lines)


def _lead(setting: dict[str, Any], other: str) -> str:
    """The model's lead over ``other`` at the end, with its standard error over tasks where the report has one."""
    lead = setting["log_objective"]["model"][-1] - setting["log_objective"][other][-1]
    sem = setting.get("versus", {}).get("model", {}).get(other, {}).get("sem")
    return f"{lead:+.4f}" + ("" if sem is None else f" ± {sem:.4f}")


# What ``ktframe eval`` writes into its folder; eval.json last, so that it marks a whole evaluation.
OUTPUTS = ("eval.png", "eval-by-k.png", "eval.json")


def relative_to_output(path: str | Path, folder: str | Path) -> str:
    """``path`` as eval.json records it: relative to the run folder for a run's ``eval/``, else
    to ``folder``, the eval.json's own; so that no machine's absolute path is written."""
    folder = Path(folder).resolve()
    return relative_path(path, folder.parent if folder.name == "eval" and (folder.parent / "config.yaml").is_file() else folder)


def default_out(path: str | Path) -> Path:
    """Where an evaluation of the checkpoint ``path`` goes when no folder is named: the run
    folder's ``eval/`` for a checkpoint in a run folder (``RUN/checkpoints/NAME.ckpt`` beside
    ``RUN/config.yaml``); else ``eval-NAME/`` in the current folder, never beside a checkpoint
    that belongs to no run."""
    resolved = Path(path).resolve()
    run = resolved.parent.parent
    if resolved.parent.name == "checkpoints" and (run / "config.yaml").is_file():
        return run / "eval"
    return Path(f"eval-{resolved.stem}")


def evaluate_checkpoint(
    path: str | Path, overrides: Sequence[str] = (), out: str | Path | None = None, progress: Callable[[int, int], None] | None = None
) -> tuple[dict[str, Any], Path]:
    """:func:`evaluate` a checkpoint (or a run folder's, :func:`checkpoint_of`), writing
    ``eval.json`` and ``eval.png`` into ``out``, and ``eval-by-k.png`` where several k were
    evaluated (:func:`~ktframe.reporting.figures.by_k_figure`); the report and the (first) picture's
    path. Without ``out``, into :func:`default_out`, where an earlier evaluation is never replaced:
    only a folder the caller names is written over. ``progress``: as :func:`evaluate`'s."""
    from ktframe.reporting import figures

    path = checkpoint_of(path, overrides)
    folder = Path(out) if out is not None else default_out(path)
    if out is None and (folder / "eval.json").exists():
        raise InputError(f"{folder / 'eval.json'}: holds an earlier evaluation; expected --out DIR for this one (or --out {folder} to replace it)")
    check_writable(folder, OUTPUTS)
    checkpoint, config, model = _load(path)
    report = evaluate(model, eval_config(config, list(overrides)), progress)
    report["checkpoint"] = relative_to_output(path, folder)
    report["checkpoint_step"] = checkpoint.get("global_step")
    primary = report["primary"]
    title = f"init={primary['init']}, n={primary['n']}, k={primary['k']}, {report['family']}"
    pictures = {"eval": figures.objective_figure(report["log_objective"], title)}
    if len({s["k"] for s in report["settings"]}) > 1:
        pictures["eval-by-k"] = figures.by_k_figure(report["settings"], f"{report['tasks']} {report['family']} tasks per k, {report['steps']} steps")
    try:
        written = figures.save(pictures, folder)
    except OSError as exc:  # the folder could not be made
        raise InputError(f"{exc.filename or folder}: cannot write ({exc.strerror or exc}); expected a writable folder with free space") from None
    write_atomically(folder / "eval.json", [json.dumps(report, indent=2)])
    return report, written[0]


def table_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The report as one row per setting, method and step: the columns and the rows of a table.
    A baseline has no steps (it runs to convergence): its one row per setting has step None
    (empty) and its final mean log objective."""
    columns = ["init", "n", "k", "method", "step", "log_objective"]
    rows = [
        [s["init"], s["n"], s.get("k"), method, step, value]
        for s in report["settings"]
        for method, values in s["log_objective"].items()
        for step, value in enumerate(values)
    ]
    rows += [[s["init"], s["n"], s.get("k"), name, None, value] for s in report["settings"] for name, value in s.get("final", {}).items()]
    return columns, rows
