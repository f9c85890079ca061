"""Building a model from a registered variant: the one place where a variant's name, its options
and the default temperature meet, given as arguments or as a training config's ``model`` section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ktframe.core.errors import InputError
from ktframe.core.validation import check_gamma, check_positive_int
from ktframe.plugin.manager import registry
from ktframe.plugin.variant import Variant, check_options, resolve_dtype
from ktframe.transformer.construction import learnable
from ktframe.transformer.model import KMeansTransformer

# Keys of a training config's model section that are build options of a variant whose build takes
# them by that name (``learned``'s heads: its embedding, score, map, norm, scale and dropout).
MODEL_OPTIONS = ("embedding", "score", "attention_map", "norm", "scale", "dropout")
# Keys of the model section that every variant's model reads: which variant, its steps, its
# temperature, its own options and the weights it starts from.
MODEL_KEYS = ("variant", "n_layers", "unroll", "gamma", "options", "init_from")


def get_variant(name: str) -> Variant:
    return registry().get("variant", name)


def build_model(
    variant: str,
    *,
    d: int,
    k: int,
    n_layers: int,
    gamma: float | None = None,
    dtype: torch.dtype | str = torch.float32,
    **options: Any,
) -> KMeansTransformer:
    """The model of ``variant`` for ``d`` coordinates and ``k`` clusters.

    ``gamma=None`` takes the variant's default: inf (the exact hard limit) for the hand-built
    variants, 1 for ``learned``. ``options`` are the variant's own (``ktframe plugins`` lists them).
    """
    spec = get_variant(variant)
    d = check_positive_int(d, "d")
    k = check_positive_int(k, "k")
    n_layers = check_positive_int(n_layers, "n_layers")
    if gamma is not None:
        options["gamma"] = check_gamma(gamma)
    check_options(spec, options)
    model = spec.build(d=d, k=k, n_layers=n_layers, **options)
    model.variant = spec.name
    return model.to(resolve_dtype(dtype))


def model_keys(variant: str) -> list[str]:
    """The keys of a training config's model section that ``variant``'s model reads: every
    variant's, and those of :data:`MODEL_OPTIONS` that its build takes."""
    taken = get_variant(variant).options()
    return [*MODEL_KEYS, *(key for key in MODEL_OPTIONS if key in taken)]


def model_from_config(cfg: Mapping[str, Any]) -> KMeansTransformer:
    """The model a training config (``data`` and ``model`` sections, plain containers) trains. A
    hand-built variant's projections are fixed, so it trains as its learnable version: the same
    construction with learnable projections started at it."""
    data, model = cfg["data"], cfg["model"]
    learned = model["variant"] == "learned"
    taken = get_variant(model["variant"]).options()
    options = {**{key: model[key] for key in MODEL_OPTIONS if key in taken}, **(model.get("options") or {})}
    k_range = data.get("k_range")  # tasks of many k: a model for every k up to the largest
    built = build_model(model["variant"], d=data["d"], k=k_range[1] if k_range else data["k"], n_layers=model["n_layers"], gamma=model["gamma"], **options)
    if k_range and not built.embedding.any_k:
        raise InputError(
            f"data.k_range={list(k_range)} trains on tasks of many k, but variant {model['variant']!r} with these options is built for one k; expected model.options.any_k=true (or data.k_range=null)"
        )
    return built if learned else learnable(built)
