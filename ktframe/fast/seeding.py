"""k-means++ seeding on the fast path: the draws of
:func:`ktframe.core.reference.kmeans_plusplus`, with the distances to the candidates from one
matrix product per step (``‖x‖² − 2 x·c + ‖c‖²``, as scikit-learn computes them) instead of the
exact differences, and on the CPU each step's passes over them by numba kernels (:func:`_potentials`,
:func:`_take`). ``TransformerKMeans(init="k-means++")`` seeds with it; the evaluation's baselines
seed with the reference. ``tests/test_reference.py`` checks the two choose alike.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ktframe.core.reference import BLOCK_ELEMENTS
from ktframe.fast import memory
from ktframe.kernels import cpu as kernels
from ktframe.kernels.jit import kernel, prange

# Points a kernel worker adds up at a time: the potentials' partial sums, added in block order.
SUM_BLOCK = 4096


def _candidate_sqdist(X: torch.Tensor, sq_norms: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``‖x_i − x_c‖²`` as ``(B, n, t)`` for the candidate points ``index (B, t)`` of X, by
    ``‖x‖² − 2 x·c + ‖c‖²`` (one matrix product, in X's dtype, as scikit-learn computes them),
    into ``out`` where given.

    Exact up to rounding of the order of ``eps · (‖x‖² + ‖c‖²)``; the values are not yet clamped
    (see :func:`_settle`)."""
    D = _products(X, sq_norms, index, out)
    return D.add_(torch.gather(sq_norms, 1, index).unsqueeze(1))


def _products(X: torch.Tensor, sq_norms: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``‖x_i‖² − 2 x_i·x_c`` as ``(B, n, t)``: :func:`_candidate_sqdist` but for ``‖c‖²``."""
    points = torch.gather(X, 1, index.unsqueeze(-1).expand(-1, -1, X.shape[-1]))
    return torch.baddbmm(sq_norms.unsqueeze(-1), X, points.transpose(1, 2), alpha=-2.0, out=out)


def _settle(D: torch.Tensor, sq_norms: torch.Tensor, chosen: torch.Tensor, d: int) -> torch.Tensor:
    """The closest distances ``D (B, n)`` after adding the data point ``chosen (B,)``, with every
    value within rounding of 0 (``≤ (d + 2) · eps · (‖x‖² + ‖c‖²)``, negative ones included) set to
    exactly 0: a chosen point, and any duplicate of it, then has weight 0, as with the exact
    differences."""
    tol = (sq_norms + torch.gather(sq_norms, 1, chosen.unsqueeze(1))).mul_((d + 2) * torch.finfo(D.dtype).eps)
    D = D.masked_fill_(D <= tol, 0.0)
    return D.scatter_(1, chosen.unsqueeze(1), 0.0)


def _take(D: torch.Tensor, best: torch.Tensor, sq_norms: torch.Tensor, chosen: torch.Tensor, closest: torch.Tensor, d: int) -> torch.Tensor:
    """The closest distances once the candidate ``best (B,)`` of ``D (B, n, t)``, as
    :func:`_potentials` leaves it, is added (the point ``chosen (B,)``): its column, settled as
    :func:`_settle` does. On the CPU a kernel writes them over ``closest`` in one pass: no new
    ``(B, n)`` array a step, whose freed memory the allocator may keep from the system."""
    if not kernels.usable(D, closest):
        return _settle(D[torch.arange(D.shape[0], device=D.device), :, best], sq_norms, chosen, d)
    scale = kernels._array(D).dtype.type((d + 2) * torch.finfo(D.dtype).eps)  # in X's dtype, as _settle's
    with kernels._using(kernels._thread_count(closest.numel())):
        _settle_column(kernels._array(D), best.numpy(), kernels._array(sq_norms), chosen.numpy(), scale, kernels._array(closest))
    return closest


@kernel(parallel=True, nogil=True)
def _settle_column(D, best, sq_norms, chosen, scale, closest):
    B, n = closest.shape
    for at in prange(B * n):
        b, i = at // n, at % n
        value = D[b, i, best[b]]
        if value <= (sq_norms[b, i] + sq_norms[b, chosen[b]]) * scale or i == chosen[b]:
            value = 0.0
        closest[b, i] = value


def _squared_norms(X: torch.Tensor) -> torch.Tensor:
    """``‖x‖²`` of every point, ``(B, n)``; on the CPU by a kernel, elsewhere by blocks: no
    ``(B, n, d)`` temporary, whose freed memory the allocator may keep from the system."""
    B, n, d = X.shape
    if not kernels.usable(X):
        step = max(1, BLOCK_ELEMENTS // max(1, B * d))
        return torch.cat([X[:, i : i + step].square().sum(dim=-1) for i in range(0, n, step)], dim=1)
    out = X.new_empty(B, n)
    with kernels._using(kernels._thread_count(X.numel())):
        _row_squares(kernels._array(X), kernels._array(out))
    return out


@kernel(parallel=True, nogil=True)
def _row_squares(X, out):
    B, n, d = X.shape
    for at in prange(B * n):
        b, i = at // n, at % n
        total = X[b, i, 0] - X[b, i, 0]  # a zero of X's dtype
        for c in range(d):
            total += X[b, i, c] * X[b, i, c]
        out[b, i] = total


def _potentials(D: torch.Tensor, cand_norms: torch.Tensor, closest: torch.Tensor) -> torch.Tensor:
    """``D`` (B, n, t) holding ``‖x‖² − 2 x·c`` for each candidate c becomes, in place, each
    point's closest distance were c added, ``min(D + ‖c‖², closest)``; returns their sums
    ``(B, t)``, the candidates' potentials. On the CPU one pass of a kernel over D (the sums
    taken by blocks of points in a fixed order: the same whatever the number of threads)."""
    if not kernels.usable(D):
        D.add_(cand_norms.unsqueeze(1))
        return torch.minimum(D, closest.unsqueeze(-1), out=D).sum(dim=1)
    B, n, t = D.shape
    partial = np.zeros((B, -(-n // SUM_BLOCK), t))
    with kernels._using(kernels._thread_count(D.numel())):
        _fold(kernels._array(D), kernels._array(cand_norms), kernels._array(closest), partial, SUM_BLOCK)
    return torch.from_numpy(partial.sum(axis=1))


@kernel(parallel=True, nogil=True)
def _fold(D, cand_norms, closest, partial, block):
    B, n, t = D.shape
    blocks = partial.shape[1]
    for job in prange(B * blocks):
        b, blk = job // blocks, job % blocks
        for i in range(blk * block, min(n, (blk + 1) * block)):
            near = closest[b, i]
            for j in range(t):
                value = D[b, i, j] + cand_norms[b, j]
                if not value < near:  # min(value, near) as torch.minimum: near where equal
                    value = near
                D[b, i, j] = value
                partial[b, blk, j] += value


def kmeans_plusplus(
    X: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
    n_local_trials: int | None = None,
) -> torch.Tensor:
    """k-means++ seeding as :func:`ktframe.core.reference.kmeans_plusplus` defines it, plain
    or greedy, from matrix-product distances.

    Speed: the distances to the candidates come from one matrix product per step
    (``‖x‖² − 2 x·c + ‖c‖²`` in X's dtype, as scikit-learn computes them), kept against a running
    closest-distance array ``(B, n)``: a step costs ``O(B·n·d·trials)`` in BLAS and one pass over
    the ``(B, n, trials)`` products (:func:`_potentials`), reused from step to step. Exactness:
    the draws and choices are those of the exact differences
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
    sq_norms = _squared_norms(X)  # (B, n)
    closest = _settle(_candidate_sqdist(X, sq_norms, first.unsqueeze(1)).squeeze(-1), sq_norms, first, d)
    buffer = X.new_empty(B, n, trials)  # reused: a fresh (B, n, t) array every step costs its page faults
    for _ in range(1, k):
        total = closest.sum(dim=1, keepdim=True)
        weights = closest if bool((total > 0).all()) else torch.where(total > 0, closest, torch.ones_like(closest))
        candidates = torch.multinomial(weights, trials, replacement=True, generator=generator)  # (B, trials)
        potentials = _potentials(_products(X, sq_norms, candidates, out=buffer), torch.gather(sq_norms, 1, candidates), closest)
        best = potentials.argmin(dim=1)
        pick = candidates[batch, best]
        closest = _take(buffer, best, sq_norms, pick, closest, d)
        chosen.append(pick)
    memory.release_freed()  # what the draws' buffers left (see there)
    index = torch.stack(chosen, dim=1)  # (B, k)
    return torch.gather(X, 1, index.unsqueeze(-1).expand(-1, -1, d))
