"""The hooks a ktframe plugin can implement.

Every hook receives a ``register`` callback (as in simonw/llm): call it once per thing you provide.
A component (score, map, norm, activation, embedding, initializer) has no name of its own, so its
hook calls ``register(name, obj)``; a variant carries its name, so its hook calls
``register(variant)`` with a :class:`ktframe.Variant`, which is registered as ``variant.name``.

For every hook:

- **when**: once per process, the first time anything looks a component up
  (:func:`ktframe.plugin.manager.registry`), after every plugin has been imported: the built-in
  modules first, then installed plugins in the order of their entry-point names. A hook only
  registers: it must not look components up itself (the registry is not complete yet).
- **names**: a non-empty string, unique within its kind across the built-ins and every installed
  plugin (a score and a map may share a name). ``ktframe plugins`` lists them.
- **clash**: a name that another plugin (or a built-in) already registered in the same kind is a
  :class:`~ktframe.core.errors.PluginError` naming both plugins and their distributions; the command
  stops (exit 2), strict mode or not: uninstall one of them or rename the component.
- **failure**: a hook that raises (an invalid name or object included) registers nothing of its
  plugin, from any hook; the plugin is reported by name and distribution and the others still
  load (``KTFRAME_STRICT_PLUGINS=1`` makes it an error).

The built-in components are registered through exactly these hooks, by ordinary plugin modules in
``ktframe.components``.

A plugin is a module (or any object) with functions decorated by :data:`hookimpl`, published under
the ``ktframe`` entry-point group::

    [project.entry-points.ktframe]
    my-variant = "my_package.plugin"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "ktframe"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The component hooks' callback, ``register(name, obj)``: adds ``obj`` under ``name`` to the hook's kind.
Register = Callable[[str, Any], None]

#: The variants hook's callback, ``register(variant)``: adds the :class:`ktframe.Variant` under
#: ``variant.name``. The older ``register(name, variant)`` is still accepted (with a
#: DeprecationWarning) when ``name == variant.name``, and is an error otherwise.
RegisterVariant = Callable[..., None]


@hookspec
def ktframe_register_scores(register: Register) -> None:
    """Register attention scores: ``register(name, cls)``, ``cls`` a **class** (a factory),
    subclass of :class:`ktframe.components.scores.Score`.

    ``registry().get("score", name)(**options)`` makes an instance (``learned`` and the config
    make it with no arguments, so give every option a default); the instance is called as
    ``score(q, k, gamma)``: queries ``(B, m, e)`` and keys ``(B, n, e)`` to logits ``(B, m, n)``.
    Set ``description`` (one line, shown by ``ktframe plugins``) and ``linear = True`` only for a
    score bilinear in (q, k) with no temperature.
    """


@hookspec
def ktframe_register_maps(register: Register) -> None:
    """Register attention maps: ``register(name, cls)``, ``cls`` a **class** (a factory),
    subclass of :class:`ktframe.components.maps.AttentionMap`.

    ``registry().get("map", name)(**options)`` makes an instance (give every option a default);
    the instance is called as ``attention_map(logits)`` with logits ``(B, m, n)`` and returns a
    :class:`ktframe.components.maps.MapOutput`: weights over the keys (softmax, hard arg-max,
    ...), and ``stay`` for a query that keeps its own value (an empty cluster).
    """


@hookspec
def ktframe_register_norms(register: Register) -> None:
    """Register token norms: ``register(name, factory)``, ``factory(width) -> torch.nn.Module``
    a class or function (``torch.nn.RMSNorm`` qualifies); the module maps ``(..., width)`` to the
    same shape."""


@hookspec
def ktframe_register_activations(register: Register) -> None:
    """Register activations: ``register(name, factory)``, ``factory() -> torch.nn.Module`` a
    class or function taking no arguments (``torch.nn.ReLU`` qualifies); the module is
    element-wise."""


@hookspec
def ktframe_register_embeddings(register: Register) -> None:
    """Register token embeddings: ``register(name, cls)``, ``cls`` a **class** (a factory),
    subclass of :class:`ktframe.components.embeddings.Embedding`, made with no arguments by
    ``registry().get("embedding", name)()``. It implements ``width(d, k)``, ``points(X, k)``
    (new memory: build it with ``data_tokens``), ``centers(C)`` and, where the point tokens keep
    an assignment, ``assignment_slot(d, k)``."""


@hookspec
def ktframe_register_initializers(register: Register) -> None:
    """Register center initialisers: ``register(name, init)``, ``init`` a **function** (not a
    factory) called as ``init(X, k, generator) -> C0``.

    ``X`` is ``(B, n, d)``, the result ``(B, k, d)`` in ``X``'s dtype; all randomness comes from
    the ``torch.Generator`` ``generator``. Config key ``data.init`` names it.
    """


@hookspec
def ktframe_register_variants(register: RegisterVariant) -> None:
    """Register clustering variants: ``register(variant)``, ``variant`` an **instance** of
    :class:`ktframe.Variant`, registered under ``variant.name`` (the name ``ktframe verify
    --variant``, ``ktframe fit variant=`` and ``build_model`` take). Anything else is an error.

    A variant declares its hand-built construction (``build``), the classical algorithm it
    reproduces (``reference``, ``classical``), the ``tolerance`` of that agreement and the setting
    at which it is exact (``exact``), which ``ktframe verify`` runs by default. A variant name
    clashes with variants only; ``ktframe.plugin.testing.variant_checks(name)`` checks what it declares.
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
