"""The hooks a ktframe plugin can implement.

Every hook receives a ``register`` callback (as in simonw/llm): call it once per thing you provide,
``register(name, obj)``. Names are unique within their kind across all installed plugins. The
built-in components are registered through exactly these hooks, by ordinary plugin modules in
``ktframe.components``.

A plugin is a module (or any object) with functions decorated by :data:`hookimpl`, published under
the ``ktframe`` entry-point group::

    [project.entry-points.ktframe]
    my-variant = "my_package.plugin"
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT = "ktframe"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: ``register(name, obj)``: adds ``obj`` under ``name`` to the hook's kind.
Register = Callable[[str, Any], None]


@hookspec
def ktframe_register_scores(register: Register) -> None:
    """Register attention scores: :class:`ktframe.components.scores.Score` instances.

    A score maps queries ``(B, m, e)`` and keys ``(B, n, e)`` to logits ``(B, m, n)``.
    """


@hookspec
def ktframe_register_maps(register: Register) -> None:
    """Register attention maps: :class:`ktframe.components.maps.AttentionMap` instances.

    A map turns logits into weights over the keys (softmax, hard arg-max, ...).
    """


@hookspec
def ktframe_register_norms(register: Register) -> None:
    """Register token norms: callables ``factory(width) -> torch.nn.Module``."""


@hookspec
def ktframe_register_activations(register: Register) -> None:
    """Register activations: callables ``factory() -> torch.nn.Module``."""


@hookspec
def ktframe_register_embeddings(register: Register) -> None:
    """Register token embeddings: :class:`ktframe.components.embeddings.Embedding` instances."""


@hookspec
def ktframe_register_initializers(register: Register) -> None:
    """Register center initialisers: callables ``init(X, k, generator) -> C0``.

    ``X`` is ``(B, n, d)``, the result ``(B, k, d)``; all randomness comes from ``generator``.
    """


@hookspec
def ktframe_register_variants(register: Register) -> None:
    """Register clustering variants: :class:`ktframe.variant.Variant` instances.

    A variant declares its hand-built construction and the classical algorithm it reproduces.
    """


#: hook name -> the registry kind it fills
KINDS: dict[str, str] = {
    "ktframe_register_scores": "score",
    "ktframe_register_maps": "map",
    "ktframe_register_norms": "norm",
    "ktframe_register_activations": "activation",
    "ktframe_register_embeddings": "embedding",
    "ktframe_register_initializers": "initializer",
    "ktframe_register_variants": "variant",
}
