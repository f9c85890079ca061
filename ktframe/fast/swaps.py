"""Swaps: a local search that moves a clustering's least useful center to where the error is
large, keeping the move only where it lowers the k-means objective.

Lloyd's algorithm stops at a fixed point of its two steps, often one where two centers share a
cluster while another cluster holds two: no step of it moves a center across the space. A swap
(after Kanungo et al. 2004's local search and Fritzke's breathing k-means) does:

1. the center whose removal raises the objective least, ``Σ wᵢ (second-nearest − nearest)`` over
   its points (an empty center first: it costs nothing), is taken out;
2. ``2 + ⌊ln k⌋`` points are drawn with probability ∝ ``wᵢ · distance²`` to the centers left
   (greedy k-means++'s draw) and the one that lowers the objective most becomes the new center;
3. ``steps`` Lloyd iterations from there; the swapped centers are kept only if their objective is
   below that of the centers before the swap, and the next swap starts from whichever was kept.

So the result is never worse than the centers it starts from. Distances are the exact differences
(:func:`ktframe.core.reference.sqdist`), objectives are summed in float64; a ``(B, n, k)`` and a
``(B, n, 2 + ⌊ln k⌋)`` array of distances are built per swap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ktframe.core import reference
from ktframe.fast import lloyd as fast


@dataclass(frozen=True)
class Swapped:
    """Centers after the swaps ``(B, k, d)``, their objective ``(B,)`` (float64) and how many
    swaps each task kept ``(B,)``."""

    centers: torch.Tensor
    objective: torch.Tensor
    kept: torch.Tensor


def swap(
    X: torch.Tensor,
    C: torch.Tensor,
    tries: int,
    steps: int,
    generator: torch.Generator | None = None,
    sample_weight: torch.Tensor | None = None,
    lloyd: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Swapped:
    """``tries`` swaps of the centers ``C (B, k, d)`` of the tasks ``X (B, n, d)``, each followed
    by ``steps`` Lloyd iterations (``lloyd(C)``, the new centers, where given: a weighted one
    for ``sample_weight (B, n)``), the draws from ``generator``."""
    B, n, d = X.shape
    k = C.shape[1]
    X64 = X.double()
    w = X64.new_ones(B, n) if sample_weight is None else sample_weight.double()
    iterate = lloyd if lloyd is not None else (lambda centers: fast.lloyd(X, centers, steps).centers)

    def distances(centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, n, k)`` squared distances to ``centers`` and the objective ``(B,)`` they give."""
        D = reference.sqdist(X64, centers.double())
        return D, (D.amin(dim=-1) * w).sum(dim=-1)

    # The kept centers' distances are carried from swap to swap: each swap computes those of its
    # moved centers once, for their objective and, where kept, for the next swap.
    best, kept = C, torch.zeros(B, dtype=torch.long, device=X.device)
    D, best_objective = distances(C)
    if k < 2:  # nothing to move a center away from
        return Swapped(best, best_objective, kept)
    trials = 2 + int(math.log(k))
    batch = torch.arange(B, device=X.device)
    for _ in range(tries):
        two, order = D.topk(2, dim=-1, largest=False)
        nearest, second, label = two[..., 0], two[..., 1], order[..., 0]
        cost = X64.new_zeros(B, k).scatter_add_(1, label, w * (second - nearest))
        drop = cost.argmin(dim=1)  # the lowest index at a tie
        left = torch.where(label == drop[:, None], second, nearest)  # each point's distance without it
        weights = w * left
        weights = torch.where(weights.sum(dim=1, keepdim=True) > 0, weights, w)  # every point on a center: draw by weight
        candidates = torch.multinomial(weights, trials, replacement=True, generator=generator)  # (B, trials)
        points = torch.gather(X64, 1, candidates.unsqueeze(-1).expand(-1, -1, d))
        potential = (torch.minimum(reference.sqdist(X64, points), left.unsqueeze(-1)) * w.unsqueeze(-1)).sum(dim=1)
        pick = candidates[batch, potential.argmin(dim=1)]
        moved = best.clone()
        moved[batch, drop] = X[batch, pick].to(best.dtype)
        moved = iterate(moved)
        moved_distances, moved_objective = distances(moved)
        better = moved_objective < best_objective
        best = torch.where(better[:, None, None], moved, best)
        D = torch.where(better[:, None, None], moved_distances, D)
        best_objective = torch.where(better, moved_objective, best_objective)
        kept += better
    return Swapped(best, best_objective, kept)
