"""The training loss: a smooth upper bound of the k-means objective."""

from __future__ import annotations

import torch

from ktframe.core.reference import squared_distances


def softmin_bound(X: torch.Tensor, C: torch.Tensor, lam: float) -> torch.Tensor:
    """For every point, its squared distances to the centers weighted by softmin(λ · distances),
    summed over points and averaged over tasks. It bounds Σ_i min_j ‖x_i − c_j‖² from above and
    tends to it as λ grows, but unlike the min it gives every center a gradient."""
    # ‖x‖² − 2 x·c + ‖c‖² through one product: the loss only weighs distances, it does not rank
    # near-ties, and the product (and its gradient) costs a fraction of the (B, n, k, d) differences.
    D = squared_distances(X, C)  # (B, n, k)
    weights = torch.softmax(-lam * D, dim=-1)
    return (weights * D).sum(dim=(1, 2)).mean()
