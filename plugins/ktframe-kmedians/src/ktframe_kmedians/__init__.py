"""``kmedians``: k-medians (L1 assignment, coordinate-wise median) as a k-means transformer.

Against ktframe's ``lloyd``, two mechanisms change:

- the point→center attention scores ``−γ‖x_i − c_j‖₁`` (the ``manhattan`` score): each point
  writes the index of its nearest center in L1 distance;
- the center update is a group of d heads, one per coordinate t: head t scores the points of the
  center's cluster by their coordinate t (the ``cluster-coordinate`` score, −inf outside the
  cluster) and the ``median`` map puts weight on the middle of that ranking, so it writes the
  median of coordinate t (the mean of the two middle values for an even count).

The resets are ktframe's. ``gamma=inf`` is the exact hard limit, the only setting this plugin
claims (its ``Variant.exact``, with float64); an empty cluster keeps its center.
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    AttentionMap,
    ClusteringResult,
    HeadGroup,
    KMeansTransformer,
    MapOutput,
    Score,
    Variant,
    accelerate,
    coords,
    exact_tolerance,
    fixed_head,
    hookimpl,
    lloyd_family_layer,
    reference,
    registry,
    stack,
)


class Manhattan(Score):
    description = "-gamma * ||q - k||_1 (L1-distance attention)"

    def __call__(self, q, k, gamma):
        return torch.cdist(q, k, p=1).mul_(-gamma)


class ClusterCoordinate(Score):
    """``k_0 + log(q · k_{1:})``: the key's first coordinate for the points of the query's
    cluster (the query is a center's index, the rest of the key a point's assignment), −inf for
    the others. No temperature: the ``median`` map only ranks."""

    description = "k_0 + log(q . k_rest): a point's coordinate within the query's cluster"

    def __call__(self, q, k, gamma):
        gate = torch.bmm(q, k[..., 1:].transpose(1, 2))
        return torch.where(gate > 0, k[..., 0].unsqueeze(1) + gate.clamp_min(torch.finfo(gate.dtype).tiny).log(), -math.inf)


class Median(AttentionMap):
    """Weight 1 on the middle key of those with finite logits, ranked by logit, or 1/2 on each of
    the two middle ones when their number is even; a query with none keeps its own value."""

    description = "uniform over the middle one or two keys (by logit) among those with finite logits"

    def __call__(self, logits):
        finite = torch.isfinite(logits)
        count = finite.sum(dim=-1, keepdim=True)
        order = torch.where(finite, logits, math.inf).argsort(dim=-1, stable=True)  # ascending, −inf last
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(logits.shape[-1], device=logits.device).expand_as(order))
        low, high = (count - 1).div(2, rounding_mode="floor"), count.div(2, rounding_mode="floor")
        weights = ((rank == low).to(logits.dtype) + (rank == high).to(logits.dtype)) / 2
        empty = count == 0
        return MapOutput(weights=weights.masked_fill(empty, 0.0), stay=empty.to(logits.dtype) if bool(empty.any()) else None)


def build(*, d: int, k: int, n_layers: int, gamma: float = math.inf, share_weights: bool = True, fast: bool = True) -> KMeansTransformer:
    reg = registry()
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)

    def median_of(t: int):
        return fixed_head(width, q=ys, k=[t, *ys], v=[t], score=reg.get("score", "cluster-coordinate")(), attention_map=reg.get("map", "median")())

    def make_layer():
        medians = HeadGroup(width, [median_of(t) for t in xs])
        return lloyd_family_layer(width, xs, ys, gamma=gamma, center_cross=medians, score=reg.get("score", "manhattan")())

    model = KMeansTransformer(reg.get("embedding", "onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def kmedians(X: torch.Tensor, C0: torch.Tensor, n_iter: int) -> ClusteringResult:
    """k-medians from ``C0``: every point to its nearest center in L1 distance (ties shared
    equally), every center to the coordinate-wise median of its points; an empty one stays."""

    def step(X, C):
        D = (X[:, :, None, :] - C[:, None, :, :]).abs().sum(-1)
        nearest = D == D.amin(dim=-1, keepdim=True)
        A = nearest.to(X.dtype) / nearest.sum(dim=-1, keepdim=True).to(X.dtype)
        new = C.clone()
        for b in range(C.shape[0]):
            for j in range(C.shape[1]):
                members = X[b, A[b, :, j] > 0]
                if len(members):
                    new[b, j] = members.quantile(0.5, dim=0)
        return A, new

    return reference.iterate(X, C0, n_iter, step)


@hookimpl
def ktframe_register_scores(register):
    register("manhattan", Manhattan)
    register("cluster-coordinate", ClusterCoordinate)


@hookimpl
def ktframe_register_maps(register):
    register("median", Median)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="kmedians",
            summary="L1-distance assignment, one median attention head per coordinate",
            classical="k-medians",
            build=build,
            reference=kmedians,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            training={"model": {"gamma": math.inf}},
        ),
    )
