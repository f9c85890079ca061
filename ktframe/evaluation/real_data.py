"""Trained checkpoints on real data sets that ship inside installable packages (``ktframe real-data``).

The paper's protocol (:mod:`ktframe.evaluation.evaluate`) on data nobody trained on. Per data set,
``samples`` samples of ``min(n, POINTS)`` of its points drawn without replacement (the whole data
set where it is no larger: its samples then differ in their random starts alone). Each sample is
put in a checkpoint's frame once (:class:`~ktframe.clustering.trained.Frame`: zero-padded or
reduced to its first d principal components, then scaled as the checkpoint's training tasks were)
and every method runs in that frame from the same start: the model for its ``eval.steps``
re-embedded steps from k distinct points of the sample drawn at random (its centers taken as
``TransformerKMeans(checkpoint=...)`` returns them: a zero-padded coordinate dropped), and from the same points
Lloyd's algorithm for as many iterations (keeping an emptied cluster's center) and to convergence;
k-means++ and greedy k-means++ seedings, each followed by as many Lloyd iterations, as the protocol
runs them. The measure is the protocol's: log Σᵢ minⱼ ‖xᵢ − cⱼ‖² in the frame. Reported per
checkpoint, data set and k: each method's mean over the samples and the model's paired
differences with every other method, with their 95 % Student-t intervals. ``lloyd_last=N`` adds
``model+lloyd``, as ``eval.lloyd_last`` does on the synthetic protocol: the model's first steps,
then N of Lloyd's from the centers it returns (the hand-built construction's exact γ = ∞ limit),
the same number of steps in all; its paired differences with the classical methods beside the
model's. ``swaps=T`` adds ``model+swaps`` (``model+lloyd+swaps`` with ``lloyd_last``): T swaps
(:mod:`ktframe.fast.swaps`) after the model's (or the hybrid's) centers, each followed by as many
Lloyd iterations as the model's steps, and, from Lloyd's centers after its iterations, the same
swaps as ``lloyd+swaps``: what the swaps do without the model. Left at None, each checkpoint
gets its own finish, as ``TransformerKMeans(checkpoint=...)`` does: its config's ``eval.lloyd_last``
and ``eval.swaps`` (0 where it has none).

A sample depends on the seed, the data set and its number alone; its start on those and k: the
first samples of a longer run are those of a shorter one, and every checkpoint of one frame
(``d`` and ``data.scaling``) sees the same samples, starts and baselines.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ktframe.clustering.trained import Frame, Trained, load_trained
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.io import check_writable, relative_path, write_atomically
from ktframe.core.streams import derived_generator
from ktframe.evaluation.datasets import data_sets
from ktframe.evaluation.evaluate import SWAPPED_LLOYD, swapped_name
from ktframe.fast import lloyd as fast
from ktframe.fast.swaps import swap
from ktframe.reporting.report import describe

# Points of a sample: the n the checkpoints were trained and validated at.
POINTS = 512
# Lloyd "to convergence": until no center moves, at most scikit-learn's KMeans max_iter.
CONVERGED_MAX_ITER = 300
METHODS = ("model", "lloyd", "lloyd-converged", "k-means++", "greedy-k-means++")
HYBRID = "model+lloyd"
OUTPUTS = ("report.md", "report.json")
# The checkpoints evaluated when none is named, those of them that exist.
DEFAULT_CHECKPOINTS = ("results/paper-seed0.ckpt", "results/anyk-seed0.ckpt", "results/general.ckpt")


def default_checkpoints() -> list[str]:
    """Those of :data:`DEFAULT_CHECKPOINTS` that exist (relative to the current folder)."""
    found = [path for path in DEFAULT_CHECKPOINTS if Path(path).is_file()]
    if not found:
        raise InputError(f"no --checkpoint given and none of {', '.join(DEFAULT_CHECKPOINTS)} exists here; expected --checkpoint PATH (a .ckpt of ktframe fit)")
    return found


# What a derived seed is for: the samples, the starts and the swaps' draws are independent streams.
_SAMPLES, _STARTS, _SWAPS = 1, 2, 3


def _generator(purpose: int, seed: int, name: str, *numbers: int) -> torch.Generator:
    return derived_generator(purpose, seed, zlib.crc32(name.encode()), *numbers)


def sample_indices(n: int, name: str, samples: int, seed: int) -> torch.Tensor:
    """``(samples, min(n, POINTS))``: the points of each sample of the data set ``name`` of n
    points, sample s drawn without replacement by its own generator; where n <= POINTS every
    sample is the whole data set, in its order."""
    if n <= POINTS:
        return torch.arange(n).expand(samples, -1)
    return torch.stack([torch.randperm(n, generator=_generator(_SAMPLES, seed, name, s))[:POINTS] for s in range(samples)])


def starts(Y: torch.Tensor, k: int, name: str, seed: int) -> dict[str, torch.Tensor]:
    """Each sample's initial centers in the frame ``Y``: random points (the model's and Lloyd's),
    then plain and greedy k-means++, drawn in that order from the sample's own generator, as the
    protocol draws them from its tasks' generator."""
    drawn: dict[str, list[torch.Tensor]] = {"random": [], "k-means++": [], "greedy-k-means++": []}
    for s in range(len(Y)):
        generator, task = _generator(_STARTS, seed, name, k, s), Y[s : s + 1]
        drawn["random"].append(reference.random_points(task, k, generator))
        drawn["k-means++"].append(reference.kmeans_plusplus(task, k, generator))
        drawn["greedy-k-means++"].append(reference.kmeans_plusplus(task, k, generator, greedy=True))
    return {method: torch.cat(centers) for method, centers in drawn.items()}


def frame_label(features: int, d: int) -> str:
    """How data of ``features`` coordinates reaches a model of ``d``."""
    if features > d:
        return f"first {d} principal components"
    return f"zero-padded to {d}" if features < d else "as is"


def swapped(Y: torch.Tensor, C: torch.Tensor, swaps: int, steps: int, name: str, k: int, seed: int) -> torch.Tensor:
    """``(S,)``: the log objectives after ``swaps`` swaps from the centers ``C`` of each sample,
    each swap followed by ``steps`` Lloyd iterations, the draws from the sample's own generator."""
    return torch.cat([swap(Y[s : s + 1], C[s : s + 1], swaps, steps, _generator(_SWAPS, seed, name, k, s)).objective for s in range(len(Y))]).log()


@torch.no_grad()
def baselines(Y: torch.Tensor, seeded: dict[str, torch.Tensor], steps: int) -> tuple[dict[str, torch.Tensor], int]:
    """The classical methods' log objectives ``(S,)`` in the frame ``Y`` from the ``seeded``
    starts, and the number of samples whose Lloyd had not converged after CONVERGED_MAX_ITER."""
    X64 = Y.double()
    converged = fast.lloyd(Y, seeded["random"], CONVERGED_MAX_ITER).trajectory
    unconverged = int((converged[:, -1] != converged[:, -2]).flatten(1).any(dim=1).sum())
    centers = {
        "lloyd": fast.lloyd(Y, seeded["random"], steps).centers,
        "lloyd-converged": converged[:, -1],
        "k-means++": fast.lloyd(Y, seeded["k-means++"], steps).centers,
        "greedy-k-means++": fast.lloyd(Y, seeded["greedy-k-means++"], steps).centers,
    }
    return {method: fast.objective(X64, C.double()).log() for method, C in centers.items()}, unconverged


@torch.no_grad()
def lloyd_swapped(Y: torch.Tensor, seeded: dict[str, torch.Tensor], steps: int, swaps: int, name: str, seed: int) -> torch.Tensor:
    """``lloyd+swaps``: the log objectives ``(S,)`` after ``swaps`` swaps from Lloyd's centers
    after ``steps`` iterations from the random starts (the data set's ``name`` and the ``seed``
    draw them)."""
    return swapped(Y, fast.lloyd(Y, seeded["random"], steps).centers, swaps, steps, name, seeded["random"].shape[1], seed)


@torch.no_grad()
def model_objectives(trained: Trained, frame: Frame, Y: torch.Tensor, C0: torch.Tensor, name: str = "", seed: int = 0) -> dict[str, torch.Tensor]:
    """The model's log objectives ``(S,)`` after its ``eval.steps`` re-embedded steps from ``C0``:
    of its centers as the user gets them (``model``: in the user's units, as
    ``TransformerKMeans`` returns them, taken back to the frame: a padded coordinate the layer
    moved a center along is dropped) and of the layer's own centers (``layer``); with the
    checkpoint's ``lloyd_last``, ``model+lloyd``: that many of the steps Lloyd's, from the centers
    the model returns after the others; with its ``swaps``, the swaps after those centers (see the
    module; the data set's ``name`` and the ``seed`` draw them)."""
    X64 = Y.double()
    lloyd_last, swaps = trained.lloyd_last, trained.swaps
    trajectory = trained.model(Y, C0, n_steps=trained.steps, reembed=True).trajectory.double()
    centers = trajectory[:, -1]
    returned = frame.to_model(frame.to_user(centers))
    logs = {"model": fast.objective(X64, returned).log(), "layer": fast.objective(X64, centers).log()}
    if lloyd_last:  # the same run's centers after its first steps (C0 where there are none)
        first = frame.to_model(frame.to_user(trajectory[:, trained.steps - lloyd_last])).to(Y.dtype)
        returned = fast.lloyd(Y, first, lloyd_last).centers.double()
        logs[HYBRID] = fast.objective(X64, returned).log()
    if swaps:
        logs[swapped_name(lloyd_last)] = swapped(Y, returned.to(Y.dtype), swaps, trained.steps, name, C0.shape[1], seed)
    return logs


def _versus(ours: torch.Tensor, logs: dict[str, torch.Tensor], others: Sequence[str]) -> dict[str, Any]:
    """The paired differences of ``ours`` with each of ``others`` (``below``: the samples where
    ours ends lower)."""
    return {other: {**describe((ours - logs[other]).tolist()), "below": int((ours < logs[other]).sum())} for other in others}


def _row(logs: dict[str, torch.Tensor], swapped_as: str | None) -> dict[str, Any]:
    """Each method's mean log objective over the samples and the model's paired differences
    with every other method; with ``model+lloyd``, its own with the classical methods; with the
    swaps (``swapped_as``, their name), theirs with the classical methods and ``lloyd+swaps``."""
    row = {
        "log_objective": {method: describe(values.tolist()) for method, values in logs.items()},
        "versus": _versus(logs["model"], logs, [other for other in logs if other != "model"]),
        "per_sample": {method: values.tolist() for method, values in logs.items()},
    }
    if HYBRID in logs:
        row["hybrid_versus"] = _versus(logs[HYBRID], logs, METHODS[1:])
    if swapped_as is not None:
        row["swapped_versus"] = _versus(logs[swapped_as], logs, [*METHODS[1:], SWAPPED_LLOYD])
    return row


def evaluate(
    checkpoints: Sequence[str],
    names: Sequence[str],
    *,
    samples: int = 16,
    ks: Sequence[int] | None = None,
    seed: int = 0,
    lloyd_last: int | None = None,
    swaps: int | None = None,
    out: str | Path = ".",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The report of every checkpoint on every data set ``names`` at each of its ks (or ``ks``)
    that the checkpoint takes; the others are listed as skipped, with why. ``out``: the folder the
    report goes to, that its checkpoint paths are relative to. ``progress(done, total)`` hears
    each (checkpoint, data set, k) evaluated. ``lloyd_last``, ``swaps``: see the module. Everything is
    checked before anything runs."""
    if samples < 2:
        raise InputError(f"--samples {samples}: expected at least 2 samples (an interval needs two)")
    if ks is not None and any(k < 2 for k in ks):
        raise InputError(f"--ks {','.join(map(str, ks))}: expected numbers of clusters >= 2")
    chosen = data_sets(names)
    if lloyd_last is not None and lloyd_last < 0:
        raise InputError(f"--lloyd-last {lloyd_last}: expected a number of steps >= 0")
    if swaps is not None and swaps < 0:
        raise InputError(f"--swaps {swaps}: expected a number of swaps >= 0")
    trained = [load_trained(path) for path in checkpoints]
    for model in trained:
        if lloyd_last is not None and lloyd_last > model.steps:
            raise InputError(f"--lloyd-last {lloyd_last}: {model.path} runs {model.steps} steps; expected at most {model.steps} of them Lloyd's")
    # Each checkpoint's finish: the one given, else its own.
    trained = [
        dataclasses.replace(model, lloyd_last=model.lloyd_last if lloyd_last is None else lloyd_last, swaps=model.swaps if swaps is None else swaps)
        for model in trained
    ]
    points = {data.name: data.load() for data in chosen}
    plan, skipped = [], []
    for data in chosen:
        for k in ks or data.ks:
            if k > min(len(points[data.name]), POINTS):
                raise InputError(f"k={k} for the data set {data.name!r} of {len(points[data.name])} points; expected k at most its number of points")
            for model in trained:
                try:
                    plan.append((data, model.check_k(k), model))
                except InputError:
                    takes = f"any k up to {model.k}" if model.any_k else f"k={model.k} only"
                    skipped.append({"checkpoint": relative_path(model.path, out), "dataset": data.name, "k": k, "reason": f"its model takes {takes}"})
    rows: list[dict[str, Any]] = []
    # What checkpoints of one frame share: its samples and starts; and, of those that also run as
    # many steps, the classical methods.
    frames: dict[tuple, tuple[Frame, torch.Tensor, dict[str, torch.Tensor]]] = {}
    classicals: dict[tuple, tuple[dict[str, torch.Tensor], int]] = {}
    swapped_lloyds: dict[tuple, torch.Tensor] = {}
    for data, k, model in plan:
        key = (data.name, k, model.d, model.scaling)
        if key not in frames:
            X = torch.from_numpy(points[data.name])[sample_indices(len(points[data.name]), data.name, samples, seed)]
            frame = Frame.fit(X, model.d, model.scaling)
            Y = frame.to_model(X).float()
            frames[key] = (frame, Y, starts(Y, k, data.name, seed))
        frame, Y, seeded = frames[key]
        at = (*key, model.steps)
        if at not in classicals:
            classicals[at] = baselines(Y, seeded, model.steps)
        classical, unconverged = classicals[at]
        if model.swaps:
            at = (*at, model.swaps)
            if at not in swapped_lloyds:
                swapped_lloyds[at] = lloyd_swapped(Y, seeded, model.steps, model.swaps, data.name, seed)
            classical = {**classical, SWAPPED_LLOYD: swapped_lloyds[at]}
        logs = model_objectives(model, frame, Y, seeded["random"], data.name, seed)
        layer = logs.pop("layer")
        n, features = points[data.name].shape
        rows.append(
            {
                "checkpoint": relative_path(model.path, out),
                "dataset": data.name,
                "n": n,
                "features": features,
                "points": Y.shape[1],
                "frame": frame_label(features, model.d),
                "scaling": model.scaling,
                "k": k,
                "samples": samples,
                "steps": model.steps,
                "lloyd_last": model.lloyd_last,
                "swaps": model.swaps,
                "lloyd_unconverged": unconverged,
                "model_before_projection": describe(layer.tolist()),
                **_row({**logs, **classical}, swapped_name(model.lloyd_last) if model.swaps else None),
            }
        )
        if progress is not None:
            progress(len(rows), len(plan))
    return {
        "seed": seed,
        "samples": samples,
        "lloyd_last": lloyd_last,
        "swaps": swaps,
        "points": POINTS,
        "datasets": [{"name": data.name, "source": data.source, "n": len(points[data.name]), "features": points[data.name].shape[1]} for data in chosen],
        "checkpoints": [
            {
                "path": relative_path(m.path, out),
                "d": m.d,
                "k": m.k,
                "any_k": m.any_k,
                "steps": m.steps,
                "scaling": m.scaling,
                "lloyd_last": m.lloyd_last,
                "swaps": m.swaps,
            }
            for m in trained
        ],
        "rows": rows,
        "skipped": skipped,
    }


def _interval(difference: dict[str, Any]) -> str:
    low, high = difference["ci95"]
    return f"{difference['mean']:+.4f} [{low:+.4f}, {high:+.4f}] ({difference['below']}/{difference['n']})"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the data sets, then one table per checkpoint, then what was skipped."""
    lines = [
        "# Trained checkpoints on real data",
        "",
        f"{report['samples']} samples per data set and k (seed {report['seed']}), each of min(n, {report['points']}) points drawn without replacement; "
        f"where n <= {report['points']} every sample is the whole data set and the samples differ in their random starts alone. "
        "Each sample is put in the checkpoint's frame (zero-padded to its d, or reduced to its first d principal components; then scaled "
        "as its training tasks were) and every method runs there: the model for its steps from k distinct random points of the sample "
        "(its centers as TransformerKMeans returns them: a padded coordinate dropped), "
        "Lloyd from the same points for as many iterations and to convergence (at most "
        f"{CONVERGED_MAX_ITER}), k-means++ and greedy k-means++ each followed by as many Lloyd iterations. "
        "Mean over the samples of log Σᵢ minⱼ ‖xᵢ − cⱼ‖² in the frame, lower is better; model − other: the mean of the paired differences "
        "[95 % t-interval] (on how many samples the model ends lower).",
        "",
        "| data set | source | n | features |",
        "|---|---|---|---|",
        *(f"| {data['name']} | {data['source']} | {data['n']} | {data['features']} |" for data in report["datasets"]),
    ]
    for checkpoint in report["checkpoints"]:
        rows = [row for row in report["rows"] if row["checkpoint"] == checkpoint["path"]]
        takes = f"any k up to {checkpoint['k']}" if checkpoint["any_k"] else f"k = {checkpoint['k']} only"
        lines += [
            "",
            f"## {checkpoint['path']}",
            "",
            f"d = {checkpoint['d']}, {takes}, {checkpoint['steps']} steps, data.scaling = {checkpoint['scaling']}.",
        ]
        if not rows:
            lines += ["", "No data set at a k it takes."]
            continue
        steps = checkpoint["steps"]
        lines += [
            "",
            f"| data set | frame | k | model | Lloyd, {steps} it. | Lloyd, converged | k-means++ + Lloyd | greedy k-means++ + Lloyd "
            "| model − Lloyd | model − Lloyd, converged | model − k-means++ | model − greedy k-means++ |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            means = " | ".join(f"{row['log_objective'][method]['mean']:.4f}" for method in METHODS)
            versus = " | ".join(_interval(row["versus"][method]) for method in METHODS[1:])
            lines.append(f"| {row['dataset']} | {row['frame']} | {row['k']} | {means} | {versus} |")
        if checkpoint["lloyd_last"]:
            lines += [
                "",
                f"`{HYBRID}`: the model's first {steps - checkpoint['lloyd_last']} steps, then {checkpoint['lloyd_last']} of Lloyd's from the centers it returns.",
                "",
                f"| data set | k | {HYBRID} | − Lloyd | − Lloyd, converged | − k-means++ | − greedy k-means++ |",
                "|---|---|---|---|---|---|---|",
                *(f"| {row['dataset']} | {row['k']} | {row['log_objective'][HYBRID]['mean']:.4f} | "
                  + " | ".join(_interval(row["hybrid_versus"][method]) for method in METHODS[1:]) + " |" for row in rows),
            ]  # fmt: skip
        if checkpoint["swaps"]:
            name, start = swapped_name(checkpoint["lloyd_last"]), (f"`{HYBRID}`'s" if checkpoint["lloyd_last"] else "the model's")
            lines += [
                "",
                f"`{name}`: {checkpoint['swaps']} swaps after {start} centers, each followed by {steps} Lloyd iterations and kept only where it "
                f"lowers the objective; `{SWAPPED_LLOYD}`: the same swaps after Lloyd's centers ({steps} it.).",
                "",
                f"| data set | k | {name} | {SWAPPED_LLOYD} | − Lloyd | − Lloyd, converged | − k-means++ | − greedy k-means++ | − {SWAPPED_LLOYD} |",
                "|---|---|---|---|---|---|---|---|---|",
                *(f"| {row['dataset']} | {row['k']} | {row['log_objective'][name]['mean']:.4f} | {row['log_objective'][SWAPPED_LLOYD]['mean']:.4f} | "
                  + " | ".join(_interval(row["swapped_versus"][method]) for method in [*METHODS[1:], SWAPPED_LLOYD]) + " |" for row in rows),
            ]  # fmt: skip
        moved = [row for row in rows if row["features"] < checkpoint["d"]]
        if moved:
            lines += ["", "The layer's own centers, before the padded coordinates it moved them along are dropped: " + ", ".join(
                f"{row['dataset']} at k = {row['k']} {row['model_before_projection']['mean']:.4f}" for row in moved
            ) + "."]  # fmt: skip
        unconverged = [row for row in rows if row["lloyd_unconverged"]]
        if unconverged:
            lines += ["", "Lloyd not converged after " + f"{CONVERGED_MAX_ITER} iterations: " + ", ".join(
                f"{row['dataset']} at k = {row['k']} ({row['lloyd_unconverged']} of {row['samples']} samples)" for row in unconverged
            ) + "."]  # fmt: skip
    if report["skipped"]:
        lines += ["", "Skipped, a k the checkpoint does not take:", ""]
        lines += [f"- {skip['checkpoint']} on {skip['dataset']} at k = {skip['k']}: {skip['reason']}" for skip in report["skipped"]]
    return "\n".join(lines) + "\n"


def check_out(folder: Path, named: bool) -> None:
    """Refuse, before anything runs, a folder that cannot be written and, where the caller did not
    name it, one that holds an earlier report: only a folder named is written over."""
    if not named and (folder / "report.json").exists():
        raise InputError(f"{folder / 'report.json'}: holds an earlier report; expected --out DIR for this one (or --out {folder} to replace it)")
    check_writable(folder, OUTPUTS)


def write(report: dict[str, Any], folder: Path) -> list[Path]:
    """report.md, then report.json (which marks a whole report), each written whole or not at all."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{folder}: cannot make the folder ({exc.strerror}); expected a writable folder for {', '.join(OUTPUTS)}") from None
    paths = [folder / name for name in OUTPUTS]
    write_atomically(paths[0], markdown(report).encode())
    write_atomically(paths[1], json.dumps(report, indent=1).encode())
    return paths
