"""``lloyd-dot``: exact Lloyd with ordinary dot-product attention (the paper's Theorem 2.2, as reconstructed in docs/exactness.md).

Tokens carry squared norms: ``[x; ‖x‖²; 1; y]`` and ``[c; ‖c‖²; 1; e_j]``. The point→center score
``2 x·c − ‖c‖² = ‖x‖² − ‖x − c‖²`` has Lloyd's arg-max; the point→point score with the same form
picks the point itself (the reset); the center→point score ``e_j · y_i``, normalized over the points,
averages the points of cluster ``j``; the center→center score selects the center itself and erases ``c`` and ``‖c‖²``.
A feed-forward block ``Σ ReQU([I; −I] c) = ‖c‖²`` then writes the new squared norm.
"""

from __future__ import annotations

import math

import torch

from ktframe.plugin import (
    Embedding,
    FeedForward,
    KMeansTransformer,
    Layer,
    Linear,
    Select,
    Variant,
    accelerate,
    assignment_map,
    coords,
    data_tokens,
    exact_tolerance,
    fixed_head,
    hookimpl,
    index_tokens,
    reference,
    registry,
)


class SquaredNormEmbedding(Embedding):
    """``[x; ‖x‖²; 1; y]`` and ``[c; ‖c‖²; 1; e_j]`` (width d + 2 + k)."""

    description = "[x; |x|^2; 1; assignment] and [c; |c|^2; 1; one-hot index] (width d + 2 + k)"

    def width(self, d, k):
        return d + 2 + k

    def points(self, X, k):
        d = X.shape[-1]
        tokens = data_tokens(X, d + 2 + k)
        tokens[..., d] = X.square().sum(-1)
        tokens[..., d + 1] = 1
        return tokens

    def centers(self, C):
        B, k, _ = C.shape
        extra = torch.stack([C.square().sum(-1), torch.ones_like(C[..., 0])], dim=-1)
        return torch.cat([C, extra, index_tokens(B, k, C)], dim=-1)

    def assignment_slot(self, d, k):
        return slice(d + 2, d + 2 + k)


def squared_norm_ffn(width: int, d: int) -> FeedForward:
    """``‖c‖² = Σ ReQU([I; −I] c)``, written into the norm slot (coordinate d)."""
    down = Linear(2 * d, 1, bias=False)
    with torch.no_grad():
        down.weight.fill_(1.0)
    down.weight.requires_grad_(False)
    up = Select(width, coords(0, d) * 2, [1.0] * d + [-1.0] * d)
    return FeedForward(up, registry().get("activation", "requ")(), down, slot=slice(d, d + 1))


def build(*, d: int, k: int, n_layers: int, gamma: float = math.inf, share_weights: bool = True, fast: bool = True) -> KMeansTransformer:
    reg = registry()
    dot = reg.get("score", "dot")()
    choose, g = assignment_map(gamma)
    linear, normalize = reg.get("score", "linear")(), reg.get("map", "normalize")()
    width, xs, norm, one, ys = d + 2 + k, coords(0, d), d, d + 1, coords(d + 2, d + 2 + k)
    query = xs + [one]  # [x; 1]
    key = xs + [norm]  # [2c; −‖c‖²]
    key_scale = [2.0] * d + [-1.0]

    def make_layer() -> Layer:
        return Layer(
            point_cross=fixed_head(width, q=query, k=key, k_scale=key_scale, v=ys, score=dot, attention_map=choose, gamma=g),
            point_self=fixed_head(width, q=query, k=key, k_scale=key_scale, v=ys, v_scale=-1.0, score=dot, attention_map=choose, gamma=g),
            # Normalized linear attention: weights e_j·y_i / Σ_i' e_j·y_i' average the points of j. A
            # softmax over γ e_j·y_i would also select them, but lets any y slightly above 1 dominate.
            center_cross=fixed_head(width, q=ys, k=ys, v=xs, score=linear, attention_map=normalize),
            center_self=fixed_head(width, q=ys, k=ys, v=xs + [norm], v_scale=-1.0, score=dot, attention_map=choose, gamma=g),
            center_ffn=squared_norm_ffn(width, d),
        )

    layers = [make_layer()] if share_weights else [make_layer() for _ in range(n_layers)]
    model = KMeansTransformer(reg.get("embedding", "sqnorm")(), layers, d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


@hookimpl
def ktframe_register_embeddings(register):
    register("sqnorm", SquaredNormEmbedding)


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="lloyd-dot",
            summary="dot-product attention on squared-norm tokens with a ReQU feed-forward (Theorem 2.2)",
            classical="Lloyd's algorithm",
            build=build,
            reference=reference.lloyd,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            sample_weights=True,
        ),
    )
