"""ktframe: clustering algorithms written as transformer circuits.

Public interface::

    ktframe.build_model(variant, *, d, k, n_layers, gamma=inf, **options)   # hand-built model
    ktframe.reference.lloyd(X, C0, n_iter)                                   # classical Lloyd
    ktframe.TransformerKMeans(n_clusters, ...)                               # scikit-learn style
    ktframe.hookimpl, ktframe.Variant, ktframe.Tolerance, ktframe.exact_tolerance   # for plugins

The package's folders name its parts: ``transformer`` (the model's definition), ``components``,
``fast`` (the fast path a variant chooses), ``plugin`` (the plugin system), ``clustering`` (the
estimator and the classical algorithms), ``training`` and ``cli``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives. They are imported on first use (PEP 562), so that ``import
# ktframe`` — and the ``ktframe`` command, whose ``--help`` answers at once — imports no PyTorch.
_PUBLIC = {
    "ClusteringResult": "ktframe.core.result",
    "InputError": "ktframe.core.errors",
    "KMeansTransformer": "ktframe.transformer.model",
    "KtframeError": "ktframe.core.errors",
    "NotFittedError": "ktframe.core.errors",
    "PluginError": "ktframe.core.errors",
    "Tolerance": "ktframe.plugin.variant",
    "TransformerKMeans": "ktframe.clustering.estimator",
    "UnknownNameError": "ktframe.core.errors",
    "Variant": "ktframe.plugin.variant",
    "build_model": "ktframe.plugin.build",
    "exact_tolerance": "ktframe.plugin.variant",
    "hookimpl": "ktframe.hooks.hookspecs",
}


def __getattr__(name: str) -> Any:
    if name == "reference":
        return importlib.import_module("ktframe.core.reference")
    if name not in _PUBLIC:
        raise AttributeError(f"module 'ktframe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


__all__ = [
    "ClusteringResult",
    "InputError",
    "KMeansTransformer",
    "KtframeError",
    "NotFittedError",
    "PluginError",
    "Tolerance",
    "TransformerKMeans",
    "UnknownNameError",
    "Variant",
    "build_model",
    "exact_tolerance",
    "hookimpl",
    "reference",
]
