"""The pictures a user of this work expects: objective per step, center trajectories on a task,
learned QᵀK beside the hand-built ones, attention maps. Saved as PNG and, given a logger that
takes images (W&B), logged."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or assumed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ktframe.core import reference  # noqa: E402
from ktframe.core.io import write_atomically  # noqa: E402
from ktframe.plugin import manager as pluginmanager  # noqa: E402
from ktframe.plugin.build import build_model  # noqa: E402

HEADS = ("point_cross", "point_self", "center_cross", "center_self")
LABELS = {
    "model": "learned model", "lloyd": "Lloyd (same start)", "k-means++": "k-means++ + Lloyd", "greedy-k-means++": "greedy k-means++ + Lloyd",
    "breathing-kmeans": "breathing k-means", "best-of-10": "best of 10 (scikit-learn)", "model+lloyd": "learned model, last steps Lloyd",
}  # fmt: skip


def objective_figure(log_objective: dict[str, list[float]], title: str = "") -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, values in log_objective.items():
        ax.plot(range(len(values)), values, marker="o", markersize=3, label=LABELS.get(method, method))
    ax.set_xlabel("step")
    ax.set_ylabel("mean log objective")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def by_k_figure(settings: list[dict], title: str = "") -> plt.Figure:
    """For evaluations of several k: each method's mean log objective at the last step (the
    baselines' at convergence) minus Lloyd's from the same start, against k; one panel per
    (init, n). Below 0: a better clustering than Lloyd's."""
    panels = list(dict.fromkeys((s["init"], s["n"]) for s in settings))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (init, n) in zip(axes[0], panels):
        chosen = sorted((s for s in settings if (s["init"], s["n"]) == (init, n)), key=lambda s: s["k"])
        ks = [s["k"] for s in chosen]
        finals = [{**{m: v[-1] for m, v in s["log_objective"].items()}, **s.get("final", {})} for s in chosen]
        for method in finals[0]:
            if method != "lloyd":
                ax.plot(ks, [f[method] - f["lloyd"] for f in finals], marker="o", markersize=3, label=LABELS.get(method, method))
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set(xlabel="k (clusters per task)", ylabel="mean log objective − Lloyd's", title=f"init={init}, n={n}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def trajectory_figure(X: torch.Tensor, trajectory: torch.Tensor, labels: torch.Tensor | None = None, title: str = "") -> plt.Figure:
    """One task: its points (first two coordinates) and the path of every center."""
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(X[:, 0], X[:, 1], s=6, c=labels if labels is not None else "0.6", cmap="tab10", alpha=0.6)
    for j in range(trajectory.shape[1]):
        path = trajectory[:, j]
        ax.plot(path[:, 0], path[:, 1], "-", color="black", linewidth=1)
        ax.plot(path[0, 0], path[0, 1], "o", color="white", markeredgecolor="black", markersize=6)
        ax.plot(path[-1, 0], path[-1, 1], "*", color="red", markersize=11)
    ax.set_title(title or "center trajectories (o start, * end)")
    fig.tight_layout()
    return fig


def _qk(head) -> torch.Tensor:
    if hasattr(head, "heads"):  # a HeadGroup: the sum of its heads' bilinear forms
        return sum(_qk(h) for h in head.heads)
    q, k = head.q.matrix, head.k.matrix
    if q.shape[0] != k.shape[0]:  # queries and keys of different widths: no bilinear form, drawn blank
        return torch.zeros(q.shape[1], k.shape[1])
    return (q.T @ k).detach().cpu()


def qk_figure(model, d: int, k: int) -> plt.Figure:
    """Each head's QᵀK, learned (top) beside the hand-built ``lloyd`` construction's (bottom);
    the learned heads alone, with a note in the title, where no ``lloyd`` variant is registered
    (``ktframe --no-plugins``: it is a plugin)."""
    rows = [(model.layers[0], "learned")]
    if "lloyd" in pluginmanager.registry().names("variant"):
        rows.append((build_model("lloyd", d=d, k=k, n_layers=1).layers[0], "hand-built"))
    fig, axes = plt.subplots(len(rows), 4, figsize=(16, 4 * len(rows)), squeeze=False)
    if len(rows) == 1:
        fig.suptitle("learned QᵀK only: the hand-built lloyd variant is not registered (plugins disabled or not installed)")
    for col, name in enumerate(HEADS):
        for row, (source, label) in enumerate(rows):
            image = _qk(getattr(source, name))
            limit = float(image.abs().max()) or 1.0
            axes[row, col].imshow(image, cmap="RdBu_r", vmin=-limit, vmax=limit)
            axes[row, col].set_title(f"{label} {name} QᵀK")
            axes[row, col].axis("off")
    fig.tight_layout()
    return fig


@torch.no_grad()
def attention_figure(model, X: torch.Tensor, C0: torch.Tensor) -> plt.Figure:
    """The four attention maps of the first step on one task (softmax weights, dropout off)."""
    points, centers = model.embedding.points(X, model.k), model.embedding.centers(C0)
    layer = model.layers[0]
    p, c = layer.point_norm(points), layer.center_norm(centers)
    maps = {"point_cross": layer.point_cross.weights(p, c), "point_self": layer.point_self.weights(p, p)}
    new_points, _ = layer(points.clone(), centers.clone())
    p_new = layer.point_norm(new_points)
    maps["center_cross"] = layer.center_cross.weights(c, p_new)
    maps["center_self"] = layer.center_self.weights(c, c)
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
    for ax, name in zip(axes, HEADS):
        weights = maps[name][0].cpu()
        ax.imshow(weights, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(f"{name} {tuple(weights.shape)}")
    fig.tight_layout()
    return fig


@torch.no_grad()
def training_figures(model, X: torch.Tensor, C0: torch.Tensor, labels: torch.Tensor, steps: int = 10) -> dict[str, plt.Figure]:
    """The pictures of a trained model on validation tasks ``X (B, n, d)``."""
    model.eval()
    traj = model(X, C0, n_steps=steps, reembed=True).trajectory
    lloyd = reference.lloyd(X, C0, steps).trajectory
    plain = reference.lloyd(X, reference.kmeans_plusplus(X, model.k, torch.Generator().manual_seed(0)), steps).trajectory

    def curve(trajectory):
        return [reference.objective(X, trajectory[:, t]).log().mean().item() for t in range(steps + 1)]

    return {
        "objective": objective_figure({"model": curve(traj), "lloyd": curve(lloyd), "k-means++": curve(plain)}, "validation tasks"),
        "trajectories": trajectory_figure(X[0].cpu(), traj[0].cpu(), labels[0].cpu(), "model: center trajectories on a validation task"),
        "qk": qk_figure(model, model.d, model.k),
        "attention": attention_figure(model, X[:1], C0[:1]),
    }


def png(fig: plt.Figure, dpi: int = 110) -> bytes:
    """``fig`` as the bytes of a PNG file, and closed: written with
    :func:`~ktframe.clustering.io.write_atomically`, a picture is whole or absent."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def save(figures: dict[str, plt.Figure], folder: Path, logger=None) -> list[Path]:
    """Write every figure as ``folder/NAME.png``, each atomically; log them too when the logger
    takes images."""
    pictures = {folder / f"{name}.png": png(fig) for name, fig in figures.items()}
    folder.mkdir(parents=True, exist_ok=True)
    for path, content in pictures.items():
        write_atomically(path, content)
    paths = list(pictures)
    if logger is not None and hasattr(logger, "log_image"):
        for path in paths:
            logger.log_image(key=f"figures/{path.stem}", images=[str(path)])
    return paths
