"""Token embeddings: how points and centers become tokens, and how results are read back.

Point tokens carry the data and, where the embedding has one, an assignment slot; center tokens
carry the center and its index.
"""

from __future__ import annotations

import torch

from ktframe.plugin.hookspecs import Register, hookimpl


class Embedding:
    """Base class. ``d`` data coordinates always come first in every token."""

    description = ""

    def width(self, d: int, k: int) -> int:
        raise NotImplementedError

    def points(self, X: torch.Tensor, k: int) -> torch.Tensor:
        """``(B, n, d)`` -> point tokens ``(B, n, width)``."""
        raise NotImplementedError

    def centers(self, C: torch.Tensor) -> torch.Tensor:
        """``(B, k, d)`` -> center tokens ``(B, k, width)``."""
        raise NotImplementedError

    def assignment_slot(self, d: int, k: int) -> slice | None:
        """Where point tokens keep their assignment, or None when they keep none."""
        return None

    def read_centers(self, center_tokens: torch.Tensor, d: int) -> torch.Tensor:
        return center_tokens[..., :d]

    def read_assignments(self, point_tokens: torch.Tensor, d: int, k: int) -> torch.Tensor | None:
        slot = self.assignment_slot(d, k)
        return None if slot is None else point_tokens[..., slot]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def data_tokens(X: torch.Tensor, width: int) -> torch.Tensor:
    """Tokens ``(B, n, width)`` that hold ``X`` (B, n, d) in their first d coordinates and zeros
    after: new memory, which the model may update in place."""
    B, n, d = X.shape
    tokens = X.new_zeros(B, n, width)
    tokens[..., :d] = X
    return tokens


def index_tokens(B: int, k: int, like: torch.Tensor) -> torch.Tensor:
    """The one-hot index ``e_j`` of every center, ``(B, k, k)``."""
    return torch.eye(k, dtype=like.dtype, device=like.device).expand(B, k, k)


class OneHot(Embedding):
    """``[x; y]`` with ``y = 0`` at the start, and ``[c; e_j]`` (width d + k)."""

    description = "[x; assignment] and [c; one-hot index] (width d + k)"

    def width(self, d, k):
        return d + k

    def points(self, X, k):
        return data_tokens(X, X.shape[-1] + k)

    def centers(self, C):
        B, k, _ = C.shape
        return torch.cat([C, index_tokens(B, k, C)], dim=-1)

    def assignment_slot(self, d, k):
        return slice(d, d + k)


class NoIndex(Embedding):
    """Data only (width d): the ablation with no index coordinates."""

    description = "[x] and [c] (width d, no index or assignment coordinates)"

    def width(self, d, k):
        return d

    # Copies, since the model may update its token streams in place.
    def points(self, X, k):
        return data_tokens(X, X.shape[-1])

    def centers(self, C):
        return C.clone()


@hookimpl
def ktframe_register_embeddings(register: Register) -> None:
    register("onehot", OneHot)
    register("none", NoIndex)
