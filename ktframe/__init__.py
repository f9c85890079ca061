"""ktframe: clustering algorithms written as transformer circuits.

Public interface::

    ktframe.build_model(variant, *, d, k, n_layers, gamma=inf, **options)   # hand-built model
    ktframe.reference.lloyd(X, C0, n_iter)                                   # classical Lloyd
    ktframe.TransformerKMeans(n_clusters, ...)                               # scikit-learn style
    ktframe.hookimpl                                                         # for plugins
"""

from ktframe import reference
from ktframe.errors import InputError, KtframeError, PluginError, UnknownNameError
from ktframe.estimator import TransformerKMeans
from ktframe.hookspecs import hookimpl
from ktframe.model import KMeansTransformer
from ktframe.result import ClusteringResult
from ktframe.variant import Variant, build_model

__all__ = [
    "ClusteringResult",
    "InputError",
    "KMeansTransformer",
    "KtframeError",
    "PluginError",
    "TransformerKMeans",
    "UnknownNameError",
    "Variant",
    "build_model",
    "hookimpl",
    "reference",
]
