"""Attention scores: queries ``(B, m, e)`` and keys ``(B, n, e)`` to logits ``(B, m, n)``."""

from __future__ import annotations

import math

import torch

from ktframe.core.reference import sqdist, squared_distances
from ktframe.hooks.hookspecs import Register, hookimpl


class Score:
    """Base class. ``linear`` scores are bilinear in (q, k) with no temperature, which lets a
    head pair them with a linear map and compute ``q (Kᵀ V)`` instead of ``(q Kᵀ) V``."""

    linear = False
    description = ""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, gamma: float) -> torch.Tensor:
        raise NotImplementedError

    def up_to_query_constant(self, q: torch.Tensor, k: torch.Tensor, gamma: float) -> torch.Tensor:
        """The logits plus any amount constant over the keys of each query: all a shift-invariant
        map (softmax, arg-max) needs, and sometimes cheaper."""
        return self(q, k, gamma)

    def dot_product_form(self, gamma: float) -> tuple[float, float] | None:
        """``(a, b)`` such that the logits are ``a (q·k) + b ‖k‖²`` plus a constant per query, for
        scores that a fused dot-product attention kernel can compute with a per-key bias; None
        for the others."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Euclidean(Score):
    description = "-gamma * ||q - k||^2"

    def __call__(self, q, k, gamma):
        return squared_distances(q, k).mul_(-gamma)

    def up_to_query_constant(self, q, k, gamma):
        # −γ‖q − k‖² + γ‖q‖² = 2γ q·k − γ‖k‖²: one fused matrix product, no pass for ‖q‖².
        kk = k.pow(2).sum(-1).unsqueeze(-2).expand(q.shape[0], q.shape[1], k.shape[1])
        return torch.baddbmm(kk, q, k.transpose(-1, -2), beta=-gamma, alpha=2.0 * gamma)

    def dot_product_form(self, gamma):
        return 2.0 * gamma, -gamma


class Dot(Score):
    description = "gamma * q . k"

    def __call__(self, q, k, gamma):
        return torch.bmm(q, k.transpose(-1, -2)).mul_(gamma)

    def dot_product_form(self, gamma):
        return gamma, 0.0


class Linear(Score):
    description = "q . k, no temperature (normalized linear attention with the 'normalize' map)"
    linear = True

    def __call__(self, q, k, gamma):
        return torch.bmm(q, k.transpose(-1, -2))


class ClusterEuclidean(Score):
    """``−γ‖q_x − k_x‖² + log(q_y · k_y)``: a center's score for the points of its own cluster.

    The last ``gate`` coordinates of queries and keys are a center's one-hot index and a point's
    assignment, so a point outside the cluster (``q_y · k_y ≤ 0``) scores −inf and a point shared
    between clusters takes the log of its share. With soft assignments the log is a soft
    membership: a softmax over these logits weighs point i by ``y_ij · exp(−γ‖c_j − x_i‖²)``.
    Distances come from the differences themselves, not from ``‖q‖² − 2 q·k + ‖k‖²``: the maps
    that rank points by them (trimming, sampling) must rank them as the classical algorithms do.
    """

    description = (
        "-gamma * ||q_x - k_x||^2 + log(q_y . k_y): distances to the points of the query's cluster (the last `gate` coordinates are index / assignment)"
    )

    def __init__(self, gate: int) -> None:
        if gate < 1:
            raise ValueError(f"cluster-euclidean needs gate >= 1 assignment coordinates; got {gate}")
        self.gate = gate

    def __call__(self, q, k, gamma):
        g = self.gate
        distances = sqdist(k[..., :-g], q[..., :-g]).transpose(1, 2)  # (B, m, n), chunked over the keys
        gate = torch.bmm(q[..., -g:], k[..., -g:].transpose(1, 2))
        # log(0) = −inf through a `where`, not through log itself, whose gradient there is inf·0 = NaN.
        member = gate > 0
        membership = torch.where(member, gate.clamp_min(torch.finfo(gate.dtype).tiny).log(), -math.inf)
        return distances.mul_(-gamma).add_(membership)

    def __repr__(self) -> str:
        return f"ClusterEuclidean(gate={self.gate})"


@hookimpl
def ktframe_register_scores(register: Register) -> None:
    register("euclidean", Euclidean)
    register("dot", Dot)
    register("linear", Linear)
    register("cluster-euclidean", ClusterEuclidean)
