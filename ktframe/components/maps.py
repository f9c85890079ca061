"""Attention maps: logits ``(B, m, n)`` to weights over the keys.

A map may leave part of a query's mass on the query itself (``stay``): the normalized linear map
does so for a query that no key matches, which is how an empty cluster keeps its center.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ktframe.hookspecs import Register, hookimpl


@dataclass
class MapOutput:
    """Weights as a dense ``(B, m, n)`` tensor, or sparsely as ``index (B, m)``: every query puts
    weight 1 on one key, except the rows listed in ``ties = (rows (r, 2), weights (r, n))``, whose
    weights are given densely. ``stay (B, m, 1)``, when present, is the mass kept on the query."""

    weights: torch.Tensor | None = None
    index: torch.Tensor | None = None
    ties: tuple[torch.Tensor, torch.Tensor] | None = None
    stay: torch.Tensor | None = None


class AttentionMap:
    linear = False  # weights are a fixed linear function of the logits (row normalisation)
    shift_invariant = False  # adding a constant to all logits of a query changes nothing
    softmax = False  # the weights are exactly softmax(logits): a fused attention kernel may apply the map
    description = ""

    def __call__(self, logits: torch.Tensor) -> MapOutput:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Softmax(AttentionMap):
    description = "softmax over the keys (the temperature lives in the score)"
    shift_invariant = True
    softmax = True

    def __call__(self, logits):
        return MapOutput(weights=torch.softmax(logits, dim=-1))


class Hardmax(AttentionMap):
    """The gamma -> infinity limit of softmax: uniform over the keys of maximal logit.

    With ``threshold``, keys below it never win; a query with no key at or above the threshold
    keeps its own value (``stay``).
    """

    description = "arg-max over the keys, ties averaged; optional threshold below which no key wins"

    def __init__(self, threshold: float | None = None) -> None:
        self.threshold = threshold
        self.shift_invariant = threshold is None

    def __call__(self, logits):
        # amax, a global count and an int8 arg-max: on CPU each is several times faster than
        # max-with-indices and a per-row any over the same block.
        best = logits.amax(dim=-1, keepdim=True)
        winners = logits == best
        if self.threshold is not None:
            supported = best >= self.threshold
            if not bool(supported.all()):
                winners &= supported
                weights = winners.to(logits.dtype) / winners.sum(dim=-1, keepdim=True).clamp_min(1).to(logits.dtype)
                return MapOutput(weights=weights, stay=(~supported).to(logits.dtype))
        index = winners.view(torch.int8).argmax(dim=-1)
        if int(torch.count_nonzero(winners)) == index.numel():
            return MapOutput(index=index)
        # Exact ties are rare: spell out only the tied rows.
        tied = torch.count_nonzero(winners, dim=-1) > 1
        tie_winners = winners[tied].to(logits.dtype)
        return MapOutput(index=index, ties=(tied.nonzero(), tie_winners / tie_winners.sum(dim=-1, keepdim=True)))

    def __repr__(self) -> str:
        return f"Hardmax(threshold={self.threshold})"


class Normalize(AttentionMap):
    """Weights proportional to non-negative logits. A query whose logits are all zero (no key
    matches) keeps its own value instead of dividing by zero."""

    description = "logits divided by their sum; a query with zero total keeps its own value"
    linear = True

    def __call__(self, logits):
        mass = logits.sum(dim=-1, keepdim=True)
        empty = mass == 0
        weights = logits / torch.where(empty, torch.ones_like(mass), mass)
        return MapOutput(weights=weights, stay=empty.to(logits.dtype) if bool(empty.any()) else None)


@hookimpl
def ktframe_register_maps(register: Register) -> None:
    register("softmax", Softmax)
    register("hardmax", Hardmax)
    register("normalize", Normalize)
