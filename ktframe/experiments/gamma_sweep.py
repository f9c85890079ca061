"""The temperature sweep of the hand-built construction (Clarkson et al. 2026, the parameter sweep
of their Figures 5–8): at finite inverse temperature γ the transformer's point→center assignment is
a softmax, not an arg-max; how far does its k-means objective after 10 steps fall from Lloyd's?

Per cell of a grid over k, d, n, the data's scale and γ, the paper's protocol: k centers uniform in
[0, 1]^d; n // k points around each from N(center, 0.01·I); each coordinate min-max scaled to
[0, scale]; the points shuffled; the first k points the initial centers. Then 10 steps of the
variant's model at γ (``soft``: exact resets, a softmax assignment, the normalized linear center
update) and 10 Lloyd iterations from the same start. A cell's ``delta`` is the model's log
objective minus Lloyd's. A cell's task depends on the seed and the cell alone; every γ runs on it.
Cells with the same k, d and n run as one batch of tasks, and a sweep records each batch as it
ends, so that one stopped goes on where it was (:class:`Journal`).
"""

from __future__ import annotations

import csv
import fcntl
import functools
import inspect
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ktframe.core.errors import InputError
from ktframe.core.io import write_atomically
from ktframe.core.streams import derived_generator
from ktframe.fast import lloyd
from ktframe.plugin.build import build_model, get_variant

STEPS = 10
COLUMNS = ("k", "d", "n", "scale", "gamma", "delta")
# Numbers of data (tasks × n × d) one batch may hold: the batch's token streams stay a few hundred MB.
BATCH_NUMBERS = 1 << 24


@dataclass(frozen=True)
class Grid:
    k: tuple[int, ...]
    d: tuple[int, ...]
    n: tuple[int, ...]
    scale: tuple[int, ...]
    gamma: tuple[float, ...]

    @property
    def cells(self) -> int:
        return math.prod(len(getattr(self, axis.name)) for axis in fields(self))

    def every(self, stride: int) -> Grid:
        """Every ``stride``-th value of each axis but γ (the last value kept, so the range is)."""

        def pick(values: tuple) -> tuple:
            chosen = values[::stride]
            return chosen if chosen[-1] == values[-1] else (*chosen, values[-1])

        return Grid(pick(self.k), pick(self.d), pick(self.n), pick(self.scale), self.gamma)


AXES = tuple(axis.name for axis in fields(Grid))
PAPER = Grid(
    k=tuple(range(5, 55, 5)),
    d=tuple(range(1, 11)),
    n=tuple(int(n) for n in np.logspace(2, 6, 10)),  # 100, 278, ..., 1 000 000, as the authors' sweep
    scale=tuple(range(1, 11)),
    gamma=(1.0, 10.0, 100.0),
)
GRIDS = {"paper": PAPER, "quick": PAPER.every(3)}


def check_variant(name: str) -> None:
    """A registered variant whose model takes an inverse temperature ``gamma``."""
    variant = get_variant(name)  # an unknown name is a one-line error naming the registered ones
    if "gamma" not in inspect.signature(variant.build).parameters:
        raise InputError(f"variant {name!r} takes no gamma; expected a variant with an inverse temperature, e.g. soft")


def grid(name: str) -> Grid:
    """A named grid, or one read from a YAML file that lists the values of every axis
    (``k: [5, 10]``, ``d``, ``n``, ``scale``, ``gamma``)."""
    if name in GRIDS:
        return GRIDS[name]
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"unknown grid {name!r}; expected one of: {', '.join(GRIDS)}, or a YAML file of the axes {', '.join(AXES)}")
    import yaml

    try:
        axes = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"grid file {name}: cannot be read ({exc}); expected a YAML file of the axes {', '.join(AXES)}") from None
    if not isinstance(axes, dict) or set(axes) != set(AXES):
        raise InputError(
            f"grid file {name}: expected exactly the axes {', '.join(AXES)}, each a list of values; got {sorted(axes) if isinstance(axes, dict) else axes!r}"
        )
    for axis, values in axes.items():
        integral = axis != "gamma"
        if not isinstance(values, list) or not values or not all(_positive(v, integral) for v in values):
            kind = "positive integers" if integral else "positive numbers"
            raise InputError(f"grid file {name}: {axis} must be a non-empty list of {kind}; got {values!r}")
    return Grid(**{axis: tuple(int(v) if axis != "gamma" else float(v) for v in axes[axis]) for axis in AXES})


def _positive(value: object, integral: bool) -> bool:
    number = isinstance(value, int) if integral else isinstance(value, (int, float))
    return number and not isinstance(value, bool) and value > 0


def tasks(batch: int, n: int, d: int, k: int, scale: float, generator: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` tasks of the paper's protocol: points ``(batch, k·(n // k), d)`` and their first k
    points as the initial centers."""
    per = n // k
    means = torch.rand(batch, k, 1, d, generator=generator, dtype=torch.float64)
    X = (means + 0.1 * torch.randn(batch, k, per, d, generator=generator, dtype=torch.float64)).reshape(batch, k * per, d)
    low = X.amin(dim=1, keepdim=True)
    span = X.amax(dim=1, keepdim=True) - low
    X = (X - low) / torch.where(span > 0, span, torch.ones_like(span)) * scale
    order = torch.rand(batch, k * per, generator=generator).argsort(dim=1)
    X = torch.gather(X, 1, order.unsqueeze(-1).expand(-1, -1, d)).to(dtype)
    return X, X[:, :k].clone()


def cell_generator(seed: int, k: int, d: int, n: int, scale: int) -> torch.Generator:
    """The generator of one cell's task. Its draws depend on the seed and the cell alone: a cell
    holds the same task in every grid that has it, and a resumed sweep draws what an
    uninterrupted one would have."""
    return derived_generator(seed, k, d, n, scale)


@dataclass(frozen=True)
class Batch:
    """Cells that run as one batch of tasks: one k, d and n, several scales. Every γ runs on the
    same tasks, against one Lloyd run."""

    k: int
    d: int
    n: int
    scales: tuple[int, ...]

    def cells(self, gammas: tuple[float, ...]) -> list[tuple]:
        """Its cells ``(k, d, n, scale, gamma)`` at each of ``gammas``, in the order of its rows."""
        return [(self.k, self.d, self.n, scale, gamma) for gamma in gammas for scale in self.scales]


def batches(chosen: Grid) -> list[Batch]:
    """The grid's batches, in order. They depend on the grid alone, so that a resumed sweep runs
    each cell in the batch that an uninterrupted one would have (a batch's size can change the
    last bits of a sum)."""
    if min(chosen.n) < max(chosen.k):
        raise InputError(f"the grid holds n={min(chosen.n)} below k={max(chosen.k)}; expected every n >= every k")
    out = []
    for k in chosen.k:
        for d in chosen.d:
            for n in chosen.n:
                step = max(1, BATCH_NUMBERS // (n * d))
                out += [Batch(k, d, n, chosen.scale[i : i + step]) for i in range(0, len(chosen.scale), step)]
    return out


def _model(variant: str, d: int, k: int, gamma: float, dtype: torch.dtype) -> torch.nn.Module:
    """The variant at γ, with its resets in identity mode where it offers them (O(n), not O(n²))."""
    options = {"reset": "identity"} if "reset" in inspect.signature(get_variant(variant).build).parameters else {}
    return build_model(variant, d=d, k=k, n_layers=STEPS, gamma=gamma, dtype=dtype, **options)


def run_batch(batch: Batch, models: dict[float, torch.nn.Module], seed: int, dtype: torch.dtype) -> list[dict]:
    """The rows of one batch: for each γ (``models``, built for the batch's d and k) and scale, the
    model's log objective after ``STEPS`` steps minus Lloyd's, from the same start."""
    k, d, n = batch.k, batch.d, batch.n
    X, C0 = (torch.cat(parts) for parts in zip(*(tasks(1, n, d, k, s, cell_generator(seed, k, d, n, s), dtype) for s in batch.scales)))
    rows = []
    with torch.no_grad():
        theirs = lloyd.objective(X.double(), lloyd.lloyd(X, C0, STEPS).centers.double()).log()
        for gamma, model in models.items():
            ours = lloyd.objective(X.double(), model(X, C0, n_steps=STEPS).centers.double()).log()
            rows += [{"k": k, "d": d, "n": n, "scale": s, "gamma": gamma, "delta": v} for s, v in zip(batch.scales, (ours - theirs).tolist())]
    return rows


def sweep(variant: str, chosen: Grid, *, seed: int = 0, dtype: torch.dtype = torch.float32, done: Collection[Batch] = ()) -> Iterator[list[dict]]:
    """The rows (``COLUMNS``) of each batch of ``chosen`` but those ``done``, batch by batch."""
    check_variant(variant)

    @functools.lru_cache(maxsize=1)  # the same for every n and scale, and the batches come k and d at a time
    def models(k: int, d: int) -> dict[float, torch.nn.Module]:
        return {gamma: _model(variant, d, k, gamma, dtype) for gamma in chosen.gamma}

    for batch in batches(chosen):
        if batch not in done:
            yield run_batch(batch, models(batch.k, batch.d), seed, dtype)


def to_csv(rows: list[dict], header: bool = True) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({**row, "gamma": f"{row['gamma']:g}", "delta": f"{row['delta']:.9g}"})
    return out.getvalue()


def _parse(values: list[str]) -> dict:
    k, d, n, scale = (int(v) for v in values[:4])
    return {"k": k, "d": d, "n": n, "scale": scale, "gamma": float(values[4]), "delta": float(values[5])}


def read_csv(path: Path) -> list[dict]:
    """The rows of a finished sweep's ``gamma-sweep.csv``."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); expected the gamma-sweep.csv of a finished sweep") from None
    if not lines or lines[0] != ",".join(COLUMNS):
        raise InputError(f"{path}: expected a CSV whose header is {','.join(COLUMNS)}, as gamma-sweep writes it")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            rows.append(_parse(line.split(",")))
        except (ValueError, IndexError):
            raise InputError(f"{path}: line {number} is not k,d,n,scale (integers), gamma, delta (numbers): {line!r}") from None
    if not rows:
        raise InputError(f"{path}: no rows; expected the gamma-sweep.csv of a finished sweep")
    return rows


def grid_of(rows: list[dict]) -> Grid:
    """The grid whose axes hold the values that ``rows`` take."""
    return Grid(**{axis: tuple(sorted({row[axis] for row in rows})) for axis in AXES})


# The authors' sweep (klic_parameter_sweep.csv of github.com/rithram/kmeans-trf) names the columns so.
AUTHORS_COLUMNS = {"k": "Clusters", "d": "Dimensions", "n": "Points", "scale": "Scale", "gamma": "Gamma", "delta": "Loss"}


def read_other(path: Path) -> dict[tuple, float]:
    """Another sweep's deltas by cell ``(k, d, n, scale, gamma)``: a gamma-sweep.csv, or the
    authors' published sweep (columns ``Clusters, Dimensions, Points, Scale, Gamma, Loss``). An
    empty or NaN delta (a cluster that emptied, in the authors' rows) is left out."""
    try:
        with path.open(newline="") as handle:
            table = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); expected a CSV of a sweep") from None
    names = next((names for names in (dict(zip(COLUMNS, COLUMNS)), AUTHORS_COLUMNS) if table and set(names.values()) <= set(table[0])), None)
    if names is None:
        raise InputError(f"{path}: expected the columns {','.join(COLUMNS)} (a gamma-sweep.csv) or {','.join(AUTHORS_COLUMNS.values())} (the authors' sweep)")
    cells = {}
    for number, row in enumerate(table, start=2):
        try:
            cell = tuple(int(float(row[names[axis]])) for axis in AXES[:4]) + (float(row[names["gamma"]]),)
            delta = float(row[names["delta"]]) if row[names["delta"]].strip() else math.nan
        except (TypeError, ValueError):
            raise InputError(f"{path}: line {number} holds a cell that is not numbers: {row}") from None
        if math.isfinite(delta):
            cells[cell] = delta
    return cells


# A cell where the model ends within this of Lloyd's log objective counts as "at Lloyd's".
AT_LLOYD = 1e-3


def against(rows: list[dict], other: dict[tuple, float]) -> dict:
    """Over the cells that both hold: medians of delta by γ, by scale and by k, for ``rows`` and
    for ``other``; per γ, the share of cells at Lloyd's (``|delta| < AT_LLOYD``) on each side and
    the correlation of the two sides' deltas cell by cell. How many of ``rows``' cells ``other``
    lacks (or holds as NaN)."""
    shared = [row for row in rows if _cell(row) in other]
    theirs = [{**row, "delta": other[_cell(row)]} for row in shared]
    by_gamma: dict[float, list[tuple[float, float]]] = {}
    for ours, their in zip(shared, theirs):
        by_gamma.setdefault(ours["gamma"], []).append((ours["delta"], their["delta"]))
    pairs = {gamma: np.array(values) for gamma, values in sorted(by_gamma.items())}
    return {
        "cells": len(rows),
        "shared": len(shared),
        **{f"by_{axis}": {"ours": medians(shared, axis), "theirs": medians(theirs, axis)} for axis in ("gamma", "scale", "k")},
        "at_lloyd": {side: {gamma: float(np.mean(np.abs(p[:, i]) < AT_LLOYD)) for gamma, p in pairs.items()} for i, side in enumerate(("ours", "theirs"))},
        "correlation": {gamma: float(np.corrcoef(p[:, 0], p[:, 1])[0, 1]) if len(p) > 1 else math.nan for gamma, p in pairs.items()},
    }


def _cell(row: dict) -> tuple:
    return tuple(row[axis] for axis in AXES)


def against_markdown(comparison: dict, other: Path) -> str:
    """The comparison as Markdown tables: ktframe's medians beside the other sweep's."""
    lines = [
        f"# gamma-sweep against {other.name}",
        "",
        f"{comparison['shared']} of {comparison['cells']} cells in both (the others are missing, empty or NaN in {other.name}); median delta:",
    ]
    for axis in ("gamma", "scale", "k"):
        table = comparison[f"by_{axis}"]
        keys = list(table["ours"])
        lines += [
            "",
            "| " + " | ".join([axis, *(f"{key:g}" for key in keys)]) + " |",
            "|---" * (len(keys) + 1) + "|",
            "| " + " | ".join(["ktframe", *(f"{table['ours'][key]:+.4f}" for key in keys)]) + " |",
            "| " + " | ".join([other.name, *(f"{table['theirs'][key]:+.4f}" for key in keys)]) + " |",
        ]
    gammas = list(comparison["correlation"])
    lines += [
        "",
        f"Cell by cell, per gamma: the share of cells at Lloyd's (|delta| < {AT_LLOYD:g}) on each side, and the correlation of the two sides' deltas:",
        "",
        "| " + " | ".join(["gamma", *(f"{gamma:g}" for gamma in gammas)]) + " |",
        "|---" * (len(gammas) + 1) + "|",
        "| " + " | ".join(["at Lloyd's, ktframe", *(f"{comparison['at_lloyd']['ours'][g]:.1%}" for g in gammas)]) + " |",
        "| " + " | ".join([f"at Lloyd's, {other.name}", *(f"{comparison['at_lloyd']['theirs'][g]:.1%}" for g in gammas)]) + " |",
        "| " + " | ".join(["correlation", *(f"{comparison['correlation'][g]:.3f}" for g in gammas)]) + " |",
    ]
    return "\n".join(lines) + "\n"


def medians(rows: list[dict], by: str) -> dict[float, float]:
    """The median delta for each value of the axis ``by``."""
    values: dict[float, list[float]] = {}
    for row in rows:
        values.setdefault(row[by], []).append(row["delta"])
    return {key: float(np.median(group)) for key, group in sorted(values.items())}


# The four heatmaps: (rows, columns) of each, the median over the other axes in every square.
HEATMAPS = {"scale-k": ("scale", "k"), "k-d": ("k", "d"), "k-n": ("k", "n"), "d-n": ("d", "n")}


def heatmaps(rows: list[dict], chosen: Grid) -> dict[str, object]:
    """One figure per pair of axes, one panel per γ: the median delta in every square."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    for name, (down, across) in HEATMAPS.items():
        ys, xs = getattr(chosen, down), getattr(chosen, across)
        fig, axes = plt.subplots(1, len(chosen.gamma), figsize=(4.2 * len(chosen.gamma), 3.8), squeeze=False)
        for ax, gamma in zip(axes[0], chosen.gamma):
            grid_values = np.full((len(ys), len(xs)), np.nan)
            for i, y in enumerate(ys):
                for j, x in enumerate(xs):
                    cell = [r["delta"] for r in rows if r["gamma"] == gamma and r[down] == y and r[across] == x]
                    grid_values[i, j] = np.median(cell) if cell else np.nan
            image = ax.imshow(grid_values, origin="lower", aspect="auto", cmap="viridis")
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], rotation=45 if across == "n" else 0)
            ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
            ax.set_xlabel(across)
            ax.set_ylabel(down)
            ax.set_title(f"γ = {gamma:g}")
            fig.colorbar(image, ax=ax, label="median Δ log objective")
        fig.suptitle(f"model − Lloyd after {STEPS} steps, by {down} and {across}")
        fig.tight_layout()
        figures[f"gamma-sweep-{name}"] = fig
    return figures


def check_folder(folder: Path) -> None:
    """``folder`` exists, or can be made, and takes new files: checked before any cell runs."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise InputError(f"{folder}: cannot write there ({exc.strerror}); expected a writable folder for the sweep's files") from None


def write(rows: list[dict], chosen: Grid, folder: Path) -> list[Path]:
    """``gamma-sweep.csv`` and the four heatmaps (PNG) in ``folder``, each written whole or not
    at all; their paths."""
    import matplotlib.pyplot as plt

    table = folder / "gamma-sweep.csv"
    write_atomically(table, to_csv(rows).encode())
    paths = [table]
    for name, fig in heatmaps(rows, chosen).items():
        image = io.BytesIO()
        fig.savefig(image, format="png", dpi=110)
        plt.close(fig)
        paths.append(folder / f"{name}.png")
        write_atomically(paths[-1], image.getvalue())
    return paths


# --- a sweep in progress ----------------------------------------------------------------------

PARTIAL, SETTINGS = "gamma-sweep.partial.csv", "gamma-sweep.partial.json"


class Journal:
    """A sweep in progress in its folder: its settings (``SETTINGS``) and the rows of the batches
    done so far (``PARTIAL``), appended and flushed to disk batch by batch, so that a sweep that
    was stopped (Ctrl-C, a machine taken away) goes on with ``--resume`` from its last whole
    batch. Both files go once the sweep's own files are written."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.settings_path, self.rows_path = folder / SETTINGS, folder / PARTIAL
        self.rows_file: io.TextIOBase | None = None  # open, and locked, while this process writes the sweep

    def open(self, settings: dict, chosen: Grid, resume: bool) -> dict[Batch, list[dict]]:
        """Start a sweep of ``settings`` (JSON values) here or, with ``resume``, go on with the one
        that is; the rows of the batches already done. Checked before anything is written; the
        rows file stays locked, so that a second process cannot write the same sweep."""
        if resume and not self.settings_path.is_file():
            raise InputError(f"--resume: {self.folder} holds no unfinished sweep; expected the --out of a sweep that was stopped")
        if not resume and self.settings_path.exists():
            raise InputError(f"{self.folder} holds an unfinished sweep; expected --resume to continue it, or another --out")
        if resume:
            started = json.loads(self.settings_path.read_text())
            for key, value in settings.items():
                if started.get(key) != value:
                    was = "another grid" if key == "grid" else f"{key} {started.get(key)}"
                    raise InputError(f"--resume: the sweep in {self.folder} was started with {was}; expected the options it was started with")
        check_folder(self.folder)
        if not resume:
            write_atomically(self.rows_path, to_csv([]).encode())
            write_atomically(self.settings_path, json.dumps(settings, indent=1).encode())
        self.rows_file = open(self.rows_path, "a+")
        try:
            fcntl.flock(self.rows_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.rows_file.close()
            raise InputError(f"{self.folder}: another gamma-sweep is writing this sweep; expected one process per sweep") from None
        done = self.done(chosen)
        self.rows_file.truncate(0)  # whole batches only: a batch cut short runs again
        self._write(to_csv([row for rows in done.values() for row in rows]))
        return done

    def done(self, chosen: Grid) -> dict[Batch, list[dict]]:
        """The batches whose every row is on disk, in the grid's order, with their rows (in the
        order the sweep gives them)."""
        by_cell = {_cell(row): row for row in self._rows()}
        done = {}
        for batch in batches(chosen):
            rows = [by_cell.get(cell) for cell in batch.cells(chosen.gamma)]
            if all(rows):
                done[batch] = rows
        return done

    def _rows(self) -> list[dict]:
        # A last line that a stop cut short is left out.
        rows = []
        for line in self.rows_path.read_text().splitlines(keepends=True)[1:]:
            values = line.rstrip("\n").split(",")
            if line.endswith("\n") and len(values) == len(COLUMNS):
                try:
                    rows.append(_parse(values))
                except ValueError:
                    continue
        return rows

    def append(self, rows: list[dict]) -> None:
        self._write(to_csv(rows, header=False))

    def _write(self, text: str) -> None:
        self.rows_file.write(text)
        self.rows_file.flush()
        os.fsync(self.rows_file.fileno())

    def finish(self) -> None:
        """The sweep's own files are written: the journal goes."""
        self.rows_path.unlink()
        self.settings_path.unlink()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        if self.rows_file is not None:  # the lock goes with it, even if the sweep was stopped
            self.rows_file.close()


def run(
    variant: str,
    chosen: Grid,
    folder: Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    resume: bool = False,
    progress: Callable[[int], None] = lambda cells: None,
) -> tuple[list[dict], list[Path]]:
    """The sweep of ``variant`` over ``chosen`` into ``folder``, recorded batch by batch (see
    :class:`Journal`) and, with ``resume``, continued where it stopped; its rows in the grid's
    order and the files written. ``progress(cells)`` after each batch (and once for the batches
    already done). Everything is checked before the first file is written."""
    check_variant(variant)
    batches(chosen)
    if seed < 0:
        raise InputError(f"--seed {seed}: expected a seed >= 0")
    settings = json.loads(json.dumps({"variant": variant, "grid": {axis: list(getattr(chosen, axis)) for axis in AXES}, "seed": seed, "dtype": str(dtype)}))
    with Journal(folder) as journal:
        done = journal.open(settings, chosen, resume)
        progress(sum(len(rows) for rows in done.values()))
        for rows in sweep(variant, chosen, seed=seed, dtype=dtype, done=done):
            journal.append(rows)
            progress(len(rows))
        # Every row as the journal holds it (nine digits), whether this process computed it or not.
        rows = [row for rows in journal.done(chosen).values() for row in rows]
        paths = write(rows, chosen, folder)
        journal.finish()
    return rows, paths
