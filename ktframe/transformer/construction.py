"""Helpers for writing hand-built constructions: heads made of fixed sparse projections, the heads
the Lloyd-family variants share, and turning a hand-built model into a learnable one."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ktframe.components.maps import AttentionMap, Hardmax, Normalize, Softmax
from ktframe.components.scores import ClusterEuclidean, Euclidean, Score
from ktframe.components.scores import Linear as LinearScore
from ktframe.core.errors import InputError
from ktframe.transformer.model import AttentionHead, Layer, Linear, Planned, Select


def coords(start: int, stop: int) -> list[int]:
    return list(range(start, stop))


def slot(coordinates: Sequence[int]) -> slice:
    """The token slice of a contiguous run of coordinates."""
    coordinates = list(coordinates)
    if coordinates != coords(coordinates[0], coordinates[0] + len(coordinates)):
        raise ValueError("a head writes a contiguous run of coordinates")
    return slice(coordinates[0], coordinates[-1] + 1)


def fixed_head(
    width: int,
    *,
    q: Sequence[int],
    k: Sequence[int],
    v: Sequence[int],
    score: Score,
    attention_map: AttentionMap,
    gamma: float = 1.0,
    q_scale: Sequence[float] | float = 1.0,
    k_scale: Sequence[float] | float = 1.0,
    v_scale: float = 1.0,
    write: Sequence[int] | None = None,
    identity: bool = False,
    norm: Callable[[int], nn.Module] | None = None,
    normed: str = "",
) -> AttentionHead:
    """A head whose Q and K read coordinates ``q`` and ``k`` and whose V copies coordinates ``v``
    (times ``v_scale``) into ``write`` (``v`` itself when not given). The projections named in
    ``normed`` (any of "q", "k", "v") are followed by ``norm(width of the projection)``, a token
    norm (as in QK-norm)."""

    def project(name: str, source: Sequence[int], scale) -> nn.Module:
        selected = Select(width, source, scale)
        return NormedProjection(selected, norm(len(source))) if name in normed else selected

    return AttentionHead(
        project("q", q, q_scale),
        project("k", k, k_scale),
        project("v", v, v_scale),
        score,
        attention_map,
        slot=slot(v if write is None else write),
        gamma=gamma,
        identity=identity,
    )


class NormedProjection(nn.Sequential):
    """A projection followed by a token norm; :attr:`matrix` is the projection's."""

    @property
    def matrix(self) -> torch.Tensor:
        return self[0].matrix


# --- the heads of the Lloyd family ---------------------------------------------------------------
# Tokens are [x; y] and [c; e_j] (xs: the data coordinates, ys: assignment / index), as in `lloyd`.


def assignment_map(gamma: float) -> tuple[AttentionMap, float]:
    """The map and inverse temperature that choose among keys: a softmax at finite ``gamma``,
    the arg-max (ties averaged) it tends to at ``gamma=inf``."""
    if math.isinf(gamma):
        return Hardmax(), 1.0
    return Softmax(), gamma


def assignment_head(
    width: int,
    xs: Sequence[int],
    ys: Sequence[int],
    *,
    gamma: float,
    score: Score | None = None,
    attention_map: AttentionMap | None = None,
    qk_norm: Callable[[int], nn.Module] | None = None,
) -> AttentionHead:
    """Point → centers: writes the index of the best-scoring center (Euclidean by default) into
    the assignment, softly at finite ``gamma``; ``qk_norm`` normalises the queries and keys.
    ``attention_map`` replaces the choice :func:`assignment_map` makes (fuzzy memberships, say),
    at inverse temperature ``gamma`` as given."""
    choose, g = assignment_map(gamma) if attention_map is None else (attention_map, gamma)
    score = Euclidean() if score is None else score
    return fixed_head(width, q=xs, k=xs, v=ys, score=score, attention_map=choose, gamma=g, norm=qk_norm, normed="qk" if qk_norm else "")


RESETS = ("attention", "identity")


def check_reset(reset: str) -> str:
    """A variant's ``reset`` option: the resets as attention, or in their identity mode."""
    if reset not in RESETS:
        raise InputError(f"reset must be one of {', '.join(RESETS)}; got {reset!r}")
    return reset


def reset_head(width: int, on: Sequence[int], erase: Sequence[int], *, identity: bool = False, attention_map: AttentionMap | None = None) -> AttentionHead:
    """Self-attention that erases coordinates ``erase`` of every token: a hard arg-max over
    coordinates ``on`` picks the token itself (or its exact duplicates, which hold the same
    ``erase`` coordinates) and writes minus them. Exact at any temperature of the other heads, and
    so is its ``identity`` mode (the token itself, without the n × n arg-max). Another
    ``attention_map`` than the arg-max is a reset no longer exact."""
    choose = Hardmax() if attention_map is None else attention_map
    return fixed_head(width, q=on, k=on, v=erase, v_scale=-1.0, score=Euclidean(), attention_map=choose, identity=identity)


def mean_head(
    width: int, xs: Sequence[int], ys: Sequence[int], *, v_norm: Callable[[int], nn.Module] | None = None, attention_map: AttentionMap | None = None
) -> AttentionHead:
    """Center → points: normalized linear attention ``e_j·y_i / Σ e_j·y_i'`` writes the
    (assignment-weighted) mean of the cluster's points (normalised by ``v_norm`` first, if given);
    an empty cluster keeps its center. ``attention_map`` weighs the scores ``e_j·y_i`` otherwise
    (a power of the memberships, say) instead of normalising them."""
    weigh = Normalize() if attention_map is None else attention_map
    return fixed_head(width, q=ys, k=ys, v=xs, score=LinearScore(), attention_map=weigh, norm=v_norm, normed="v" if v_norm else "")


def cluster_head(width: int, xs: Sequence[int], ys: Sequence[int], attention_map: AttentionMap, *, gamma: float = 1.0) -> AttentionHead:
    """Center → the points of its own cluster, scored by ``−gamma · ‖c_j − x_i‖² + log y_ij``
    (the ``cluster-euclidean`` score); ``attention_map`` decides how they are weighed."""
    score = ClusterEuclidean(gate=len(ys))
    return fixed_head(width, q=list(xs) + list(ys), k=list(xs) + list(ys), v=xs, score=score, attention_map=attention_map, gamma=gamma)


def lloyd_family_layer(
    width: int,
    xs: Sequence[int],
    ys: Sequence[int],
    *,
    gamma: float,
    center_cross: AttentionHead,
    score: Score | None = None,
    attention_map: AttentionMap | None = None,
    qk_norm: Callable[[int], nn.Module] | None = None,
    layer: type[Layer] = Layer,
    identity_resets: bool = False,
    **extra,
) -> Layer:
    """One layer of a variant of Lloyd's construction: the assignment head (``score``, softmax at
    finite ``gamma`` or ``attention_map`` if given, queries and keys normalised by ``qk_norm`` if
    given), exact resets of the assignment and of the center (in their identity mode with
    ``identity_resets``), and the variant's own ``center_cross`` head (the center update).
    ``layer`` and ``extra`` let a variant add heads of its own."""
    return layer(
        point_cross=assignment_head(width, xs, ys, gamma=gamma, score=score, attention_map=attention_map, qk_norm=qk_norm),
        point_self=reset_head(width, xs, ys, identity=identity_resets),
        center_cross=center_cross,
        center_self=reset_head(width, ys, xs, identity=identity_resets),
        **extra,
    )


class HeadGroup(Planned, nn.Module):
    """Heads side by side, each writing its own run of one contiguous slot: multi-head attention
    whose heads' outputs are concatenated. To a layer it is one head (``slot``, called with
    queries and keys), so a construction can give a stream several heads where the layer has one,
    e.g. one head per data coordinate."""

    def __init__(self, width: int, heads: Sequence[AttentionHead]) -> None:
        super().__init__()
        self.heads = nn.ModuleList(heads)
        for before, after in zip(heads, heads[1:]):
            if before.slot.stop != after.slot.start:
                raise ValueError("the heads of a group write consecutive runs of coordinates, in order")
        self.slot = slice(heads[0].slot.start, heads[-1].slot.stop)
        probe = torch.zeros(1, 1, width)
        self.widths = [(head.k(probe).shape[-1], head.v(probe).shape[-1]) for head in heads]  # each head's K and V widths

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.plan is not None:
            return self.plan.forward(self, queries, keys)
        return torch.cat([head(queries, keys) for head in self.heads], dim=-1)

    def weights(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The heads' attention maps ``(B, m, n)``, averaged (for inspection and pictures)."""
        return torch.stack([head.weights(queries, keys) for head in self.heads]).mean(dim=0)


def stack(make_layer: Callable[[], Layer], n_layers: int, share_weights: bool) -> list[Layer]:
    """One layer for every step, or a single one that every step shares."""
    return [make_layer()] if share_weights else [make_layer() for _ in range(n_layers)]


def learnable(model: nn.Module) -> nn.Module:
    """The same model with every fixed projection (:class:`Select`) replaced, in place, by a
    learnable linear map with bias, initialised to exactly that projection (bias 0): training
    starts from the hand-built construction and may move away from it. A model on the fast path
    is planned again, for its new projections."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Select):
                linear = Linear(child.width, len(child.source), dtype=child.scale.dtype, device=child.scale.device)
                with torch.no_grad():
                    linear.weight.copy_(child.matrix)
                    linear.bias.zero_()
                setattr(parent, name, linear)
    if getattr(model, "plan", None) is not None:
        model.plan.replan(model)
    return model
