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

from ktframe.clustering.estimator import TransformerKMeans
from ktframe.core import reference
from ktframe.core.errors import InputError, KtframeError, NotFittedError, PluginError, UnknownNameError
from ktframe.core.result import ClusteringResult
from ktframe.hooks.hookspecs import hookimpl
from ktframe.plugin.build import build_model
from ktframe.plugin.variant import Tolerance, Variant, exact_tolerance
from ktframe.transformer.model import KMeansTransformer

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
