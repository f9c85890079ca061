"""Attention maps: logits ``(B, m, n)`` to weights over the keys.

A map may leave part of a query's mass on the query itself (``stay``): the normalized linear map
does so for a query that no key matches, which is how an empty cluster keeps its center.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ktframe.core.errors import InputError
from ktframe.hooks.hookspecs import Register, hookimpl
from ktframe.kernels import cpu as kernels


@dataclass
class MapOutput:
    """Weights as a dense ``(B, m, n)`` tensor, or sparsely as ``index (B, m)``: every query puts
    weight 1 on one key, except the rows listed in ``ties = (rows (r, 2), weights (r, n))``, whose
    weights are given densely. ``stay (B, m, 1)``, when present, is the mass kept on the query."""

    weights: torch.Tensor | None = None
    index: torch.Tensor | None = None
    ties: tuple[torch.Tensor, torch.Tensor] | None = None
    stay: torch.Tensor | None = None


class AttentionMap:
    linear = False  # weights are a fixed linear function of the logits (row normalisation)
    shift_invariant = False  # adding a constant to all logits of a query changes nothing
    softmax = False  # the weights are exactly softmax(logits): a fused attention kernel may apply the map
    argmax = False  # weight 1 on the key of maximal logit (ties averaged): a fused arg-max kernel may apply it
    description = ""

    def __call__(self, logits: torch.Tensor) -> MapOutput:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Softmax(AttentionMap):
    description = "softmax over the keys (the temperature lives in the score)"
    shift_invariant = True
    softmax = True

    def __call__(self, logits):
        return MapOutput(weights=torch.softmax(logits, dim=-1))


class Hardmax(AttentionMap):
    """The gamma -> infinity limit of softmax: uniform over the keys of maximal logit.

    With ``threshold``, keys below it never win; a query with no key at or above the threshold
    keeps its own value (``stay``).
    """

    description = "arg-max over the keys, ties averaged; optional threshold below which no key wins"

    def __init__(self, threshold: float | None = None) -> None:
        self.threshold = threshold
        self.shift_invariant = self.argmax = threshold is None

    def __call__(self, logits):
        if self.threshold is None and kernels.usable(logits):
            count, index = kernels.argmax_count(logits)
            return _hard_output(logits, count, index)
        best = logits.amax(dim=-1, keepdim=True)
        # Winners as 1.0 / 0.0 in a float tensor of the logits' layout: a float compare and one
        # product (count_and_index) find every row's winners and index in vectorised passes, where
        # an arg-max (or a boolean mask) over the keys is several times slower on CPU.
        winners = torch.eq(logits, best, out=torch.empty_like(logits, dtype=_exact_index_dtype(logits)))
        if self.threshold is not None:
            supported = best >= self.threshold
            if not bool(supported.all()):
                winners.mul_(supported)
                weights = winners / winners.sum(dim=-1, keepdim=True).clamp_min(1)
                return MapOutput(weights=weights.to(logits.dtype), stay=(~supported).to(logits.dtype))
        count, index = count_and_index(winners)
        return _hard_output(logits, count, index)

    def __repr__(self) -> str:
        return f"Hardmax(threshold={self.threshold})"


def _hard_output(logits: torch.Tensor, count: torch.Tensor, index: torch.Tensor) -> MapOutput:
    """The arg-max map's output from each row's count of maximal logits and index (a sum of
    columns where the count is not 1)."""
    tied = count != 1
    if not bool(tied.any()):
        return MapOutput(index=index)
    # Exact ties are rare: spell out only the tied rows (their index, a sum, is overwritten).
    index.clamp_(max=logits.shape[-1] - 1)
    rows = logits[tied]
    winners = (rows == rows.amax(dim=-1, keepdim=True)).to(logits.dtype)
    return MapOutput(index=index, ties=(tied.nonzero(), winners / winners.sum(dim=-1, keepdim=True)))


def count_and_index(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a 0/1 float ``mask`` (…, n): the number of ones in each row, and the column of the one
    (a row with several ones gets the sum of their columns, an empty row 0). Both come from one
    product with the (n, 2) matrix ``[1, j]``, vectorised where an arg-max over the keys is not (on
    CPU). ``mask`` must be of a type that holds n exactly (see ``_exact_index_dtype``)."""
    columns = torch.arange(mask.shape[-1], dtype=mask.dtype, device=mask.device)
    if not _full_precision_matmul(mask):  # TF32 / bf16 products would round the columns
        return mask.sum(dim=-1), (mask * columns).sum(dim=-1).long()
    ones_and_columns = torch.stack([torch.ones_like(columns), columns], dim=-1)
    if mask.dim() == 3:  # bmm takes a strided (keys-major) batch as it is; matmul would copy it
        both = torch.bmm(mask, ones_and_columns.expand(mask.shape[0], -1, -1))
    else:
        both = torch.matmul(mask, ones_and_columns)
    return both[..., 0], both[..., 1].long()


def _full_precision_matmul(t: torch.Tensor) -> bool:
    """Whether a float32 product of ``t`` is computed in float32 (not TF32 or bf16)."""
    if t.dtype == torch.float64:
        return True
    if torch.get_float32_matmul_precision() != "highest":
        return False
    return not (t.is_cuda and torch.backends.cuda.matmul.allow_tf32)


def _exact_index_dtype(logits: torch.Tensor) -> torch.dtype:
    """A float type, at least as wide as the logits', that holds every key index exactly."""
    if logits.dtype == torch.float64 or logits.shape[-1] > 1 << 24:
        return torch.float64
    return torch.float32


class Normalize(AttentionMap):
    """Weights proportional to non-negative logits. A query whose logits are all zero (no key
    matches) keeps its own value instead of dividing by zero."""

    description = "logits divided by their sum; a query with zero total keeps its own value"
    linear = True

    def __call__(self, logits):
        mass = logits.sum(dim=-1, keepdim=True)
        empty = mass == 0
        weights = logits / torch.where(empty, torch.ones_like(mass), mass)
        return MapOutput(weights=weights, stay=empty.to(logits.dtype) if bool(empty.any()) else None)


def _without_empty_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A query whose keys all score −inf (a center whose cluster is empty) has nothing to attend
    to: it keeps its own value (``stay``), as with the normalized linear map. Its logits are
    zeroed so that the map itself stays finite. Returns the logits to map and the empty rows."""
    empty = torch.isneginf(logits).all(dim=-1, keepdim=True)
    if not bool(empty.any()):
        return logits, None
    return logits.masked_fill(empty, 0.0), empty


def _finish(weights: torch.Tensor, empty: torch.Tensor | None) -> MapOutput:
    if empty is None:
        return MapOutput(weights=weights)
    return MapOutput(weights=weights.masked_fill(empty, 0.0), stay=empty.to(weights.dtype))


class NormMax(AttentionMap):
    """ℓ∞ norm-max: ``argmax ⟨p, z⟩`` over the simplex subject to ``‖p‖∞ ≤ 1/s``.

    The solution is uniform over the ``s`` largest logits and exactly zero elsewhere; ``s`` keeps
    all but the ``⌊trim · m⌋`` smallest of the ``m`` finite logits, so −inf keys (outside the
    query's cluster) never count and the lowest-scoring ``trim`` fraction of the others is cut.
    ``trim=0`` is the plain average over the finite keys. Equal logits at the cut go to the lower
    key index. The weights do not depend on the logits' scale, so gradients reach only the values.
    """

    description = "uniform over the top (1 - trim) fraction of the keys with finite logits, exactly zero elsewhere (norm-max with an l-inf cap)"
    shift_invariant = True

    def __init__(self, trim: float = 0.05) -> None:
        if not 0.0 <= float(trim) < 1.0:
            raise InputError(f"trim must be a fraction in [0, 1); got {trim!r}")
        self.trim = float(trim)

    def __call__(self, logits):
        logits, empty = _without_empty_rows(logits)
        finite = torch.isfinite(logits).sum(dim=-1, keepdim=True).to(torch.float64)
        keep = finite - torch.floor(self.trim * finite)
        order = logits.argsort(dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(logits.shape[-1], device=logits.device).expand_as(order))
        kept = rank < keep.to(rank.dtype)
        weights = kept.to(logits.dtype) / keep.clamp_min(1.0).to(logits.dtype)
        return _finish(weights, empty)

    def __repr__(self) -> str:
        return f"NormMax(trim={self.trim})"


class Sparsemax(AttentionMap):
    """Sparsemax (Martins & Astudillo 2016), the Euclidean projection of the logits onto the
    simplex, from the ``entmax`` package: weights fall linearly with the logit and are exactly
    zero below a threshold."""

    description = "sparsemax (entmax package): projection onto the simplex, exactly zero below a threshold"
    shift_invariant = True

    def __call__(self, logits):
        import entmax  # imported by the models that use it, not by every import of ktframe

        logits, empty = _without_empty_rows(logits)
        return _finish(entmax.sparsemax(logits, dim=-1), empty)


class GumbelHardmax(AttentionMap):
    """Hard Gumbel-softmax: each query picks one key, key i with probability ∝ exp(logit_i)
    (the Gumbel-max trick), and puts weight 1 on it. With autograd it is straight-through: the
    forward value is the one-hot pick, the gradient that of ``softmax(logits + noise)``.

    ``seed`` seeds the map's own generator (None: torch's global one); :meth:`reseed` restarts
    it, so a model that reseeds before every run is reproducible. The noise of a call on logits
    ``(B, m, n)`` is drawn as ``(m, B, n)`` float64 uniforms: a layer that hands the map its
    queries in consecutive blocks draws exactly the numbers one call would. ``noise=False`` is
    the zero-temperature limit: the first key of maximal logit.
    """

    description = "hard Gumbel-softmax (straight-through): one key per query, sampled with probability proportional to exp(logit); seeded"
    shift_invariant = True

    def __init__(self, seed: int | None = 0, noise: bool = True) -> None:
        self.seed, self.noise = seed, noise
        self.reseed()

    def reseed(self) -> None:
        self.generator = None if self.seed is None else torch.Generator().manual_seed(int(self.seed))

    def __call__(self, logits):
        logits, empty = _without_empty_rows(logits)
        if self.noise:
            B, m, n = logits.shape
            uniform = torch.rand(m, B, n, generator=self.generator, dtype=torch.float64).transpose(0, 1)
            logits = logits - torch.log(-torch.log(uniform)).to(logits)  # + standard Gumbel noise
        index = logits.argmax(dim=-1)
        if torch.is_grad_enabled() and logits.requires_grad:
            soft = torch.softmax(logits, dim=-1)
            hard = torch.nn.functional.one_hot(index, logits.shape[-1]).to(logits.dtype)
            return _finish(hard - soft.detach() + soft, empty)
        if empty is not None:
            return _finish(torch.nn.functional.one_hot(index, logits.shape[-1]).to(logits.dtype), empty)
        return MapOutput(index=index)

    def __repr__(self) -> str:
        return f"GumbelHardmax(seed={self.seed}, noise={self.noise})"


@hookimpl
def ktframe_register_maps(register: Register) -> None:
    register("softmax", Softmax)
    register("hardmax", Hardmax)
    register("normalize", Normalize)
    register("normmax", NormMax)
    register("sparsemax", Sparsemax)
    register("gumbel-hardmax", GumbelHardmax)
