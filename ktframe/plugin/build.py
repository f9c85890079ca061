"""Building a model from a registered variant: the one place where a variant's name, its options
and the default temperature meet."""

from __future__ import annotations

from typing import Any

import torch

from ktframe.core.validation import check_gamma, check_positive_int
from ktframe.plugin.manager import registry
from ktframe.plugin.variant import Variant, check_options, resolve_dtype
from ktframe.transformer.model import KMeansTransformer


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
