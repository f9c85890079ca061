"""``kmedoids``: randomized k-medoids, Lloyd's construction whose center update ends on a data point.

One mechanism changes against ``lloyd``: after the normalized linear attention has written the
cluster mean ``μ_j`` (Lloyd's update), a second center→point attention hop scores the points of
the cluster by ``−β‖μ_j − x_i‖²`` (the ``cluster-euclidean`` score) and picks one with the hard
Gumbel-softmax map (``gumbel-hardmax``): the new center is data point i of cluster j with
probability ∝ exp(−β‖μ_j − x_i‖²), and a reset head erases the mean. For squared Euclidean
dissimilarities the point nearest the mean is the cluster's medoid (``Σ_i' ‖x_i − x_i'‖² =
n_j‖x_i − μ_j‖² + const``), so ``beta=inf`` is the alternating (Voronoi-iteration) k-medoids of
Park & Jun (2009), and finite β samples around it. The noise comes from a generator seeded with
``seed`` and restarted at every forward pass: the same seed gives the same medoids.
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    AttentionHead,
    InputError,
    KMeansTransformer,
    Layer,
    Variant,
    accelerate,
    cluster_head,
    coords,
    exact_tolerance,
    hookimpl,
    lloyd_family_layer,
    mean_head,
    reference,
    registry,
    reset_head,
    stack,
)

BETA = 1e3
SEED = 0


class MedoidLayer(Layer):
    """A Lloyd layer followed by a second center hop: ``pick`` (center → points of its cluster)
    writes the chosen point, ``pick_reset`` erases the mean the first hop wrote."""

    def __init__(self, *, pick: AttentionHead, pick_reset: AttentionHead, **heads) -> None:
        super().__init__(**heads)
        self.pick, self.pick_reset = pick, pick_reset

    def forward(self, points, centers):
        points, centers = super().forward(points, centers)
        # The reset is added first: μ − μ is exactly 0, so the center becomes exactly the data
        # point, where (μ + x) − μ would round.
        return points, self.update(centers, centers, [(self.pick_reset, centers), (self.pick, points)])


class SeededTransformer(KMeansTransformer):
    """Restarts every Gumbel map's generator before each run, so a run depends on the seed only."""

    def forward(self, *args, **kwargs):
        gumbel = registry().get("map", "gumbel-hardmax")
        for module in self.modules():
            if isinstance(module, AttentionHead) and isinstance(module.map, gumbel):
                module.map.reseed()
        return super().forward(*args, **kwargs)


def check_beta(beta: float) -> float:
    if not (isinstance(beta, (int, float)) and beta > 0):
        raise InputError(f"beta must be a positive number or inf; got {beta!r}")
    return float(beta)


def build(
    *, d: int, k: int, n_layers: int, gamma: float = math.inf, beta: float = BETA, seed: int = SEED, share_weights: bool = True, fast: bool = True
) -> KMeansTransformer:
    """``beta=inf`` picks the point nearest the mean (no noise; lowest index among equals)."""
    reg = registry()
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)
    beta = check_beta(beta)
    hard = math.isinf(beta)

    # One map for every layer: per-layer weights draw from one noise stream, as the reference does.
    pick_map = reg.get("map", "gumbel-hardmax")(seed=seed, noise=not hard)

    def make_layer():
        return lloyd_family_layer(
            width, xs, ys, gamma=gamma, center_cross=mean_head(width, xs, ys), layer=MedoidLayer,
            pick=cluster_head(width, xs, ys, pick_map, gamma=1.0 if hard else beta), pick_reset=reset_head(width, ys, xs),
        )  # fmt: skip

    model = SeededTransformer(reg.get("embedding", "onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def randomized_kmedoids(X: torch.Tensor, C0: torch.Tensor, n_iter: int, *, beta: float = BETA, seed: int = SEED):
    """Randomized alternating k-medoids from ``C0``: assign every point to its nearest medoid,
    then replace each medoid by a point of its cluster drawn with probability
    ∝ exp(−β‖x_i − μ_j‖²) (μ_j the cluster mean) by the Gumbel-max trick, from a generator seeded
    with ``seed`` that draws ``(k, B, n)`` float64 uniforms per iteration. ``beta=inf``: the
    point nearest the mean. An empty cluster keeps its medoid."""
    beta = check_beta(beta)
    generator = torch.Generator().manual_seed(seed)

    def step(X, C):
        A = reference.assign(X, C)
        logits = reference.membership_logits(X, reference.update(X, A, C), A, 1.0 if math.isinf(beta) else beta)
        if not math.isinf(beta):
            B, k, n = logits.shape
            uniform = torch.rand(k, B, n, generator=generator, dtype=torch.float64).transpose(0, 1)
            logits = logits - torch.log(-torch.log(uniform)).to(logits)
        chosen = torch.gather(X, 1, logits.argmax(dim=-1).unsqueeze(-1).expand(-1, -1, X.shape[-1]))
        return A, torch.where((A.sum(dim=1) > 0).unsqueeze(-1), chosen, C)

    return reference.iterate(X, C0, n_iter, step)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="kmedoids",
            summary="Lloyd's mean, then a hard Gumbel-softmax hop that moves each center to a data point of its cluster",
            classical="randomized alternating k-medoids",
            build=build,
            reference=randomized_kmedoids,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            training={"model": {"gamma": math.inf}},
            centers_are_points=True,
        ),
    )
