"""``robust``: robust k-means with sparsemax-weighted centers, Lloyd's construction with a
sparsemax center update.

One mechanism changes against ``lloyd``: the center→point attention scores the points of the
center's own cluster by ``−β‖c_j − x_i‖²`` (the ``cluster-euclidean`` score at inverse temperature
β; −inf outside the cluster) and weighs them with ``sparsemax`` (from the ``entmax`` package):
``p_i = max(−β‖c_j − x_i‖² − τ_j, 0)`` with τ_j making them sum to 1. Weights fall with the
distance to the current center and a point farther than about ``D̄_j + 1/(β n_j)`` in squared
distance (``D̄_j`` the cluster's mean) gets exactly zero: it cannot pull the center.
``beta`` defaults to the authors' 0.01/√d; as β → 0 the update tends to the plain mean (Lloyd).
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    InputError,
    KMeansTransformer,
    Variant,
    accelerate,
    cluster_head,
    coords,
    exact_tolerance,
    hookimpl,
    lloyd_family_layer,
    reference,
    registry,
    stack,
)


def resolve_beta(beta: float | None, d: int) -> float:
    """``None`` is the authors' 0.01/√d."""
    if beta is None:
        return 0.01 / math.sqrt(d)
    if not (isinstance(beta, (int, float)) and 0 < beta < math.inf):
        raise InputError(f"beta must be a positive finite number (or None for 0.01/sqrt(d)); got {beta!r}")
    return float(beta)


def build(
    *, d: int, k: int, n_layers: int, gamma: float = math.inf, beta: float | None = None, share_weights: bool = True, fast: bool = True
) -> KMeansTransformer:
    reg = registry()
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)
    beta = resolve_beta(beta, d)

    def make_layer():
        return lloyd_family_layer(width, xs, ys, gamma=gamma, center_cross=cluster_head(width, xs, ys, reg.get("map", "sparsemax")(), gamma=beta))

    model = KMeansTransformer(reg.get("embedding", "onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def simplex_projection(z: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of the vector ``z`` onto the probability simplex (Held, Wolfe
    & Crowder 1974): ``max(z − τ, 0)`` with τ found from the sorted values."""
    u = z.sort(descending=True).values
    excess = u.cumsum(0) - 1
    ranks = torch.arange(1, len(z) + 1, dtype=z.dtype)
    support = int((u * ranks > excess).sum())
    return (z - excess[support - 1] / support).clamp_min(0)


def robust_kmeans(X: torch.Tensor, C0: torch.Tensor, n_iter: int, *, beta: float | None = None):
    """Robust k-means from ``C0``: assign every point to its nearest center, then move each
    center to the mean of its points weighted by the simplex projection of ``−β‖x_i − c_j‖²``."""
    beta = resolve_beta(beta, X.shape[-1])

    def step(X, C):
        A = reference.assign(X, C)
        logits = reference.membership_logits(X, C, A, beta)
        new = C.clone()
        for b, j, members in reference.cluster_members(logits):
            new[b, j] = simplex_projection(logits[b, j, members]) @ X[b, members]
        return A, new

    return reference.iterate(X, C0, n_iter, step)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="robust",
            summary="sparsemax center update over -beta * squared distance within the cluster: far points get zero weight",
            classical="robust k-means (sparsemax-weighted centers)",
            build=build,
            reference=robust_kmeans,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            training={"model": {"gamma": 100.0}},
        ),
    )
