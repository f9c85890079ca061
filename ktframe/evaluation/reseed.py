"""Lloyd's algorithm as the authors' evaluation runs it (``lloyd-reseed`` in ``ktframe eval``).

ktframe's Lloyd keeps an emptied cluster's center where it was. The authors' (``lloyds_iters_batched``
in their ``utils.py``) takes the mean of no points, a NaN center, and replaces it with a data point of
the task drawn uniformly at random (several emptied clusters of one task: distinct points, in the
order of the clusters). Here each task draws its points from a generator of its own, seeded with
that task's seed, so that the run is the same whatever the batch, and the model, the other methods
and the task draws are untouched by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ktframe.fast import lloyd as fast


def lloyd_reseed(X: torch.Tensor, C0: torch.Tensor, steps: int, seeds: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` iterations of Lloyd's algorithm from ``C0`` on the tasks ``X`` ``(B, n, d)``, a
    cluster left without points re-seeded at a data point of its task drawn uniformly at random
    from the generator seeded with the task's ``seeds[b]``. The trajectory ``(B, steps + 1, k, d)``
    and, per task, whether any cluster was re-seeded ``(B,)``. Where no cluster empties, each step
    is :func:`ktframe.fast.lloyd.lloyd`'s to the last bit."""
    C, trajectory = C0, [C0]
    generators: dict[int, torch.Generator] = {}
    reseeded = torch.zeros(X.shape[0], dtype=torch.bool)
    for _ in range(steps):
        result = fast.lloyd(X, C, 1)
        C = result.centers
        empty = result.assignments.sum(dim=1) == 0  # (B, k): no point, not even a share of a tie
        tasks = empty.any(dim=1).nonzero().flatten().tolist()
        if tasks:
            C = C.clone()
        for b in tasks:
            if b not in generators:
                generators[b] = torch.Generator().manual_seed(seeds[b])
            clusters = empty[b].nonzero().flatten()
            C[b, clusters] = X[b, torch.randperm(X.shape[1], generator=generators[b])[: len(clusters)]].to(C.dtype)
            reseeded[b] = True
        trajectory.append(C)
    return torch.stack(trajectory, dim=1), reseeded
