"""``lloyd``: the k-means transformer of Clarkson et al. (2026, Theorem 2.1), one Lloyd iteration per layer.

Tokens are ``[x; y]`` (points, ``y`` the assignment) and ``[c; e_j]`` (centers, ``e_j`` the index):

- point cross-attention, Euclidean scores on the data part, writes the nearest center's index
  into ``y``; point self-attention picks the point itself and writes ``−y``: the old assignment is
  erased;
- center cross-attention with query ``e_j`` over keys ``y_i`` averages the points assigned to
  ``j`` (normalized linear attention by default; ``center_update="argmax"`` uses a Euclidean
  arg-max over the index part instead); center self-attention writes ``−c_j``.

At finite ``gamma`` the arg-max maps are softmaxes; ``gamma=inf`` is the exact hard limit.
"""

from __future__ import annotations

import math

from ktframe.plugin import (
    InputError,
    KMeansTransformer,
    Layer,
    SlotIndex,
    Variant,
    accelerate,
    assignment_map,
    check_reset,
    coords,
    exact_tolerance,
    fixed_head,
    hookimpl,
    reference,
    registry,
)

CENTER_UPDATES = ("linear", "argmax")


def build(
    *,
    d: int,
    k: int,
    n_layers: int,
    gamma: float = math.inf,
    center_update: str = "linear",
    reset: str | None = None,
    share_weights: bool = True,
    any_k: bool = False,
    fast: bool = True,
) -> KMeansTransformer:
    """``any_k``: the same construction over ``k`` index slots clusters tasks of any k' ≤ k
    (:class:`~ktframe.components.embeddings.SlotIndex` tokens without the k coordinate): the
    slots a task does not use stay 0 in every token, so it computes Lloyd's iteration as the
    model built for k' does. ``reset="identity"`` computes the two self-attentions (the resets) as the identity they are
    in the hard limit: O(n) instead of O(n²) for the points, and no k × k arg-max per task for the
    centers, whose index parts ``e_j`` are distinct. It is refused at finite gamma, where it would
    not be exact. ``reset=None`` (the default) is ``"identity"`` in the hard limit and
    ``"attention"`` elsewhere."""
    if center_update not in CENTER_UPDATES:
        raise InputError(f"center_update must be one of {', '.join(CENTER_UPDATES)}; got {center_update!r}")
    choose, g = assignment_map(gamma)
    hard = choose.argmax
    reset = check_reset(reset if reset is not None else "identity" if hard else "attention")
    if reset == "identity" and not hard:
        raise InputError(f"reset='identity' is exact only in the hard limit; use gamma=inf (got gamma={gamma:g}) or reset='attention'")
    reg = registry()
    euclidean = reg.get("score", "euclidean")()
    embedding = SlotIndex(k, k_feature=False) if any_k else reg.get("embedding", "onehot")()
    width, xs, ys = embedding.width(d, k), coords(0, d), coords(d, d + k)

    def make_layer() -> Layer:
        if center_update == "linear":
            center_cross = fixed_head(width, q=ys, k=ys, v=xs, score=reg.get("score", "linear")(), attention_map=reg.get("map", "normalize")())
        else:
            # Over the index part, an assigned point scores 0 and any other −2γ: threshold between.
            average = reg.get("map", "hardmax")(threshold=-1.0) if hard else reg.get("map", "softmax")()
            center_cross = fixed_head(width, q=ys, k=ys, v=xs, score=euclidean, attention_map=average, gamma=g)
        return Layer(
            point_cross=fixed_head(width, q=xs, k=xs, v=ys, score=euclidean, attention_map=choose, gamma=g),
            point_self=fixed_head(width, q=xs, k=xs, v=ys, v_scale=-1.0, score=euclidean, attention_map=choose, gamma=g, identity=reset == "identity"),
            center_cross=center_cross,
            center_self=fixed_head(width, q=ys, k=ys, v=xs, v_scale=-1.0, score=euclidean, attention_map=choose, gamma=g, identity=reset == "identity"),
        )

    layers = [make_layer()] if share_weights else [make_layer() for _ in range(n_layers)]
    model = KMeansTransformer(embedding, layers, d=d, k=k, n_layers=n_layers)
    return accelerate(model) if fast else model


@hookimpl
def ktframe_register_variants(register):
    register(
        Variant(
            name="lloyd",
            summary="Euclidean attention: one exact Lloyd iteration per layer (Theorem 2.1)",
            classical="Lloyd's algorithm",
            build=build,
            reference=reference.lloyd,
            tolerance=exact_tolerance,
            exact={"gamma": math.inf, "dtype": "float64"},
            sample_weights=True,
        ),
    )
