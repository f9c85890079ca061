"""Nearest centers, the k-means objective and Lloyd's algorithm on the fast path: what
:mod:`ktframe.core.reference` defines, with every point's nearest center found by the fused
arg-max kernel (:func:`ktframe.kernels.cpu.argmax_dot` over ``2 x·c − ‖c‖²``), which never builds
the ``(n, k)`` distances and takes each cluster's sum in the same pass.

The kernel decides a point only where its nearest center wins by more than rounding could change
(near ties of float32 data it settles in float64). The points it leaves undecided — exact ties,
duplicate centers — and every point where the kernels do not apply (another device, autograd) are
decided from the exact differences, as the reference does: a tie is shared equally, its hard label
the lowest index. So the assignments are the reference's, except that a float32 near tie goes to
the center that is nearer in float64; sums are added in another order (float rounding).
``tests/test_reference.py`` checks each function against the reference.
"""

from __future__ import annotations

import torch

from ktframe.core import reference
from ktframe.core.reference import BLOCK_ELEMENTS
from ktframe.core.result import ClusteringResult
from ktframe.kernels import cpu as kernels


def _exact_split(points: torch.Tensor, C: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
    """``(u, k)``: the reference's assignment rows (one-hot, or shared equally at a tie) of the
    points ``(u, d)``, each among the centers ``C[task]`` of its own task, from the exact
    differences in float64, in blocks whose distances stay in cache."""
    k, d = C.shape[1:]
    step = max(1, BLOCK_ELEMENTS // (k * d))
    rows = [reference.assign(points[i : i + step, None].double(), C[task[i : i + step]].double()).squeeze(1) for i in range(0, len(points), step)]
    return torch.cat(rows).to(points.dtype)


def _on_kernels(X: torch.Tensor, C: torch.Tensor) -> bool:
    """Whether the kernels take the points ``X`` (B, n, d) against the centers ``C`` (B, k, d):
    a problem counted as the model counts it, by the numbers of its point and center streams
    (B, n + k, d + k), so that the labels and the objective of a fit are found where its steps ran."""
    B, n, d = X.shape
    k = C.shape[1]
    return kernels.usable(X, C, numbers=B * (n + k) * (d + k))


def nearest(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """``(B, n)``: the nearest center of every point, the lowest index among ties."""
    if _on_kernels(X, C):
        winners = kernels.argmax_dot(X, C, 2.0, -1.0)
        labels = winners.index
        if winners.undecided:
            rows = (labels < 0).nonzero(as_tuple=True)
            labels[rows] = _exact_split(X[rows], C, rows[0]).argmax(dim=-1)
        return labels
    B, n, d = X.shape
    return _exact_split(X.reshape(B * n, d), C, torch.arange(B, device=X.device).repeat_interleave(n)).argmax(dim=-1).reshape(B, n)


def inertia(X: torch.Tensor, C: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(B,)``: Σ‖x − c[label]‖² in one O(n·d) pass over the points and their labels' centers,
    block by block (no second copy of the data); through the kernel, summed in float64."""
    if _on_kernels(X, C):
        return kernels.inertia(X, C, labels).to(X.dtype)
    B, n, d = X.shape
    step = max(1, BLOCK_ELEMENTS // (B * d))
    total = X.new_zeros(B)
    for i in range(0, n, step):
        chosen = C.gather(1, labels[:, i : i + step, None].expand(-1, -1, d))
        total += (X[:, i : i + step] - chosen).square().sum(dim=(1, 2))
    return total


def objective(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """The k-means objective ``Σ_i min_j ‖x_i − c_j‖²`` of every task, ``(B,)``."""
    return inertia(X, C, nearest(X, C))


def _step(X: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """One Lloyd iteration through the kernel: the new centers, each point's winner (−1 where
    undecided) and, for the undecided points, ``(task, row, split)`` with their shared rows."""
    winners = kernels.argmax_dot(X, C, 2.0, -1.0, values=X)
    sums, sizes = winners.sums.to(X.dtype), winners.sizes.to(X.dtype)
    undecided = None
    if winners.undecided:
        task, row = (winners.index < 0).nonzero(as_tuple=True)
        points = X[task, row]
        split = _exact_split(points, C, task)  # (u, k)
        sums.index_add_(0, task, split.unsqueeze(-1) * points.unsqueeze(1))
        sizes.index_add_(0, task, split)
        undecided = (task, row, split)
    counts = sizes.unsqueeze(-1)
    centers = torch.where(counts > 0, sums / counts.clamp_min(torch.finfo(X.dtype).tiny), C)
    return centers, winners.index, undecided


def _assignments(index: torch.Tensor, undecided: tuple | None, k: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, n, k)`` one-hot rows of the winners, the undecided points' shared rows in place."""
    A = torch.nn.functional.one_hot(index.clamp(min=0), k).to(dtype)
    if undecided is not None:
        task, row, split = undecided
        A[task, row] = split
    return A


def lloyd(X: torch.Tensor, C0: torch.Tensor, n_iter: int) -> ClusteringResult:
    """``n_iter`` iterations of Lloyd's algorithm from ``C0``, every center kept in the trajectory;
    the ``(B, n, k)`` assignments are built once, for the last iteration."""
    if not kernels.usable(X, C0) or n_iter == 0:
        return reference.lloyd(X, C0, n_iter)
    trajectory, C = [C0], C0
    for _ in range(n_iter):
        C, index, undecided = _step(X, C)
        trajectory.append(C)
    return ClusteringResult(centers=C, assignments=_assignments(index, undecided, C0.shape[1], X.dtype), trajectory=torch.stack(trajectory, dim=1))
