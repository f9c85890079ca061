"""The learnable k-means transformer of the paper's learning experiments, registered as the
built-in variant ``learned``.

One layer (by default) of the same two-stream form as the hand-built models, but every head has
its own learnable Q, K, V (linear maps with bias, width d_emb), Euclidean softmax attention with
gamma = 1 and a 1/√d_emb scale, and attention dropout while training. No feed-forward, no norm.
Scores, maps, norms and embeddings come from the registry, so a learnable version of any mechanism
is one option away.
"""

from __future__ import annotations

import math

from ktframe.plugin import (
    AttentionHead,
    InputError,
    KMeansTransformer,
    Layer,
    Linear,
    RegisterVariant,
    SlotIndex,
    Standardize,
    Tolerance,
    Variant,
    accelerate,
    hookimpl,
    registry,
)


def build(
    *,
    d: int,
    k: int,
    n_layers: int,
    gamma: float = 1.0,
    embedding: str = "onehot",
    score: str = "euclidean",
    attention_map: str = "softmax",
    norm: str = "identity",
    scale: float | None = None,
    dropout: float = 0.01,
    share_weights: bool = True,
    any_k: bool = False,
    standardize: bool = False,
    fast: bool = True,
) -> KMeansTransformer:
    """``scale=None`` is 1/√d_emb. With ``share_weights`` one layer serves every step.
    ``any_k``: one model for every number of clusters from 1 to ``k``, its center tokens
    :class:`~ktframe.components.embeddings.SlotIndex` (one-hot slots drawn per task while
    training, and the task's k as a coordinate); it extends the one-hot embedding.
    ``standardize``: the model sees each task translated to its mean and scaled to unit RMS
    spread (:class:`Standardize`), whatever the task's own offset and
    scale, and its centers are mapped back."""

    reg = registry()
    if any_k and embedding != "onehot":
        raise InputError(f"any_k=True extends the one-hot index embedding; got embedding={embedding!r}, expected embedding='onehot'")
    embed = SlotIndex(k) if any_k else reg.get("embedding", embedding)()
    width = embed.width(d, k)
    scale = 1.0 / math.sqrt(width) if scale is None else scale
    make_score, make_map, make_norm = reg.get("score", score), reg.get("map", attention_map), reg.get("norm", norm)

    def head() -> AttentionHead:
        return AttentionHead(
            Linear(width, width),
            Linear(width, width),
            Linear(width, width),
            make_score(),
            make_map(),
            slot=slice(0, width),
            gamma=gamma,
            scale=scale,
            dropout=dropout,
        )

    def layer() -> Layer:
        return Layer(head(), head(), head(), head(), point_norm=make_norm(width), center_norm=make_norm(width))

    layers = [layer()] if share_weights else [layer() for _ in range(n_layers)]
    model = KMeansTransformer(embed, layers, d=d, k=k, n_layers=n_layers, normalization=Standardize() if standardize else None)
    return accelerate(model) if fast else model


@hookimpl
def ktframe_register_variants(register: RegisterVariant) -> None:
    register(
        Variant(
            name="learned",
            summary="learnable heads (Q, K, V with bias), Euclidean softmax, gamma=1, 1/sqrt(d_emb) scale, dropout",
            classical="(none: trained)",
            build=build,
            reference=None,
            tolerance=lambda dtype, gamma: Tolerance(math.inf, 0.0),
        ),
    )
