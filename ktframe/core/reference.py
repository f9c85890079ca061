"""Classical clustering algorithms, written directly with tensor arithmetic (no attention), to
check the transformers against.

Conventions shared with the exact transformers (and documented in docs/exactness.md):
- a point equally near several centers is shared equally among them; its hard label is the lowest
  such index (as in scikit-learn);
- a center that no point chooses keeps its position (scikit-learn moves it to a far point instead);
- duplicate points are ordinary points: they always receive the same assignment.
All functions take batches of tasks: ``X (B, n, d)``, centers ``(B, k, d)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ktframe.core.result import ClusteringResult

# Numbers in one block of a blocked pass (here and on the fast path): a block stays in cache.
BLOCK_ELEMENTS = 1 << 20


def sqdist(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """``‖x_i − c_j‖²`` as ``(B, n, k)``, from the differences themselves, added coordinate by
    coordinate into blocks of points that stay in cache (a (B, n, k, d) array of differences
    summed over its last axis is 4–10× slower on CPU)."""
    B, n, d = X.shape
    k = C.shape[1]
    step = max(1, BLOCK_ELEMENTS // max(1, k * B))
    out = X.new_zeros(B, n, k)
    for i in range(0, n, step):
        block = out[:, i : i + step]
        for c in range(d):
            block.add_((X[:, i : i + step, c, None] - C[:, None, :, c]).square())
    return out


def squared_distances(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``‖q_i − k_j‖²`` through one matrix product; clamped at 0 against rounding."""
    kk = k.pow(2).sum(-1).unsqueeze(-2).expand(q.shape[0], q.shape[1], k.shape[1])
    out = torch.baddbmm(kk, q, k.transpose(-1, -2), alpha=-2.0)
    return out.add_(q.pow(2).sum(-1, keepdim=True)).clamp_min_(0.0)


def assign(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Lloyd's assignment step: ``(B, n, k)`` one-hot rows, split equally on exact ties."""
    D = sqdist(X, C)
    nearest = D == D.amin(dim=-1, keepdim=True)
    return nearest.to(X.dtype) / nearest.sum(dim=-1, keepdim=True).to(X.dtype)


def update(X: torch.Tensor, A: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Lloyd's update step: each center moves to the mean of its points; an empty one stays."""
    counts = A.sum(dim=1).unsqueeze(-1)  # (B, k, 1)
    sums = torch.bmm(A.transpose(1, 2), X)
    return torch.where(counts > 0, sums / counts.clamp_min(torch.finfo(X.dtype).tiny), C)


#: One iteration of a clustering algorithm: ``step(X, C) -> (assignments, new centers)``.
Step = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


def iterate(X: torch.Tensor, C0: torch.Tensor, n_iter: int, step: Step) -> ClusteringResult:
    """``n_iter`` iterations of ``step`` from ``C0``, every center kept in the trajectory."""
    C = C0
    trajectory = [C0]
    A = torch.zeros(X.shape[0], X.shape[1], C0.shape[1], dtype=X.dtype, device=X.device)
    for _ in range(n_iter):
        A, C = step(X, C)
        trajectory.append(C)
    return ClusteringResult(centers=C, assignments=A, trajectory=torch.stack(trajectory, dim=1))


def lloyd_step(X: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    A = assign(X, C)
    return A, update(X, A, C)


def lloyd(X: torch.Tensor, C0: torch.Tensor, n_iter: int) -> ClusteringResult:
    """``n_iter`` iterations of Lloyd's algorithm from ``C0``."""
    return iterate(X, C0, n_iter, lloyd_step)


def cluster_members(logits: torch.Tensor):
    """``(b, j, members)`` for every task b and cluster j with a point of finite logit in the
    ``(B, k, n)`` ``logits`` (as :func:`membership_logits` gives them): the indices of its points."""
    for b in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            members = torch.isfinite(logits[b, j]).nonzero().squeeze(-1)
            if len(members):
                yield b, j, members


def membership_logits(X: torch.Tensor, C: torch.Tensor, A: torch.Tensor, beta: float) -> torch.Tensor:
    """``−beta · ‖x_i − c_j‖² + log a_ij`` as ``(B, k, n)``: how the center-update variants score
    the points of cluster j (−inf outside it; a point shared at a tie enters with its share)."""
    return (-beta * sqdist(X, C) + A.log()).transpose(1, 2)


def objective(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """The k-means objective ``Σ_i min_j ‖x_i − c_j‖²`` of every task, ``(B,)``."""
    return sqdist(X, C).amin(dim=-1).sum(dim=-1)


def random_points(X: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``k`` distinct data points of each task, uniformly at random."""
    B, n, _ = X.shape
    order = torch.rand(B, n, generator=generator, device=X.device).argsort(dim=1)[:, :k]
    return torch.gather(X, 1, order.unsqueeze(-1).expand(-1, -1, X.shape[-1]))


def kmeans_plusplus(
    X: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
    n_local_trials: int | None = None,
) -> torch.Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii 2007), from the exact differences.

    Plain: each next center is a point drawn with probability ∝ its squared distance to the
    centers so far. Greedy (scikit-learn's default): draw ``2 + ⌊ln k⌋`` candidates that way and
    keep the one that lowers the objective most. When every point already sits on a center, the
    draw is uniform. :func:`ktframe.fast.seeding.kmeans_plusplus` draws the same way from
    matrix-product distances, as scikit-learn computes them.
    """
    B, n, d = X.shape
    trials = (2 + int(math.log(k))) if greedy and n_local_trials is None else (n_local_trials or 1)
    batch = torch.arange(B, device=X.device)
    first = torch.randint(n, (B,), generator=generator, device=X.device)
    centers = [X[batch, first]]
    closest = sqdist(X, centers[0].unsqueeze(1)).squeeze(-1)  # (B, n)
    for _ in range(1, k):
        total = closest.sum(dim=1, keepdim=True)
        probs = torch.where(total > 0, closest / total.clamp_min(torch.finfo(X.dtype).tiny), torch.ones_like(closest))
        candidates = torch.multinomial(probs, trials, replacement=True, generator=generator)  # (B, trials)
        cand_points = torch.gather(X, 1, candidates.unsqueeze(-1).expand(-1, -1, d))
        cand_closest = torch.minimum(closest.unsqueeze(1), sqdist(cand_points, X))  # (B, trials, n)
        best = cand_closest.sum(dim=-1).argmin(dim=1)
        centers.append(cand_points[batch, best])
        closest = cand_closest[batch, best]
    return torch.stack(centers, dim=1)
