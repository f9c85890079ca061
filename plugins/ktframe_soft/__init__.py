"""``soft``: soft (fuzzy) k-means, Lloyd's construction with a finite-temperature assignment.

One mechanism changes against ``lloyd``: the point→center attention is a softmax at inverse
temperature ``gamma``, so every point writes a soft assignment ``y_i = softmax_j(−γ‖x_i − c_j‖²)``.
The point reset stays exact (a hard arg-max: a point is its own nearest key), and the normalized
linear center update then computes ``c_j = Σ_i y_ij x_i / Σ_i y_ij``: one iteration of soft
k-means, i.e. EM for a mixture of isotropic Gaussians of shared variance 1/(2γ) and equal weights.
``gamma=inf`` is Lloyd's algorithm.
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    KMeansTransformer,
    Tolerance,
    Variant,
    accelerate,
    check_reset,
    coords,
    hookimpl,
    lloyd_family_layer,
    mean_head,
    reference,
    registry,
    stack,
)

GAMMA = 100.0


def build(*, d: int, k: int, n_layers: int, gamma: float = GAMMA, reset: str = "attention", share_weights: bool = True, fast: bool = True) -> KMeansTransformer:
    """``reset="identity"`` computes the two resets as the identity they are (exact at any gamma:
    they are hard arg-maxes of each token over itself), O(n) instead of O(n²) for the points."""
    check_reset(reset)
    width, xs, ys = d + k, coords(0, d), coords(d, d + k)
    identity = reset == "identity"
    make_layer = lambda: lloyd_family_layer(width, xs, ys, gamma=gamma, center_cross=mean_head(width, xs, ys), identity_resets=identity)  # noqa: E731
    model = KMeansTransformer(registry().get("embedding", "onehot")(), stack(make_layer, n_layers, share_weights), d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


def soft_kmeans(X: torch.Tensor, C0: torch.Tensor, n_iter: int, *, gamma: float = GAMMA):
    """Soft k-means from ``C0``: responsibilities ``softmax(−γ‖x − c‖²)`` over the centers, then
    every center the responsibility-weighted mean of all points. ``gamma=inf``: Lloyd."""
    if math.isinf(gamma):
        return reference.lloyd(X, C0, n_iter)

    def step(X, C):
        A = torch.softmax(-gamma * reference.sqdist(X, C), dim=-1)
        return A, reference.update(X, A, C)

    return reference.iterate(X, C0, n_iter, step)


def tolerance(dtype: torch.dtype, gamma: float) -> Tolerance:
    """Deterministic at every gamma. In float32 the logits ``−γ‖x − c‖²`` carry an absolute
    rounding error of about γ·1e-7, which moves the centers by about that much relative."""
    if dtype == torch.float64:
        return Tolerance(1e-9)
    return Tolerance(1e-4 if math.isinf(gamma) else max(1e-4, 1e-7 * gamma), agreement=0.99)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="soft",
            summary="finite-gamma softmax assignment, exact reset, normalized linear center update",
            classical="soft k-means (EM, shared isotropic variance)",
            build=build,
            reference=soft_kmeans,
            tolerance=tolerance,
            exact={"gamma": GAMMA, "dtype": "float64"},
            soft_memberships=True,
            sample_weights=True,
            training={"model": {"gamma": 100.0}},
        ),
    )
