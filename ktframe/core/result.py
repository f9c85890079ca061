"""What a clustering run returns, from the transformer and from the classical references alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ClusteringResult:
    """``centers (B, k, d)``, ``assignments (B, n, k)`` (rows sum to 1; a point tied between
    centers is shared equally), ``trajectory (B, T + 1, k, d)`` with the initial centers first,
    and ``n_iter (B,)``: for each task, the number of steps up to the first that left it exactly
    as it was (that step included; T if none did), as scikit-learn's ``n_iter_`` counts Lloyd
    iterations; None where not counted."""

    centers: torch.Tensor
    assignments: torch.Tensor
    trajectory: torch.Tensor
    n_iter: torch.Tensor | None = None

    @property
    def labels(self) -> torch.Tensor:
        """Hard labels ``(B, n)``: the largest assignment, the lowest index among ties."""
        return self.assignments.argmax(dim=-1)
