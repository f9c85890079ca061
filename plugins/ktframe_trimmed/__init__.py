"""``trimmed``: per-cluster trimmed k-means, Lloyd's construction with a norm-max center update.

One mechanism changes against ``lloyd``: the center→point attention scores the points of the
center's own cluster by ``−‖c_j − x_i‖²`` (the ``cluster-euclidean`` score; −inf outside the
cluster) and weighs them with the ``normmax`` map, which is uniform over the top of the ranking
and exactly zero below it.

Trimming rule (the authors'): each center moves to the mean of its cluster without the
``⌊trim · n_j⌋`` points farthest from the current center, ``trim = 0.05`` by default; points are
still assigned to their nearest center, trimmed or not. ``trim=0`` is Lloyd's algorithm. Equal
distances at the cut keep the lower point index; an empty cluster keeps its center.
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    InputError,
    KMeansTransformer,
    Variant,
    accelerate,
    assignment_map,
    cluster_head,
    coords,
    exact_tolerance,
    hookimpl,
    lloyd_family_layer,
    reference,
    registry,
    stack,
)

TRIM = 0.05


def build(*, d: int, k: int, n_layers: int, gamma: float = math.inf, trim: float = TRIM, share_weights: bool = True, fast: bool = True) -> KMeansTransformer:
    """Hard assignments only: the norm-max update counts the members of a cluster, and a softmax
    assignment (finite gamma) would make every point a member of every cluster."""
    if not assignment_map(gamma)[0].argmax:
        raise InputError(f"trimmed needs hard assignments: its norm-max update counts the members of each cluster; use gamma=inf (got gamma={gamma:g})")
    reg = registry()
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)

    def make_layer():
        return lloyd_family_layer(width, xs, ys, gamma=gamma, center_cross=cluster_head(width, xs, ys, reg.get("map", "normmax")(trim=trim)))

    model = KMeansTransformer(reg.get("embedding", "onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def trimmed_kmeans(X: torch.Tensor, C0: torch.Tensor, n_iter: int, *, trim: float = TRIM):
    """Per-cluster trimmed k-means from ``C0``: assign every point to its nearest center, then
    move each center to the mean of its ``n_j − ⌊trim · n_j⌋`` points nearest to it."""

    def step(X, C):
        A = reference.assign(X, C)
        rank = reference.membership_logits(X, C, A, 1.0)  # −‖x − c‖² (+ log of a tie share), −inf outside
        new = C.clone()
        for b, j, members in reference.cluster_members(rank):
            keep = len(members) - math.floor(trim * len(members))
            nearest = members[rank[b, j, members].argsort(descending=True, stable=True)[:keep]]
            new[b, j] = X[b, nearest].mean(dim=0)
        return A, new

    return reference.iterate(X, C0, n_iter, step)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="trimmed",
            summary="norm-max center update over the center's own cluster: the farthest trim fraction gets zero weight",
            classical="per-cluster trimmed k-means",
            build=build,
            reference=trimmed_kmeans,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            training={"model": {"gamma": math.inf}},
        ),
    )
