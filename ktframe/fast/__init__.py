"""The fast path a variant chooses for its model: kernel-backed, in-place twins of the definition's
classes (``model``, :func:`accelerate`) and the numba CPU kernels they call (``kernels``), which
compile on first use and are cached in the user's cache folder (``jit``).

The twins are re-exported here on first use (PEP 562), not at import: the attention maps use the
kernels, and the twins use the maps, so importing ``ktframe.fast.kernels`` must not import them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClusterSums", "FastAttentionHead", "FastHeadGroup", "FastKMeansTransformer", "FastLayer", "KeyValueSums", "accelerate", "key_value_sums"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ktframe.fast import model

        return getattr(model, name)
    raise AttributeError(f"module 'ktframe.fast' has no attribute {name!r}")
