"""Clustering metrics as torchmetrics ``Metric``s whose states are sums, so that DDP reduces them
exactly (a sum of sums), whatever the number of tasks each rank saw."""

from __future__ import annotations

import warnings

import torch
from torchmetrics import Metric
from torchmetrics.functional.clustering import adjusted_rand_score, normalized_mutual_info_score

from ktframe.core import reference


class _TaskMean(Metric):
    """The mean over tasks of a per-task value."""

    full_state_update = False
    higher_is_better: bool | None = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _add(self, values: torch.Tensor) -> None:
        self.total += values.detach().to(torch.float64).sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count.clamp_min(1)


class KMeansObjective(_TaskMean):
    """Mean over tasks of Σ_i min_j ‖x_i − c_j‖²."""

    higher_is_better = False

    def update(self, X: torch.Tensor, C: torch.Tensor) -> None:
        self._add(reference.objective(X, C))


class MeanLogObjective(_TaskMean):
    """Mean over tasks of log Σ_i min_j ‖x_i − c_j‖² (the paper's figure of merit)."""

    higher_is_better = False

    def update(self, X: torch.Tensor, C: torch.Tensor) -> None:
        self._add(reference.objective(X, C).log())


class RatioToLloyd(_TaskMean):
    """Mean over tasks of objective(model's centers) / objective(one Lloyd step from C0):
    below 1, the model's step beats Lloyd's."""

    higher_is_better = False

    def update(self, X: torch.Tensor, C: torch.Tensor, C0: torch.Tensor) -> None:
        lloyd = reference.lloyd(X, C0, 1).centers
        self._add(reference.objective(X, C) / reference.objective(X, lloyd))


class _LabelScore(_TaskMean):
    higher_is_better = True
    score = staticmethod(adjusted_rand_score)

    def update(self, X: torch.Tensor, C: torch.Tensor, labels: torch.Tensor) -> None:
        predicted = reference.assign(X, C).argmax(dim=-1)
        # torchmetrics' clustering scores build sparse contingency tables and torch warns on each
        # one; silenced for these calls only, not for the process that imports us.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled", category=UserWarning)
            scores = [self.score(p, t) for p, t in zip(predicted, labels)]
        self._add(torch.stack(scores))


class AdjustedRand(_LabelScore):
    """Mean over tasks of the adjusted Rand index against the mixture's true labels."""

    score = staticmethod(adjusted_rand_score)


class NormalizedMutualInfo(_LabelScore):
    """Mean over tasks of the normalized mutual information against the true labels."""

    score = staticmethod(normalized_mutual_info_score)
