"""Token embeddings: how points and centers become tokens, and how results are read back.

Point tokens carry the data and, where the embedding has one, an assignment slot; center tokens
carry the center and its index.
"""

from __future__ import annotations

import torch
from torch import nn

from ktframe.core import host
from ktframe.hooks.hookspecs import Register, hookimpl


class Embedding:
    """Base class. ``d`` data coordinates always come first in every token.

    ``any_k``: whether it embeds any number of centers from 1 up to the model's ``k`` (True), or
    exactly ``k`` (False, the paper's models): a model whose embedding takes any k clusters tasks
    of any k up to the one it was built for."""

    description = ""
    any_k = False

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
    return host.padded(X, width)


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
        return host.concatenated(C, index_tokens(B, k, C))

    def assignment_slot(self, d, k):
        return slice(d, d + k)


class SlotIndex(nn.Module, Embedding):
    """Any number k' ≤ ``k_max`` of centers: ``[x; assignment (k_max); 0]`` and
    ``[c; e_slot; k'/k_max]`` (width d + k_max + 1), or without the last coordinate when
    ``k_feature=False`` (width d + k_max, as :class:`OneHot` for k_max).

    Each center gets the one-hot index of a slot of its own among ``k_max``: while training
    (``self.training``, which the model passes down), k' slots drawn at random per task, so that
    no slot is used more than another whatever k' the tasks have (a model trained on slots
    0..k'−1 would learn the high slots from large k alone); otherwise slots 0..k'−1, so an
    evaluation is deterministic. The last coordinate gives the center tokens the number of
    clusters of their task. The assignment slot is in slot order, not center order, so the
    assignments read back are the nearest final centers' (``read_assignments`` gives None).
    A module (with no parameters) so that it follows the model's train / eval mode; it draws from
    torch's global generator, which ``ktframe fit`` seeds at every step."""

    description = "[x; assignment] and [c; one-hot slot; k'/k_max] for any k' <= k_max clusters (width d + k_max + 1)"
    any_k = True

    def __init__(self, k_max: int, *, k_feature: bool = True) -> None:
        super().__init__()
        self.k_max, self.k_feature = k_max, k_feature

    def width(self, d, k):
        return d + k + int(self.k_feature)

    def points(self, X, k):
        return data_tokens(X, self.width(X.shape[-1], k))

    def slots(self, B: int, k: int, device: torch.device) -> torch.Tensor:
        """``(B, k)``: the slot of every center of every task."""
        if self.training:
            return torch.rand(B, self.k_max).argsort(dim=1)[:, :k].to(device)
        return torch.arange(k, device=device).expand(B, k)

    def centers(self, C):
        B, k, d = C.shape
        tokens = data_tokens(C, self.width(d, self.k_max))
        tokens[..., d : d + self.k_max].scatter_(-1, self.slots(B, k, C.device).unsqueeze(-1), 1.0)
        if self.k_feature:
            tokens[..., -1] = k / self.k_max
        return tokens

    def assignment_slot(self, d, k):
        return slice(d, d + k)

    def read_assignments(self, point_tokens, d, k):
        return None

    def extra_repr(self) -> str:
        return f"k_max={self.k_max}, k_feature={self.k_feature}"


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
