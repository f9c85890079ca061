"""The paper's evaluation protocol for a trained checkpoint.

Unseen tasks; the trained layer applied ``steps`` times with re-embedding; beside it, from the
same initial centers, Lloyd's algorithm; and, seeded on their own, plain k-means++ + Lloyd and
greedy k-means++ + Lloyd. Figure of merit: the mean over tasks of log Σ_i min_j ‖x_i − c_j‖², at
every step. Initial centers random data points or k-means++; any n; any distribution family.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from ktframe.clustering import reference
from ktframe.clustering.datafile import write_atomically
from ktframe.errors import InputError
from ktframe.fast import lloyd as fast
from ktframe.plugin.variant import get_variant
from ktframe.training.checkpoint_io import load_weights, read_checkpoint
from ktframe.training.config import check_keys, merge, parse_overrides, to_dict
from ktframe.training.data import draw
from ktframe.training.module import model_from_config

METHODS = ("model", "lloyd", "kmeans++", "greedy-kmeans++")


def load_checkpoint(path: str | Path) -> tuple[dict, torch.nn.Module]:
    """The training config and the trained model of a Lightning checkpoint, read with
    ``weights_only=True``: a file that would need to run code to load is refused."""
    checkpoint = read_checkpoint(path)
    config = checkpoint["hyper_parameters"]["config"]
    state = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items() if key.startswith("model.")}
    model = model_from_config(config)
    load_weights(model, state, path)
    return config, model.eval()


# Everything else was fixed by training: the model's shape, the data it was trained on.
EVAL_OVERRIDES = ("eval.*", "data.family")


def _check_eval_overrides(values: dict) -> None:
    for section, keys in values.items():
        for key in keys if isinstance(keys, dict) else [None]:
            name = f"{section}.{key}" if key is not None else section
            if section != "eval" and name != "data.family":
                raise InputError(f"{name} cannot be changed at evaluation: the checkpoint fixes it; expected overrides of {' or '.join(EVAL_OVERRIDES)}")


def eval_config(config: dict, overrides: list[str]) -> dict:
    """The checkpoint's eval settings, with ``eval.*`` / ``data.family`` overrides applied."""
    values = parse_overrides(overrides)
    check_keys(values)
    _check_eval_overrides(values)
    return to_dict(merge(config, values))


def _log_means(X: torch.Tensor, trajectory: torch.Tensor) -> torch.Tensor:
    """Per step: log of the objective of every task, ``(B, T + 1)``, in float64."""
    return torch.stack([fast.objective(X, trajectory[:, t].double()).log() for t in range(trajectory.shape[1])], dim=1)


@torch.no_grad()
def evaluate(model: torch.nn.Module, config: dict) -> dict[str, Any]:
    data, ev = config["data"], config["eval"]
    family = ev["family"] or data["family"]
    data_cfg = OmegaConf.create(data)
    variant = get_variant(config["model"]["variant"])
    methods = (*METHODS, "reference") if variant.reference is not None else METHODS
    settings = []
    for init in ev["inits"]:
        for n in ev["ns"]:
            if n < data["k"]:
                raise InputError(f"eval.ns holds n={n}, fewer points than k={data['k']}; expected every n >= k")
            generator = torch.Generator().manual_seed(ev["seed"] * 100_003 + n)  # the same tasks for every init
            sums = {method: torch.zeros(ev["steps"] + 1, dtype=torch.float64) for method in methods}
            for start in range(0, ev["tasks"], ev["batch_size"]):
                batch = min(ev["batch_size"], ev["tasks"] - start)
                X, C0, _ = draw(data_cfg, batch, generator, n=n, family=family, init=init)
                plain = reference.kmeans_plusplus(X, data["k"], generator)
                greedy = reference.kmeans_plusplus(X, data["k"], generator, greedy=True)
                runs = {
                    "model": model(X, C0, n_steps=ev["steps"], reembed=True).trajectory,
                    "lloyd": fast.lloyd(X, C0, ev["steps"]).trajectory,
                    "kmeans++": fast.lloyd(X, plain, ev["steps"]).trajectory,
                    "greedy-kmeans++": fast.lloyd(X, greedy, ev["steps"]).trajectory,
                }
                if variant.reference is not None:  # the classical algorithm the model's variant claims
                    runs["reference"] = variant.run_reference(X, C0, ev["steps"], config["model"]["gamma"], config["model"].get("options")).trajectory
                X64 = X.double()
                for method, trajectory in runs.items():
                    sums[method] += _log_means(X64, trajectory).sum(dim=0)
            settings.append({"init": init, "n": n, "log_objective": {m: (s / ev["tasks"]).tolist() for m, s in sums.items()}})
    primary = next((s for s in settings if s["n"] == data["n"]), settings[0])
    return {
        "variant": variant.name,
        "reference": variant.classical if variant.reference is not None else None,
        "family": family,
        "tasks": ev["tasks"],
        "steps": ev["steps"],
        "primary": {"init": primary["init"], "n": primary["n"]},
        "log_objective": primary["log_objective"],
        "settings": settings,
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [
        *([f"variant {report['variant']}; reference: {report['reference']}"] if report.get("reference") else []),
        f"{report['tasks']} unseen {report['family']} tasks, {report['steps']} steps; mean log objective at the last step (and at step 1)",
        f"{'init':<9} {'n':>5}  " + "  ".join(f"{m:>17}" for m in report["log_objective"]) + f"  {'model - lloyd':>13}",
    ]
    for s in report["settings"]:
        lo = s["log_objective"]
        cells = "  ".join(f"{lo[m][-1]:>8.4f} ({lo[m][1]:>6.3f})" for m in lo)
        lines.append(f"{s['init']:<9} {s['n']:>5}  {cells}  {lo['model'][-1] - lo['lloyd'][-1]:>+13.4f}")
    return "\n".join(lines)


def evaluate_checkpoint(path: str | Path, overrides: Sequence[str] = (), out: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """:func:`evaluate` a checkpoint, writing ``eval.json`` and ``eval.png`` into ``out`` (default:
    the run folder's ``eval/``); the report and the picture's path."""
    from ktframe.training import figures

    config, model = load_checkpoint(path)
    report = evaluate(model, eval_config(config, list(overrides)))
    report["checkpoint"] = str(path)
    folder = Path(out) if out is not None else Path(path).resolve().parent.parent / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / "eval.json", [json.dumps(report, indent=2)])
    primary = report["primary"]
    title = f"init={primary['init']}, n={primary['n']}, {report['family']}"
    (picture,) = figures.save({"eval": figures.objective_figure(report["log_objective"], title)}, folder)
    return report, picture


def table_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The report as one row per setting, method and step: the columns and the rows of a table."""
    columns = ["init", "n", "method", "step", "log_objective"]
    rows = [
        [s["init"], s["n"], method, step, value]
        for s in report["settings"]
        for method, values in s["log_objective"].items()
        for step, value in enumerate(values)
    ]
    return columns, rows
