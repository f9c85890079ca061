"""The k-means transformer (Clarkson et al. 2026, Theorem 2.1), as its definition.

Point tokens are ``[x_i; y_i]`` (``y_i`` the assignment), center tokens ``[c_j; e_j]`` (``e_j`` the
index). One layer is four attention heads and an optional feed-forward block (docs/exactness.md):

    points:  X̄ ← X̄ + A_cross(X̄ → C̄) + A_self(X̄ → X̄)                      (1)
    centers: C̄ ← C̄ + A_cross(C̄ → X̄_new) + A_self(C̄ → C̄)                 (2)
             C̄ ← C̄ + FFN(C̄), where a construction has one                   (3)

and one head is

    A(Z → Z') = map(γ · score(Q z, K z')) · V z'                            (4)

written into its ``slot`` of the query tokens. Read top to bottom: projections, one head (4), a
feed-forward block, one layer (1)–(3), the frame a model may see each task in, the model (embed,
apply the layers, read the centers).

This file is the plain definition: what a model computes, with nothing but PyTorch. A variant
chooses the fast path when it builds its model: :func:`ktframe.fast.accelerate` gives each module a
``plan`` (in-place updates, fused attention and arg-max kernels, cluster sums, skipping converged
tasks), to which each class below hands its call at one point, ``if self.plan is not None``.
``tests/test_fast.py`` checks every variant's fast model against this definition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ktframe.components.embeddings import Embedding
from ktframe.components.maps import AttentionMap
from ktframe.components.scores import Score
from ktframe.core import host
from ktframe.core.reference import assign
from ktframe.core.result import ClusteringResult
from ktframe.core.validation import check_model_inputs

# A head takes its queries in blocks whose logits hold at most MEMORY_BLOCK numbers, so that the
# n × n point self-attention needs memory that grows with n, not n².
MEMORY_BLOCK = 1 << 24


class Planned:
    """A module that the fast path may plan: ``plan`` is None in the plain definition, set by
    :func:`ktframe.fast.accelerate`, and shown by ``repr``."""

    plan = None

    def extra_repr(self) -> str:
        return "" if self.plan is None else f"plan={self.plan}"


# --- projections: Q, K, V ---------------------------------------------------------------------


class Select(nn.Module):
    """A fixed sparse projection: output coordinate ``o`` is ``scale[o] * token[source[o]]``.

    It is the matrix with one non-zero per row (see :attr:`matrix`), applied as a gather. The
    hand-built constructions are made of these.
    """

    def __init__(self, width: int, source: Sequence[int], scale: Sequence[float] | float = 1.0) -> None:
        super().__init__()
        source = list(source)
        scales = [float(scale)] * len(source) if isinstance(scale, (int, float)) else [float(s) for s in scale]
        if len(scales) != len(source):
            raise ValueError("Select needs one scale per source coordinate")
        self.width = width
        self.sources, self.scales = tuple(source), tuple(scales)  # Python copies, for inspection without a tensor op
        self.register_buffer("source", torch.tensor(source, dtype=torch.long), persistent=False)
        self.register_buffer("scale", torch.tensor(scales), persistent=False)
        contiguous = bool(source) and source == list(range(source[0], source[0] + len(source)))
        self.span = slice(source[0], source[0] + len(source)) if contiguous else None  # the run of coordinates read, if contiguous
        self.unit = all(s == 1.0 for s in scales)

    @property
    def matrix(self) -> torch.Tensor:
        """The dense ``(out, width)`` matrix this projection applies."""
        m = torch.zeros(len(self.source), self.width, dtype=self.scale.dtype, device=self.scale.device)
        m[torch.arange(len(self.source)), self.source] = self.scale
        return m

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        picked = tokens[..., self.span] if self.span is not None else tokens.index_select(-1, self.source)
        return picked if self.unit else picked * self.scale.to(tokens.dtype)


class Linear(nn.Linear):
    """A learnable projection; :attr:`matrix` for symmetry with :class:`Select`."""

    @property
    def matrix(self) -> torch.Tensor:
        return self.weight


# --- one attention head: (4) --------------------------------------------------------------------


class AttentionHead(Planned, nn.Module):
    """``map(γ · score(Q z, K z')) · V z'``, written into ``slot`` of the query tokens.

    ``score`` and ``attention_map`` are registry components. ``gamma`` is the inverse temperature
    (``scale`` multiplies it, e.g. 1/√d_emb for learned heads). ``identity=True`` is the documented
    limit mode of a reset head whose queries are its keys: with the hand-built weights in the hard
    limit its map is exactly the identity (docs/exactness.md), so it is applied as such.

    Keys may carry weights ``(B, n)``: a key of weight w counts as w copies of itself, so the map's
    weight of each key is multiplied by the key's and the row normalised again (a query whose keys
    all weigh 0 keeps its own value, as an empty cluster keeps its center). For the maps that
    normalise over the keys (normalize, softmax, an arg-max sharing ties) this is the map of the
    keys repeated; it is how sample weights enter a center update.
    """

    def __init__(
        self,
        q: nn.Module,
        k: nn.Module,
        v: nn.Module,
        score: Score,
        attention_map: AttentionMap,
        *,
        slot: slice,
        gamma: float = 1.0,
        scale: float = 1.0,
        dropout: float = 0.0,
        identity: bool = False,
    ) -> None:
        super().__init__()
        self.q, self.k, self.v = q, k, v
        self.score, self.map = score, attention_map
        self.slot = slot
        self.gamma = float(gamma) * float(scale)
        self.dropout = nn.Dropout(dropout)
        self.identity = identity

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        if self.plan is not None:
            return self.plan.forward(self, queries, keys, weights)
        if self.identity:
            return self.v(queries)
        q, k, v = self.q(queries), self.k(keys), self.v(keys)
        step = max(1, MEMORY_BLOCK // max(1, k.shape[0] * k.shape[1]))
        blocks = [self.attend(q[:, i : i + step], k, v, queries[:, i : i + step], weights) for i in range(0, q.shape[1], step)]
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``γ · score(q, k)`` ``(B, m, n)``; for a map that a per-query constant does not change,
        the score may leave that constant out (e.g. ``‖q‖²`` of the Euclidean score)."""
        score = self.score.up_to_query_constant if self.map.shift_invariant else self.score
        return score(q, k, self.gamma)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """(4) for projected queries ``q`` and keys ``k``, values ``v``; ``queries`` are the query
        tokens, whose own value a map may keep part of (``stay``); ``weights`` those of the keys."""
        if weights is not None:
            mixture = self.map_weights(q, k) * weights.unsqueeze(1)
            mass = mixture.sum(dim=-1, keepdim=True)
            empty = mass == 0
            return torch.bmm(mixture / torch.where(empty, torch.ones_like(mass), mass), v) + empty * self.v(queries)
        out = self.map(self.logits(q, k))
        if out.index is not None:  # one winner per query: its value row (the one-hot product, as a gather)
            values = torch.gather(v, 1, out.index.unsqueeze(-1).expand(-1, -1, v.shape[-1]))
            if out.ties is not None:  # the few queries whose weights are spread over tied keys
                tied, weights = out.ties
                values = values.index_put((tied[:, 0], tied[:, 1]), torch.bmm(weights.unsqueeze(1), v[tied[:, 0]]).squeeze(1))
        else:
            values = torch.bmm(self.dropout(out.weights), v)
        if out.stay is not None:
            values = values + out.stay * self.v(queries)
        return values

    def weights(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The dense attention map ``(B, m, n)`` (for inspection and pictures)."""
        if self.identity:
            return torch.eye(queries.shape[1], dtype=queries.dtype, device=queries.device).expand(queries.shape[0], -1, -1)
        return self.map_weights(self.q(queries), self.k(keys))

    def map_weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The dense map ``(B, m, n)`` of projected queries and keys."""
        out = self.map(self.logits(q, k))
        if out.weights is not None:
            return out.weights
        weights = torch.nn.functional.one_hot(out.index, k.shape[1]).to(q.dtype)
        if out.ties is not None:
            tied, tie_weights = out.ties
            weights[tied[:, 0], tied[:, 1]] = tie_weights
        return weights


# --- a feed-forward block: (3) ------------------------------------------------------------------


class FeedForward(nn.Module):
    """``down(activation(up(z)))`` written into ``slot``."""

    def __init__(self, up: nn.Module, activation: nn.Module, down: nn.Module, *, slot: slice) -> None:
        super().__init__()
        self.up, self.activation, self.down = up, activation, down
        self.slot = slot

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(tokens)))


def add_into(tokens: torch.Tensor, slot: slice, update: torch.Tensor) -> torch.Tensor:
    """One residual step: ``tokens`` with ``update`` added to ``slot`` alone (a new tensor)."""
    if slot.start in (0, None) and slot.stop in (None, tokens.shape[-1]):
        return tokens + update
    out = tokens.clone()
    out[..., slot] = out[..., slot] + update
    return out


# --- one layer: (1)–(3) ---------------------------------------------------------------------------


class Layer(Planned, nn.Module):
    """One Lloyd iteration's worth of attention: the point stream (1), then the center stream (2)
    reading the points as (1) left them, then the feed-forward block (3), if any."""

    def __init__(
        self,
        point_cross: AttentionHead,
        point_self: AttentionHead,
        center_cross: AttentionHead,
        center_self: AttentionHead,
        *,
        point_norm: nn.Module | None = None,
        center_norm: nn.Module | None = None,
        center_ffn: FeedForward | None = None,
    ) -> None:
        super().__init__()
        self.point_cross, self.point_self = point_cross, point_self
        self.center_cross, self.center_self = center_cross, center_self
        self.point_norm = point_norm or nn.Identity()
        self.center_norm = center_norm or nn.Identity()
        self.center_ffn = center_ffn

    def forward(self, points: torch.Tensor, centers: torch.Tensor, sample_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step; ``sample_weight`` ``(B, n)``, if given, weighs each point as a key of the
        center update (a point of weight w counts as w copies of itself)."""
        if self.plan is not None:
            return self.plan.forward(self, points, centers, sample_weight=sample_weight)
        # The self-attention is added first: in the constructions it erases the old value, and
        # y + (−y) is exactly 0, where (y + new) − y would round.
        p, c = self.point_norm(points), self.center_norm(centers)
        points = self.update(points, p, [(self.point_self, p), (self.point_cross, c)])  # (1)
        keys = (self.point_norm(points),) if sample_weight is None else (self.point_norm(points), sample_weight)
        centers = self.update(centers, c, [(self.center_self, c), (self.center_cross, *keys)])  # (2)
        if self.center_ffn is not None:
            centers = add_into(centers, self.center_ffn.slot, self.center_ffn(centers))  # (3)
        return points, centers

    def update(self, tokens: torch.Tensor, queries: torch.Tensor, heads: Sequence[tuple[AttentionHead, torch.Tensor]]) -> torch.Tensor:
        """``tokens + Σ head(queries, keys)`` for ``heads`` as ``(head, keys)`` pairs (or ``(head,
        keys, weights)``, the keys' weights), each head writing its slot, every head reading the
        stream as it was, the outputs added in order. (A layer with heads of its own, such as a
        second center hop, applies them through this.)"""
        outputs = [(head.slot, head(queries, *keys)) for head, *keys in heads]
        for slot, output in outputs:
            tokens = add_into(tokens, slot, output)
        return tokens


# --- the frame a task is seen in -----------------------------------------------------------------


class Standardize(nn.Module):
    """Each task's points translated to their mean and divided by their root-mean-square distance
    to it, one factor for every coordinate. k-means does not change when its data are translated
    and scaled alike (the centers move with the data, the objective is scaled), so a model that
    clusters in this frame and maps its centers back is as sharp on a task of any offset and spread
    as on its training tasks, whose units a learned soft assignment would otherwise fix."""

    def forward(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``shift (B, 1, d)`` and ``scale (B, 1, 1)``: the task is seen as ``(X − shift) / scale``."""
        shift = X.mean(dim=1, keepdim=True)
        scale = (X - shift).square().sum(dim=-1).mean(dim=-1)[:, None, None].sqrt()
        return shift, torch.where(scale > 0, scale, torch.ones_like(scale))  # a task of one repeated point: moved only


# --- the model ------------------------------------------------------------------------------------


class KMeansTransformer(Planned, nn.Module):
    """Embeds points and initial centers, applies the layers, reads the centers back.

    ``layers`` holds one layer per step, or a single layer shared by every step. ``forward`` can
    run more steps than layers (the layers repeat) and, with ``reembed=True``, rebuild fresh tokens
    from the current centers after every step (how a trained one-layer model is iterated).
    ``normalization``, where given (e.g. :class:`Standardize`), says for each task a shift and a
    scale: the model clusters the task in that frame and maps its centers back.
    """

    def __init__(
        self, embedding: Embedding, layers: Sequence[Layer], *, d: int, k: int, n_layers: int | None = None, normalization: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(layers)
        self.d, self.k = d, k
        self.n_layers = n_layers if n_layers is not None else len(self.layers)
        self.normalization = normalization

    @property
    def dtype(self) -> torch.dtype:
        for tensor in self.buffers():
            if tensor.is_floating_point():
                return tensor.dtype
        return next(self.parameters()).dtype

    def layer(self, step: int) -> Layer:
        return self.layers[step % len(self.layers)]

    def forward(self, X: torch.Tensor, C0: torch.Tensor, **options: Any) -> ClusteringResult:
        """Cluster each task of ``X`` (B, n, d) from its initial centers ``C0`` (B, k, d).

        The result's ``n_iter`` counts, for each task, the steps up to the first that left its
        token streams exactly as they were (that step included), where every later step applies
        that same layer without re-embedding: the task has then converged, as Lloyd's algorithm
        does when its assignments stop changing. Elsewhere it is the number of steps.

        ``tol``, if given, stops a task after the first step whose squared center shift, summed
        over the centers, is at most ``tol`` times the mean variance of the task's coordinates
        (scikit-learn's rule, which a converged step meets at any ``tol >= 0``): that step is its
        ``n_iter``, and the task stays as it was then, its later steps repeating its centers.
        ``sample_weight`` ``(B, n)``: each point's weight as a key of the center update.

        ``options`` are :meth:`iterate`'s: ``n_steps`` (default ``n_layers``), ``reembed``
        (re-embed the tasks' points and the current centers before every step after the first),
        ``tol`` and ``sample_weight``.
        """
        if self.normalization is None:
            return self.iterate(X, C0, **options)
        X, C0 = check_model_inputs(X, C0, d=self.d, k=self.k, dtype=self.dtype, any_k=self.embedding.any_k)
        shift, scale = self.normalization(X)
        result = self.iterate((X - shift) / scale, (C0 - shift) / scale, **options)
        trajectory = result.trajectory * scale.unsqueeze(1) + shift.unsqueeze(1)  # in the task's own units
        return dataclasses.replace(result, centers=trajectory[:, -1], trajectory=trajectory)

    def iterate(
        self,
        X: torch.Tensor,
        C0: torch.Tensor,
        *,
        n_steps: int | None = None,
        reembed: bool = False,
        tol: float | None = None,
        sample_weight: torch.Tensor | None = None,
    ) -> ClusteringResult:
        """:meth:`forward` in the frame the task is given in: embed, apply the layers, read."""
        if self.plan is not None:
            return self.plan.forward(self, X, C0, n_steps=n_steps, reembed=reembed, tol=tol, sample_weight=sample_weight)
        X, C0 = check_model_inputs(X, C0, d=self.d, k=self.k, dtype=self.dtype, any_k=self.embedding.any_k)
        steps = self.n_layers if n_steps is None else n_steps
        points, centers = self.embedding.points(X, self.k), self.embedding.centers(C0)
        trajectory = [C0]
        n_iter = torch.full((X.shape[0],), steps, dtype=torch.long)
        bound = None if tol is None else shift_bound(X, tol)
        stopped = torch.zeros(X.shape[0], dtype=torch.bool)
        weighted = {} if sample_weight is None else {"sample_weight": sample_weight.to(X.dtype)}
        for step in range(steps):
            if reembed and step > 0:
                points, centers = self.embedding.points(X, self.k), self.embedding.centers(trajectory[-1])
            layer = self.layer(step)
            new_points, new_centers = layer(points, centers, **weighted)
            if not reembed and all(self.layer(later) is layer for later in range(step + 1, steps)):
                still = _unchanged(points, new_points) & _unchanged(centers, new_centers)
                n_iter[still & (n_iter == steps)] = step + 1
            if bound is not None:  # a stopped task keeps its streams as they were
                kept = stopped.view(-1, 1, 1)
                new_points, new_centers = torch.where(kept, points, new_points), torch.where(kept, centers, new_centers)
                now = ~stopped & (center_shift(trajectory[-1], self.embedding.read_centers(new_centers, self.d)) <= bound)
                n_iter[now] = step + 1
                stopped |= now
            points, centers = new_points, new_centers
            trajectory.append(self.embedding.read_centers(centers, self.d))
        assignments = self.embedding.read_assignments(points, self.d, self.k)
        if assignments is None:  # tokens without an assignment slot: nearest final center
            assignments = assign(X, trajectory[-1])
        return ClusteringResult(centers=trajectory[-1], assignments=assignments, trajectory=torch.stack(trajectory, dim=1), n_iter=n_iter)


def shift_bound(X: torch.Tensor, tol: float, deviation: Callable[[torch.Tensor], torch.Tensor] = host.mean_square_deviation) -> torch.Tensor:
    """``(B,)``: ``tol`` times the mean over coordinates of each task's variance (``deviation``
    computes it), the bound on a step's squared center shift below which a task stops
    (scikit-learn's ``tol``). ``tol = 0`` asks for a step that moves nothing, whatever the
    variance: the pass over the data that measures it is spared."""
    return X.new_zeros(X.shape[0]) if tol == 0 else tol * deviation(X)


def center_shift(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The squared center shift of a step, summed over the centers: ``(B,)`` for centers ``(B, k,
    d)``, ``(B, steps)`` for the steps of trajectories ``(B, steps, k, d)``."""
    return host.squared_shift(before, after)


def _unchanged(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the tasks whose tokens are all equal before and after a step."""
    return (after == before).flatten(1).all(dim=1)
