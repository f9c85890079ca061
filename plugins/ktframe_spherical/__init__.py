"""``spherical``: spherical k-means (Dhillon & Modha 2001), Lloyd's construction on the sphere.

One mechanism changes against ``lloyd``: a token-wise normalisation of the data part (the
``sphere`` norm, RMSNorm-style without a gain) puts points and centers on the unit sphere
wherever the attention reads their data: the queries and keys of the point→center head (a
QK-norm) and the values the center update averages; the model reads its centers out normalised
too. The assignment is then the dot-product (cosine) arg-max ``argmax_j x̂_i · ĉ_j``; the
normalized linear center update writes the mean of the cluster's normalised points, and its
normalisation is the new center. A center whose cluster is empty keeps its direction. The resets
read the raw data: in float32, points a few 1e-4 rad apart are no longer distinct once
normalised. At finite ``gamma`` the assignment is a softmax over ``γ x̂·ĉ``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ktframe.plugin import (
    KMeansTransformer,
    OneHot,
    Variant,
    accelerate,
    coords,
    exact_tolerance,
    hookimpl,
    lloyd_family_layer,
    mean_head,
    reference,
    registry,
    stack,
)


class SphereReadout(OneHot):
    """``[x; y]`` and ``[c; e_j]`` as ``onehot``; the centers are read out on the unit sphere."""

    description = "onehot tokens; centers read out normalised to unit length"

    def read_centers(self, center_tokens, d):
        return F.normalize(center_tokens[..., :d], dim=-1)


def build(*, d: int, k: int, n_layers: int, gamma: float = math.inf, share_weights: bool = True, fast: bool = True) -> KMeansTransformer:
    reg = registry()
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)
    sphere = reg.get("norm", "sphere")

    def make_layer():
        return lloyd_family_layer(
            width, xs, ys, gamma=gamma, center_cross=mean_head(width, xs, ys, v_norm=sphere), score=reg.get("score", "dot")(), qk_norm=sphere
        )

    model = KMeansTransformer(reg.get("embedding", "sphere-onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def spherical_kmeans(X: torch.Tensor, C0: torch.Tensor, n_iter: int):
    """Spherical k-means from ``C0``: points and centers normalised to unit length, each point to
    the center of largest cosine (ties shared equally), each center the normalised sum of its
    points; an empty cluster keeps its (normalised) center."""
    U = F.normalize(X, dim=-1)

    def step(X, C):
        C = F.normalize(C, dim=-1)
        cosines = torch.bmm(U, C.transpose(1, 2))
        best = cosines == cosines.amax(dim=-1, keepdim=True)
        A = best.to(X.dtype) / best.sum(dim=-1, keepdim=True).to(X.dtype)
        counts = A.sum(dim=1).unsqueeze(-1)
        sums = torch.bmm(A.transpose(1, 2), U)
        return A, torch.where(counts > 0, F.normalize(sums, dim=-1), C)

    return reference.iterate(X, C0, n_iter, step)


@hookimpl
def ktframe_register_embeddings(register):
    register("sphere-onehot", SphereReadout)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="spherical",
            summary="data part normalised to the unit sphere, dot-product (cosine) assignment, re-normalised mean",
            classical="spherical k-means (Dhillon & Modha)",
            build=build,
            reference=spherical_kmeans,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            sample_weights=True,
            training={"model": {"gamma": 30.0}},
        ),
    )
