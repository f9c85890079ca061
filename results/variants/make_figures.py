"""The pictures of docs/variants.md: every first-party variant on one 2-D data set with outliers.

    python results/variants/make_figures.py        # writes results/variants/NAME.png

Three Gaussian clusters of 60 points and six far outliers; every variant runs 8 layers from the
same three initial centers (data points), in its exact hard limit (soft at gamma = 30). Each
picture shows the points coloured by their final cluster, the center trajectories (o start,
* end), the variant's classical reference's final centers (+, on top of the *), Lloyd's final
centers for comparison (grey x), and the points the last center update gave no weight (hollow).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import ktframe  # noqa: E402
from ktframe.core import reference  # noqa: E402
from ktframe.plugin.build import get_variant  # noqa: E402

OUT = Path(__file__).resolve().parent
LAYERS = 8
SETTINGS = {
    "lloyd": {},
    "soft": {"gamma": 30.0},
    "spherical": {},
    "trimmed": {},
    "robust": {"beta": 0.01},
    "kmedoids": {},
}
COLOURS = ["tab:blue", "tab:orange", "tab:green"]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2026)
    means = torch.tensor([[0.0, 0.0], [4.0, 0.5], [1.5, 3.5]], dtype=torch.float64)
    clusters = means[:, None] + 0.6 * torch.randn(3, 60, 2, generator=g, dtype=torch.float64)
    outliers = torch.tensor([[11.0, 9.0], [12.0, 10.5], [10.5, 11.0], [-7.0, 8.0], [13.0, -5.0], [-6.5, -6.0]], dtype=torch.float64)
    X = torch.cat([clusters.reshape(-1, 2), outliers])[None]
    return X, X[:, [5, 70, 130]].clone()


@torch.no_grad()
def last_update_weights(model, X: torch.Tensor, C0: torch.Tensor) -> torch.Tensor:
    """The center-update attention map of the last layer, ``(k, n)``."""
    points, centers = model.embedding.points(X, model.k), model.embedding.centers(C0)
    for step in range(model.n_layers):
        layer = model.layer(step)
        before = centers.clone()
        points, centers = layer(points, centers)
    return layer.center_cross.weights(before, points)[0]


def picture(name: str, options: dict, X: torch.Tensor, C0: torch.Tensor) -> Path:
    spec = get_variant(name)
    gamma = options.pop("gamma", math.inf)
    model = ktframe.build_model(name, d=2, k=3, n_layers=LAYERS, gamma=gamma, dtype="float64", **options)
    with torch.no_grad():
        out = model(X, C0)
    want = spec.run_reference(X, C0, LAYERS, gamma, options)
    lloyd = reference.lloyd(X, C0, LAYERS)
    ignored = (last_update_weights(model, X, C0) == 0).all(dim=0)

    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    if name == "spherical":
        angle = torch.linspace(0, 2 * math.pi, 200)
        ax.plot(angle.cos(), angle.sin(), color="lightgrey", linewidth=1)
    labels = out.labels[0]
    for j, colour in enumerate(COLOURS):
        mine = labels == j
        ax.scatter(*X[0, mine & ~ignored].T, s=14, color=colour, alpha=0.7)
        ax.scatter(*X[0, mine & ignored].T, s=30, facecolors="none", edgecolors=colour, linewidths=1.2)
    for j in range(3):
        path = out.trajectory[0, :, j]
        ax.plot(*path.T, "-", color="black", linewidth=1)
        ax.plot(*path[0], "o", color="white", markeredgecolor="black", markersize=6)
        ax.plot(*path[-1], "*", color="red", markersize=13)
    ax.plot(*want.centers[0].T, "+", color="black", markersize=16, markeredgewidth=1.5, linestyle="none", label=f"reference: {spec.classical}")
    ax.plot(*lloyd.centers[0].T, "x", color="grey", markersize=10, markeredgewidth=2, linestyle="none", label="Lloyd's final centers")
    if bool(ignored.any()):
        ax.scatter([], [], s=30, facecolors="none", edgecolors="black", label="zero weight in the last center update")
    error = (out.trajectory - want.trajectory).abs().max().item()
    setting = ", ".join([f"gamma={gamma:g}" if math.isfinite(gamma) else "hard limit", *(f"{key}={value:g}" for key, value in options.items())])
    ax.set_title(f"{name} ({setting}): max |center - reference| = {error:.1e}", fontsize=10)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_aspect("equal", adjustable="datalim")
    fig.tight_layout()
    path = OUT / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> None:
    X, C0 = data()
    for name, options in SETTINGS.items():
        print(picture(name, dict(options), X, C0))


if __name__ == "__main__":
    main()
