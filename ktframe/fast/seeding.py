"""k-means++ seeding on the fast path: the draws of
:func:`ktframe.clustering.reference.kmeans_plusplus`, with the distances to the candidates from one
matrix product per step (``‖x‖² − 2 x·c + ‖c‖²``, as scikit-learn computes them) instead of the
exact differences. ``TransformerKMeans(init="k-means++")`` seeds with it; the evaluation's
baselines seed with the reference. ``tests/test_reference.py`` checks the two choose alike.
"""

from __future__ import annotations

import math

import torch

from ktframe.clustering.reference import BLOCK_ELEMENTS


def _candidate_sqdist(X: torch.Tensor, sq_norms: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``‖x_i − x_c‖²`` as ``(B, n, t)`` for the candidate points ``index (B, t)`` of X, by
    ``‖x‖² − 2 x·c + ‖c‖²`` (one matrix product, in X's dtype, as scikit-learn computes them),
    into ``out`` where given.

    Exact up to rounding of the order of ``eps · (‖x‖² + ‖c‖²)``; the values are not yet clamped
    (see :func:`_settle`)."""
    points = torch.gather(X, 1, index.unsqueeze(-1).expand(-1, -1, X.shape[-1]))
    D = torch.baddbmm(sq_norms.unsqueeze(-1), X, points.transpose(1, 2), alpha=-2.0, out=out)
    return D.add_(torch.gather(sq_norms, 1, index).unsqueeze(1))


def _settle(D: torch.Tensor, sq_norms: torch.Tensor, chosen: torch.Tensor, d: int) -> torch.Tensor:
    """The closest distances ``D (B, n)`` after adding the data point ``chosen (B,)``, with every
    value within rounding of 0 (``≤ (d + 2) · eps · (‖x‖² + ‖c‖²)``, negative ones included) set to
    exactly 0: a chosen point, and any duplicate of it, then has weight 0, as with the exact
    differences."""
    tol = (sq_norms + torch.gather(sq_norms, 1, chosen.unsqueeze(1))).mul_((d + 2) * torch.finfo(D.dtype).eps)
    D = D.masked_fill_(D <= tol, 0.0)
    return D.scatter_(1, chosen.unsqueeze(1), 0.0)


def kmeans_plusplus(
    X: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
    n_local_trials: int | None = None,
) -> torch.Tensor:
    """k-means++ seeding as :func:`ktframe.clustering.reference.kmeans_plusplus` defines it, plain
    or greedy, from matrix-product distances.

    Speed: the distances to the candidates come from one matrix product per step
    (``‖x‖² − 2 x·c + ‖c‖²`` in X's dtype, as scikit-learn computes them), kept against a running
    closest-distance array ``(B, n)``: a step costs ``O(B·n·d·trials)`` in BLAS and a few passes
    over ``(B, n, trials)``, reused from step to step. Exactness: the draws and choices are those of the exact differences
    ``Σ (x − c)²`` except where two candidates' potentials (or a point's weight) differ only by
    float rounding; a distance within rounding of 0 is exactly 0, so a chosen point (and its
    duplicates) is never drawn again while another point is left. For a given
    ``torch.Generator`` (and device) the result is deterministic.
    """
    B, n, d = X.shape
    trials = (2 + int(math.log(k))) if greedy and n_local_trials is None else (n_local_trials or 1)
    batch = torch.arange(B, device=X.device)
    first = torch.randint(n, (B,), generator=generator, device=X.device)
    chosen = [first]
    step = max(1, BLOCK_ELEMENTS // max(1, B * d))  # by blocks: no (B, n, d) temporary
    sq_norms = torch.cat([X[:, i : i + step].square().sum(dim=-1) for i in range(0, n, step)], dim=1)  # (B, n)
    closest = _settle(_candidate_sqdist(X, sq_norms, first.unsqueeze(1)).squeeze(-1), sq_norms, first, d)
    buffer = X.new_empty(B, n, trials)  # reused: a fresh (B, n, t) array every step costs its page faults
    for _ in range(1, k):
        total = closest.sum(dim=1, keepdim=True)
        weights = closest if bool((total > 0).all()) else torch.where(total > 0, closest, torch.ones_like(closest))
        candidates = torch.multinomial(weights, trials, replacement=True, generator=generator)  # (B, trials)
        cand_closest = torch.minimum(_candidate_sqdist(X, sq_norms, candidates, out=buffer), closest.unsqueeze(-1), out=buffer)
        best = cand_closest.sum(dim=1).argmin(dim=1)
        closest = cand_closest[batch, :, best]
        pick = candidates[batch, best]
        closest = _settle(closest, sq_norms, pick, d)
        chosen.append(pick)
    index = torch.stack(chosen, dim=1)  # (B, k)
    return torch.gather(X, 1, index.unsqueeze(-1).expand(-1, -1, d))
