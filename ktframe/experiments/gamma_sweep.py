"""The temperature sweep of the hand-built construction (Clarkson et al. 2026, the parameter sweep
of their Figures 5–8): at finite inverse temperature γ the transformer's point→center assignment is
a softmax, not an arg-max; how far does its k-means objective after 10 steps fall from Lloyd's?

Per cell of a grid over k, d, n, the data's scale and γ, the paper's protocol: k centers uniform in
[0, 1]^d; n // k points around each from N(center, 0.01·I); each coordinate min-max scaled to
[0, scale]; the points shuffled; the first k points the initial centers. Then 10 steps of the
variant's model at γ (``soft``: exact resets, a softmax assignment, the normalized linear center
update) and 10 Lloyd iterations from the same start. A cell's ``delta`` is the model's log
objective minus Lloyd's. Cells with the same k, d and n run as one batch of tasks per γ.
"""

from __future__ import annotations

import csv
import inspect
import io
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ktframe.errors import InputError
from ktframe.fast import lloyd
from ktframe.plugin.variant import build_model, get_variant

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


def _model(variant: str, d: int, k: int, gamma: float, dtype: torch.dtype) -> torch.nn.Module:
    """The variant at γ, with its resets in identity mode where it offers them (O(n), not O(n²))."""
    options = {"reset": "identity"} if "reset" in inspect.signature(get_variant(variant).build).parameters else {}
    return build_model(variant, d=d, k=k, n_layers=STEPS, gamma=gamma, dtype=dtype, **options)


def sweep(
    variant: str, chosen: Grid, *, seed: int = 0, dtype: torch.dtype = torch.float32, progress: Callable[[int], None] = lambda cells: None
) -> Iterator[dict]:
    """One row per cell of ``chosen`` (``COLUMNS``); ``progress(cells)`` after each batch."""
    check_variant(variant)
    generator = torch.Generator().manual_seed(seed)
    for k in chosen.k:
        for d in chosen.d:
            models = {gamma: _model(variant, d, k, gamma, dtype) for gamma in chosen.gamma}  # the same for every n
            for n in chosen.n:
                if n < k:
                    raise InputError(f"the grid holds n={n} below k={k}; expected every n >= every k")
                step = max(1, BATCH_NUMBERS // (n * d))
                for start in range(0, len(chosen.scale), step):
                    scales = chosen.scale[start : start + step]
                    for gamma, model in models.items():
                        X, C0 = (torch.cat(parts) for parts in zip(*(tasks(1, n, d, k, scale, generator, dtype) for scale in scales)))
                        with torch.no_grad():
                            ours = lloyd.objective(X.double(), model(X, C0, n_steps=STEPS).centers.double())
                            theirs = lloyd.objective(X.double(), lloyd.lloyd(X, C0, STEPS).centers.double())
                        delta = (ours.log() - theirs.log()).tolist()
                        for scale, value in zip(scales, delta):
                            yield {"k": k, "d": d, "n": n, "scale": scale, "gamma": gamma, "delta": value}
                        progress(len(scales))


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "gamma": f"{row['gamma']:g}", "delta": f"{row['delta']:.9g}"})
    return out.getvalue()


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

    from ktframe.clustering.datafile import write_atomically

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
