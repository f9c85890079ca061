"""``ktframe.plugin``, the plugin author's one module: every name it offers resolves, every head
helper takes the attention map a variant wants to swap, and a model built from the API alone is
the hand-built one."""

from __future__ import annotations

import math

import torch

import ktframe.plugin as api
from ktframe.core.tasks import mixture


def test_every_public_name_resolves():
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert missing == []
    assert {"hookimpl", "Variant", "Tolerance", "exact_tolerance", "accelerate", "check_variant", "variant_checks", "AttentionMap", "Layer"} <= set(api.__all__)


def _tasks(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X, _ = mixture(3, 40, 2, 4, generator=g, dtype=torch.float64)
    return X, api.reference.random_points(X, 4, g)


def _model(layer_of, *, d: int = 2, k: int = 4, n_layers: int = 3):
    return api.KMeansTransformer(api.OneHot(), api.stack(layer_of, n_layers, True), d=d, k=k, n_layers=n_layers).double()


def test_the_assignment_map_is_one_argument_of_the_layer_helper():
    width, xs, ys = 6, api.coords(0, 2), api.coords(2, 6)
    softmax = api.registry().get("map", "softmax")
    default = _model(lambda: api.lloyd_family_layer(width, xs, ys, gamma=5.0, center_cross=api.mean_head(width, xs, ys)))
    swapped = _model(lambda: api.lloyd_family_layer(width, xs, ys, gamma=5.0, center_cross=api.mean_head(width, xs, ys), attention_map=softmax()))
    X, C0 = _tasks()
    assert torch.equal(default(X, C0).trajectory, swapped(X, C0).trajectory)
    # and another map changes the algorithm: the arg-max at the same gamma is Lloyd's step
    hard = _model(
        lambda: api.lloyd_family_layer(
            width, xs, ys, gamma=1.0, center_cross=api.mean_head(width, xs, ys), attention_map=api.registry().get("map", "hardmax")()
        )
    )
    assert torch.allclose(hard(X, C0).trajectory, api.reference.lloyd(X, C0, 3).trajectory, atol=1e-12)


def test_every_head_helper_takes_an_attention_map():
    width, xs, ys = 6, api.coords(0, 2), api.coords(2, 6)
    normalize, hardmax = api.registry().get("map", "normalize"), api.registry().get("map", "hardmax")
    heads = {
        "assignment_head": api.assignment_head(width, xs, ys, gamma=math.inf, attention_map=hardmax()),
        "reset_head": api.reset_head(width, xs, ys, attention_map=hardmax()),
        "mean_head": api.mean_head(width, xs, ys, attention_map=normalize()),
        "cluster_head": api.cluster_head(width, xs, ys, hardmax()),
        "fixed_head": api.fixed_head(width, q=xs, k=xs, v=ys, score=api.registry().get("score", "euclidean")(), attention_map=hardmax()),
    }
    for name, head in heads.items():
        assert isinstance(head.map, api.AttentionMap), name
    exact = _model(lambda: api.lloyd_family_layer(width, xs, ys, gamma=math.inf, center_cross=heads["mean_head"]))
    X, C0 = _tasks(1)
    assert torch.allclose(exact(X, C0).trajectory, api.reference.lloyd(X, C0, 3).trajectory, atol=1e-12)


def test_gamma_inf_means_the_arg_max_in_one_place():
    choose, g = api.assignment_map(math.inf)
    assert choose.argmax and g == 1.0
    choose, g = api.assignment_map(7.0)
    assert choose.softmax and g == 7.0
