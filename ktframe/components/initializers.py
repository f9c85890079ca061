"""Center initialisers: ``init(X (B, n, d), k, generator) -> C0 (B, k, d)``."""

from __future__ import annotations

from functools import partial

from ktframe.core import reference
from ktframe.hooks.hookspecs import Register, hookimpl


@hookimpl
def ktframe_register_initializers(register: Register) -> None:
    register("random", reference.random_points)
    register("k-means++", partial(reference.kmeans_plusplus, greedy=False))  # also spelt kmeans++ (core.names.SPELLINGS)
    register("greedy-k-means++", partial(reference.kmeans_plusplus, greedy=True))
