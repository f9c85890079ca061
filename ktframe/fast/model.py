"""The fast path of the k-means transformer: the same mathematics as :mod:`ktframe.transformer.model`,
computed the way a CPU (or GPU) wants it, through the definition's own classes.

:func:`accelerate` gives every head, head group, layer and model of a definition (a plugin's
subclasses of them included) a *plan*: a small frozen record, computed once from the module's
parts, of the route that the module's one dispatch point (``if self.plan is not None``) takes.
``repr(model)`` shows the plans; ``tests/test_fast.py`` checks each variant's fast model against its
plain one.

What the routes change, and why each is still the definition:
- **In place.** Without autograd a layer updates its token streams in place, block by block of
  query rows, each block's logits and values staying in cache; keys are projected once, and a
  projection that is a view of the stream being written is copied first, so every head reads the
  stream as it was (the definition's "every head reads the stream before this step").
- **Fused softmax.** A softmax head over a dot-product-form score runs through PyTorch's
  ``scaled_dot_product_attention``: ``−γ‖q − k‖²`` is ``2γ q·k − γ‖k‖²`` up to a constant per
  query, so the kernel gets scale ``2γ`` and the bias ``−γ‖k‖²`` as one more key coordinate.
  Without autograd, values wider than the queries (one-hot center indices: k wide, against d + 1)
  take the weights built block by block instead, which the kernel would reach by padding q and k
  to the values' width.
- **Fused arg-max.** An arg-max head over such a score runs through :func:`ktframe.kernels.cpu.argmax_dot`,
  which reduces the logits tile by tile without building them; a query whose winner it cannot tell
  within a rounding bound (near ties, NaN) is decided by the map itself, as the definition does.
- **Linear attention by sums.** Normalized linear attention is associative, ``(q Kᵀ) V / (q Kᵀ 1) =
  q (Kᵀ V) / q (Kᵀ 1)``: the keys are read once, as :class:`KeyValueSums`, and, after a hard
  assignment, as sums by cluster (:class:`ClusterSums`) taken in the arg-max kernel's own pass.
- **Resets.** A reset head in its identity mode (value −1 × its own slot) zeroes the slot instead of
  adding minus it: ``y + (−y) = 0`` exactly.
- **Converged tasks skipped.** A step that leaves a task's streams exactly as they were marks it
  settled; the later steps of the same layer, which would leave it as it is again, skip it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch
from torch import nn

from ktframe.core import host
from ktframe.core.reference import assign
from ktframe.core.result import ClusteringResult
from ktframe.core.validation import check_model_inputs
from ktframe.fast import steps as layer_steps
from ktframe.fast.attention import Workspace, softmax_dropout_attention
from ktframe.kernels import cpu as kernels
from ktframe.transformer.construction import HeadGroup
from ktframe.transformer.model import MEMORY_BLOCK, AttentionHead, KMeansTransformer, Layer, Select, add_into, center_shift, shift_bound

# Without autograd a layer updates its streams in blocks of CACHE_BLOCK logits, whose intermediates
# stay in cache (with the fused kernels, fewer, larger blocks cost less Python per layer).
CACHE_BLOCK = 1 << 20


class Plan:
    """What every plan can do besides its route: be made again for a module whose parts changed
    (:func:`~ktframe.transformer.construction.learnable` swaps its projections)."""

    def replan(self, module: nn.Module) -> nn.Module:
        return accelerate(module)


# --- one head ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadPlan(Plan):
    """The route of an :class:`~ktframe.transformer.model.AttentionHead`, one of

    - ``identity``: the identity mode, ``v(queries)``; ``rescale`` is ``1 + s`` where the value is
      ``s`` times the very slot the head writes (the reset: ``s = −1``), which a layer applies by
      rescaling the slot in place;
    - ``fused-softmax``: a softmax over dot-product-form logits, through PyTorch's fused attention;
    - ``linear-sums``: normalized linear attention, which reads its keys through their sums only;
    - ``fused-argmax``: an arg-max over dot-product-form logits, through the arg-max kernel;
    - ``blocked``: the definition's logits and map, block by block of queries.

    ``workspace`` lends the buffers of the head's attention with dropout again at every step.
    """

    route: str
    rescale: float | None = None
    workspace: Workspace = field(default_factory=Workspace, repr=False, compare=False)

    @classmethod
    def of(cls, head: AttentionHead) -> HeadPlan:
        if head.identity:
            v = head.v
            own = isinstance(v, Select) and v.span == head.slot and len(set(v.scales)) == 1
            return cls("identity", 1.0 + v.scales[0] if own else None)
        dot_product = head.score.dot_product_form(head.gamma) is not None
        if head.map.softmax and dot_product:
            return cls("fused-softmax")
        if head.score.linear and head.map.linear:
            return cls("linear-sums")
        return cls("fused-argmax" if head.map.argmax and dot_product else "blocked")

    @property
    def blocked(self) -> bool:
        """Whether a layer should feed the head its queries in cache-sized blocks: true of the
        routes that build logits. The fused kernels block for themselves, and linear attention
        shares its Kᵀ V among all queries."""
        return self.route in ("fused-argmax", "blocked")

    def forward(self, head: AttentionHead, queries: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.attend_rows(head, queries, *self.project(head, keys, weights), weights=weights)

    def project(self, head: AttentionHead, keys: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The keys' K and V projections (none for the identity mode, which reads no keys). Linear
        attention reads its keys only through ``Σ kᵢ vᵢᵀ`` and ``Σ kᵢ``: those are returned instead,
        computed once for every block of queries; the keys' ``weights``, if given, scale each
        ``kᵢ`` (a key of weight w counts as w copies of itself)."""
        if self.route == "identity":
            return None, None
        if self.route == "linear-sums":
            k = head.k(keys)
            return key_value_sums(k if weights is None else k * weights.unsqueeze(-1), head.v(keys))
        return head.k(keys), head.v(keys)

    def attend_rows(
        self,
        head: AttentionHead,
        queries: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        block: int = MEMORY_BLOCK,
        into: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The head's output for ``queries`` given projected keys, in blocks of ``block`` logits;
        written into ``into`` (say, rows of the token stream's slot) if given, and returned.
        Keys of ``weights`` (which :meth:`project` has taken into linear attention's sums) go
        through the definition's map, block by block: no fused kernel weighs its keys."""
        weighted = weights is not None and self.route != "linear-sums"
        if self.route == "identity":
            values = head.v(queries)
        elif self.route == "fused-softmax" and not weighted:
            values = self._fused(head, head.q(queries), k, v, into)
        elif self.route == "linear-sums":  # which may write into its slot itself
            return self._linear_sums(head, head.q(queries), k, v, queries, into)
        else:
            q = head.q(queries)
            step = max(1, block // max(1, k.shape[0] * k.shape[1]))
            rows = [slice(i, i + step) for i in range(0, q.shape[1], step)]
            if weighted:
                values = torch.cat([head.attend(q[:, r], k, v, queries[:, r], weights) for r in rows], dim=1)
            elif into is not None:
                for r in rows:
                    self.attend(head, q[:, r], k, v, queries[:, r], into[:, r])
                return into
            else:
                blocks = [self.attend(head, q[:, r], k, v, queries[:, r]) for r in rows]
                return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
        return values if into is None else into.copy_(values)

    def attend(
        self, head: AttentionHead, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The definition's (4) for one block of projected queries, the arg-max through the kernel
        where it decides every query (each then takes its winner's value row); written into
        ``into`` if given."""
        found = self.winners(head, q, k) if kernels.usable(q, k) else None
        if found is None or found.undecided or not kernels.eligible(v):  # the definition's map decides
            values = head.attend(q, k, v, queries)
        else:
            usable = into is not None and into.stride(-1) == 1 and kernels.eligible(into)
            values = into if usable else v.new_empty(*found.index.shape, v.shape[-1])
            kernels.gather_rows(v, found.index, values)
        return values if into is None or values is into else into.copy_(values)

    def winners(
        self,
        head: AttentionHead,
        q: torch.Tensor,
        k: torch.Tensor,
        values: torch.Tensor | None = None,
        gather: tuple[torch.Tensor, torch.Tensor] | None = None,
        skip: torch.Tensor | None = None,
        track_moved: bool = False,
        known: torch.Tensor | None = None,
    ) -> kernels.Winners | None:
        """The CPU arg-max kernel's :class:`~ktframe.kernels.cpu.Winners` for projected queries and
        keys, where a query without a clear winner (close rivals, a NaN: the map must decide it)
        has index −1; the other arguments as in :func:`ktframe.kernels.cpu.argmax_dot`. None
        where the kernel does not apply: another route, a GPU, autograd. The caller has found
        the step large enough for the kernels (:func:`ktframe.kernels.cpu.usable`), counting
        what it reads: the queries' token stream may hold many more numbers than ``q``."""
        if not (self.route == "fused-argmax" and min(*q.shape, k.shape[1]) and kernels.eligible(q, k)):
            return None
        a, b = head.score.dot_product_form(head.gamma)
        return kernels.argmax_dot(q, k, a, b, values=values, gather=gather, skip=skip, track_moved=track_moved, known=known)

    def map_rows(self, head: AttentionHead, q: torch.Tensor, k: torch.Tensor, task: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """The dense map ``(T, n)`` of the few projected queries ``q[task, row]`` (in order of
        task, as ``nonzero`` gives them), each against its own task's keys: the queries of a task
        are taken together, padded to the largest such group, so that no task's keys are copied
        more than once."""
        tasks, group, per_task = task.unique_consecutive(return_inverse=True, return_counts=True)
        place = torch.arange(len(task)) - (per_task.cumsum(0) - per_task)[group]
        queries = q.new_zeros(len(tasks), int(per_task.max()), q.shape[-1])
        queries[group, place] = q[task, row]
        return head.map_weights(queries, k[tasks])[group, place]

    def _fused(self, head, q, k, v, into=None):
        a, b = head.score.dot_product_form(head.gamma)
        f = v.shape[-1]
        dropout = head.dropout.p if head.training else 0.0
        if f > q.shape[-1] + 1 and not torch.is_grad_enabled() and not dropout:
            return _softmax_rows(q, k, v, a, b, into)
        if b:
            # The per-key bias b‖k‖² rides in one more coordinate: [q, 1]·[k, (b/a)‖k‖²]. As an
            # additive mask it would need a gradient, which sends PyTorch's CPU kernel down its
            # unfused path.
            q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)
            k = torch.cat([k, (b / a) * k.pow(2).sum(-1, keepdim=True)], dim=-1)
        if dropout > 0:  # PyTorch's kernels would draw a dense mask
            return softmax_dropout_attention(q, k, v, a, dropout, workspace=self.workspace)
        # The fused kernels want q, k and v of one width: zero coordinates change nothing.
        width = max(q.shape[-1], f)
        q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), scale=a)
        return out.squeeze(1)[..., :f]

    def _linear_sums(self, head, q, kv, mass, queries, into=None):
        # Normalized linear attention is associative: (q Kᵀ) V / (q Kᵀ 1) = q (Kᵀ V) / q (Kᵀ 1),
        # which costs O(n) per query instead of building the (m, n) weight matrix.
        if isinstance(kv, ClusterSums):
            own = head.v(queries)
            if kernels.eligible(q, own, kv.keys, kv.sums, kv.sizes) and (into is None or kernels.eligible(into)):
                out = into if into is not None else q.new_empty(*q.shape[:2], kv.sums.shape[-1])
                kernels.cluster_attention(q, kv.keys, kv.sums, kv.sizes, own, out, kv.skip)
                return out
            if kv.skip is not None and bool(kv.skip.any()):
                raise ValueError("ClusterSums that skip tasks need the cluster-attention kernel")
            kv, mass = kv.totals()
        numerator = torch.bmm(q, kv)
        mass = torch.bmm(q, mass.unsqueeze(-1))
        empty = mass == 0
        values = numerator / torch.where(empty, torch.ones_like(mass), mass)
        if bool(empty.any()):  # no key matches: the query keeps its own value (an empty cluster stays)
            values = values + empty.to(values.dtype) * head.v(queries)
        return values if into is None else into.copy_(values)


def _softmax_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: float, b: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(a q·k + b‖k‖²) v`` with the weights built, in blocks of ``CACHE_BLOCK``, for
    values wider than the queries: the fused kernel would pad q and k to v's width, which
    multiplies the cost of ``q kᵀ`` (a center's one-hot value row is k wide, its query d). Where
    the value rows are the unit vectors (one-hot rows in key order), the weights are the output.
    Written into ``out`` if given."""
    B, m, _ = q.shape
    n = k.shape[1]
    unit = n == v.shape[-1] and torch.equal(v, torch.eye(n, dtype=v.dtype, device=v.device).expand_as(v))
    bias = (b * k.pow(2).sum(-1)).unsqueeze(1)  # (B, 1, n), added to every query's logits
    out = q.new_empty(B, m, v.shape[-1]) if out is None else out
    step = max(1, CACHE_BLOCK // max(1, B * n))
    for i in range(0, m, step):
        weights = _softmax_(torch.baddbmm(bias, q[:, i : i + step], k.transpose(1, 2), alpha=a))
        out[:, i : i + step] = weights if unit else torch.bmm(weights, v)
    return out


# PyTorch's CPU softmax takes rows shorter than this a number at a time: about 18 ns a number
# against 3-4 ns for the max, exp and sum that make it (2-3 ns for its own kernel on longer rows).
SHORT_ROW = 16


def _softmax_(logits: torch.Tensor) -> torch.Tensor:
    """The softmax of every row of ``logits``, in place where its rows are short (no autograd)."""
    if logits.shape[-1] >= SHORT_ROW:
        return logits.softmax(dim=-1)
    logits -= logits.amax(dim=-1, keepdim=True)
    logits.exp_()
    logits /= logits.sum(dim=-1, keepdim=True)
    return logits


class KeyValueSums:
    """Running ``Σᵢ kᵢ vᵢᵀ`` (B, e, f) and ``Σᵢ kᵢ`` (B, e) over blocks of keys ``k`` (B, n, e) and
    values ``v`` (B, n, f): all that normalized linear attention reads of its keys.

    Summed over blocks of keys, which stay in cache where one product over all keys would not.
    Sparse keys (the one-hot assignments) are summed by a kernel that visits only their
    non-zeros, O(n · f) instead of the O(n · e · f) product (:mod:`ktframe.kernels.cpu`).
    """

    def __init__(self) -> None:
        self.kv: torch.Tensor | None = None
        self.mass: torch.Tensor | None = None
        self.dense = False  # once a block's keys were found dense, the later ones go to the product

    def add(self, k: torch.Tensor, v: torch.Tensor) -> None:
        B, n, e = k.shape
        f = v.shape[-1]
        if self.kv is None:
            # Over a long run of keys, BLAS (MKL) sums a small product several times faster into
            # the orientation with fewer rows than columns: kvᵀ = vᵀ k where e > f.
            self.kv = k.new_zeros(B, f, e).transpose(1, 2) if e > f else k.new_zeros(B, e, f)
            self.mass = k.new_zeros(B, e)
        if not self.dense and kernels.usable(k, v, self.kv):
            if kernels.add_sparse_key_sums(k, v, self.kv, self.mass):
                return
            self.dense = True
        step = max(1, CACHE_BLOCK // max(1, B * e))
        for i in range(0, n, step):
            keys, values = k[:, i : i + step], v[:, i : i + step]
            if e > f:
                self.kv.transpose(1, 2).baddbmm_(values.transpose(1, 2), keys)
            else:
                self.kv.baddbmm_(keys.transpose(1, 2), values)
            self.mass.add_(keys.sum(dim=1))

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv, self.mass


class ClusterSums(NamedTuple):
    """All that normalized linear attention reads of keys that take one of a few values: those
    values ``keys`` (B, r, e), and by each, the sum ``sums`` (B, r, f) and number ``sizes`` (B, r)
    of the values of the keys equal to it. ``Σᵢ kᵢ vᵢᵀ = Σ_r keys_r sums_rᵀ``: the keys of a hard
    assignment's points are their clusters' keys, and the arg-max kernel sums by cluster.
    ``skip`` (B,) bool, if given: tasks whose sums were not taken, whose queries the attention
    must leave as they are (converged tasks, see :class:`Layer`)."""

    keys: torch.Tensor
    sums: torch.Tensor
    sizes: torch.Tensor
    skip: torch.Tensor | None = None

    def totals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``Σᵢ kᵢ vᵢᵀ`` (B, e, f) and ``Σᵢ kᵢ`` (B, e)."""
        table = self.keys.transpose(1, 2)
        return torch.bmm(table, self.sums), torch.bmm(table, self.sizes.unsqueeze(-1)).squeeze(-1)


def key_value_sums(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Σᵢ kᵢ vᵢᵀ`` and ``Σᵢ kᵢ`` over all keys at once (see :class:`KeyValueSums`)."""
    sums = KeyValueSums()
    sums.add(k, v)
    return sums.result()


def add_in_place(tokens: torch.Tensor, slot: slice, update: torch.Tensor) -> torch.Tensor:
    """One residual step, ``update`` landing in ``slot`` alone. Without autograd the tokens are
    updated in place: the streams are the model's own working tensors, and copying a (B, n, d + k)
    stream at every step would cost more than the attention itself."""
    if torch.is_grad_enabled() and (tokens.requires_grad or update.requires_grad):
        return add_into(tokens, slot, update)
    tokens[..., slot] += update
    return tokens


@dataclass(frozen=True)
class GroupPlan(Plan):
    """The route of a :class:`~ktframe.transformer.construction.HeadGroup`: its heads' projections
    travel concatenated, one row per key, and each head attends by its own plan; ``blocked`` where
    one of them builds logits. So a group holds no ``linear-sums`` head (whose projection is a pair
    of key sums) and no in-place reset."""

    blocked: bool
    route: ClassVar[str] = "group"
    rescale: ClassVar[None] = None

    @classmethod
    def of(cls, group: HeadGroup) -> GroupPlan:
        plans = [head.plan for head in group.heads]
        if any(plan.route == "linear-sums" or plan.rescale is not None for plan in plans):
            raise ValueError("a HeadGroup cannot hold a linear-attention head or an in-place reset; give it a layer slot of its own")
        return cls(any(plan.blocked for plan in plans))

    def forward(self, group: HeadGroup, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.attend_rows(group, queries, *self.project(group, keys))

    def project(self, group: HeadGroup, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projected = [head.plan.project(head, keys) for head in group.heads]
        return torch.cat([k for k, _ in projected], dim=-1), torch.cat([v for _, v in projected], dim=-1)

    def attend_rows(
        self, group: HeadGroup, queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int = MEMORY_BLOCK, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        ks = k.split([kw for kw, _ in group.widths], dim=-1)
        vs = v.split([vw for _, vw in group.widths], dim=-1)
        values = torch.cat([head.plan.attend_rows(head, queries, hk, hv, block) for head, hk, hv in zip(group.heads, ks, vs)], dim=-1)
        return values if into is None else into.copy_(values)


# --- one layer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPlan(Plan):
    """The route of a :class:`~ktframe.transformer.model.Layer` (or of a subclass that keeps the
    definition's ``update``): without autograd it updates its streams in place (:meth:`update`),
    and where it can

    - ``by_cluster``: makes the hard assignment and the center update's key sums by cluster in the
      arg-max kernel's one pass (:meth:`assign`): the point stream's one writer is a fused arg-max
      head whose slot is reset, and the center update is normalized linear attention whose keys
      read nothing but that slot (and its values nothing of it);
    - ``fixed_rows``: (by cluster) leaves unread the rows of the points that keep their center
      (``known``, see :meth:`forward`): the rows gathered into the points' slot are a part of the
      center stream that no head of the center update writes, the same from one step to the next;
    - ``keys_in_centers``: (by cluster) reads the key of each gathered row off the center stream,
      whose own slot those rows are, instead of building a token per row;
    - ``reports_settled``: its ``forward`` is the definition's, so the model hands it ``settled``
      and ``known`` (:meth:`forward`); a subclass's own ``forward`` is called as it is;
    - ``all_steps``: (by cluster, reading the centers' keys, reporting settled tasks) takes small
      tasks through all of the model's steps of it in one kernel call (:mod:`ktframe.fast.steps`).
    """

    by_cluster: bool
    fixed_rows: bool
    keys_in_centers: bool
    reports_settled: bool
    all_steps: bool

    @classmethod
    def of(cls, layer: Layer) -> LayerPlan | None:
        if type(layer).update is not Layer.update:  # the definition's forward calls a subclass's own update
            return None
        cross, reset, center = layer.point_cross, layer.point_self, layer.center_cross
        by_cluster = (
            cross.plan.route == "fused-argmax"
            and reset.plan.rescale == 0.0
            and reset.slot == cross.slot
            and center.plan.route == "linear-sums"
            and isinstance(layer.point_norm, nn.Identity)
            and isinstance(center.k, Select)
            and isinstance(center.v, Select)
            and all(cross.slot.start <= i < cross.slot.stop for i in center.k.sources)
            and not any(cross.slot.start <= i < cross.slot.stop for i in center.v.sources)
        )
        by_heads = [center.slot, layer.center_self.slot]  # what the center update writes
        written = by_heads + ([layer.center_ffn.slot] if layer.center_ffn is not None else [])
        rows = by_cluster and isinstance(cross.v, Select)
        fixed_rows = rows and isinstance(layer.center_norm, nn.Identity) and not any(s.start <= i < s.stop for s in written for i in cross.v.sources)
        keys_in_centers = rows and cross.v.unit and cross.v.span == cross.slot and not any(s.start <= i < s.stop for s in by_heads for i in center.k.sources)
        reports = type(layer).forward is Layer.forward
        return cls(by_cluster, fixed_rows, keys_in_centers, reports, reports and keys_in_centers and layer_steps.fits(layer))

    def forward(
        self,
        layer: Layer,
        points: torch.Tensor,
        centers: torch.Tensor,
        settled: torch.Tensor | None = None,
        known: torch.Tensor | None = None,
        sample_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's step. ``settled``, a ``(B,)`` bool tensor, if given: a step that leaves a
        task's streams exactly as they were marks it True (where the layer can tell: by cluster;
        elsewhere every task is marked False). Applied again, the layer (a deterministic function
        of each task's streams) would leave such a task as it is, so the next step given the same
        ``settled`` skips it: its streams stay as they are, at no cost.

        ``known``, a ``(B, n)`` int64 tensor, if given: the assignment that each point's slot
        holds, as the previous step of this layer on these very streams left it (−1: not known;
        all −1 to begin with). A step by cluster with ``fixed_rows`` reads it, to leave unread the
        rows of the points that stay where they were, and leaves the new one there; any other
        step sets it to −1.

        ``sample_weight`` ``(B, n)``, if given, weighs each point as a key of the center update,
        which must then be normalized linear attention (its sums weigh the keys); the sums are
        taken from the point stream, not by cluster."""
        weighted = sample_weight is not None
        if weighted and layer.center_cross.plan.route != "linear-sums":
            raise ValueError(
                f"sample weights on the fast path need a center update of normalized linear attention; this layer's is {layer.center_cross.plan.route}"
            )
        in_place = self.in_place(layer, points, centers)
        p, c = layer.point_norm(points), layer.center_norm(centers)
        summed = in_place and layer.center_cross.plan.route == "linear-sums"
        # A hard assignment is made, and the center keys summed, by cluster where it can be.
        skip = settled if settled is not None and bool(settled.any()) else None
        usable = known if known is not None and self.fixed_rows else None
        assigned = self.assign(layer, points, c, skip, track_moved=settled is not None, known=usable) if summed and not weighted else None
        if known is not None and (assigned is None or usable is None):
            known.fill_(-1)  # the next step cannot know what this one left in the slot
        by_cluster, moved = assigned if assigned is not None else (None, None)
        if settled is not None:
            # The point stream changes only where the kernel moved an assignment; the center
            # stream, only in the slots its update writes, which are compared as they were.
            written = _center_slot(layer)
            before = centers[..., written].clone() if moved is not None else None
        center_keys: torch.Tensor | tuple | None = None if by_cluster is None else (by_cluster, None)
        point_heads = [(layer.point_self, p), (layer.point_cross, c)]
        if center_keys is None and summed:
            # The center update's key sums are taken block by block as the point stream is
            # updated, while each block of new assignments is still in cache: one pass over the
            # points per layer instead of two.
            sums = KeyValueSums()

            def add_rows(rows: slice) -> None:
                block = layer.point_norm(points[:, rows])
                keys = layer.center_cross.k(block)
                sums.add(keys if not weighted else keys * sample_weight[:, rows, None], layer.center_cross.v(block))

            points = self.update(layer, points, p, point_heads, in_place, add_rows)
            center_keys = sums.result()
        elif center_keys is None:
            points = self.update(layer, points, p, point_heads, in_place)
            center_keys = layer.point_norm(points)
            if weighted:
                center_keys = layer.center_cross.plan.project(layer.center_cross, center_keys, sample_weight)
        centers = self.update(layer, centers, c, [(layer.center_self, c), (layer.center_cross, center_keys)], in_place)
        if layer.center_ffn is not None:
            centers = add_in_place(centers, layer.center_ffn.slot, layer.center_ffn(centers))
        if settled is not None:
            if before is None:
                settled.fill_(False)
            else:
                torch.logical_not(moved.logical_or_(kernels.tasks_changed(centers[..., written], before)), out=settled)
        return points, centers

    def assign(
        self,
        layer: Layer,
        points: torch.Tensor,
        c: torch.Tensor,
        skip: torch.Tensor | None = None,
        track_moved: bool = False,
        known: torch.Tensor | None = None,
    ) -> tuple[ClusterSums, torch.Tensor | None] | None:
        """The point update of a hard assignment, in place, and the center update's key sums by
        cluster, from the winners' index, with (if ``track_moved``) a ``(B,)`` bool tensor of the
        tasks in which the update changed a point; None (and nothing written) where this does
        not apply. Tasks marked in ``skip`` are left as they are; ``known`` as in :meth:`forward`.

        Every point's key is the key ``T_j`` of the value row ``j`` it was given (``by_cluster``),
        so ``Σᵢ kᵢ vᵢᵀ = Σⱼ T_j (Σ_{i→j} vᵢ)ᵀ``: sums by cluster, which the arg-max kernel takes in
        its own pass, O(n · f), and which never read the n × width slot just written.
        """
        if not (self.by_cluster and kernels.usable(points, c) and points.stride(-1) == 1):  # the kernel writes the slot's rows in place
            return None
        cross, center = layer.point_cross, layer.center_cross
        k, v = cross.plan.project(cross, c)
        q, values, slot = cross.q(points), center.v(points), points[..., cross.slot]
        found = cross.plan.winners(cross, q, k, values, gather=(v, slot), skip=skip, track_moved=track_moved, known=known)
        if found is None:
            return None
        sums, sizes, moved = found.sums, found.sizes, found.moved
        if found.undecided:
            # The map decides the few queries without a clear winner: each is given its weights'
            # mixture of value rows, and counts in each row's sums with its weight there. Only
            # the (query, key) pairs of non-zero weight are spelled out.
            unsettled = found.index < 0 if skip is None else (found.index < 0) & ~skip.unsqueeze(1)
            task, row = unsettled.nonzero().unbind(1)
            weights = cross.plan.map_rows(cross, q, k, task, row)
            pair, key = weights.nonzero().unbind(1)
            w, t = weights[pair, key].unsqueeze(-1), task[pair]
            slot[task, row] = torch.zeros(len(task), v.shape[-1], dtype=v.dtype).index_add_(0, pair, w * v[t, key])
            sums.index_put_((t, key), w * values[t, row[pair]], accumulate=True)
            sizes.index_put_((t, key), w.squeeze(-1), accumulate=True)
            if moved is not None:
                moved[task] = True  # rows written here are not compared: counted as moved
        # The key of each value row: the center update's key projection of a point token that
        # holds the row in its slot. Where the rows are the very slot of the key tokens (the
        # index e_j of each center), that is the projection of the key tokens themselves, a
        # view of the center stream, which its update must not write.
        if c.shape[-1] == points.shape[-1] and self.keys_in_centers:
            return ClusterSums(center.k(c), sums, sizes, skip), moved
        tokens = v.new_zeros(*v.shape[:2], points.shape[-1])
        tokens[..., cross.slot] = v
        return ClusterSums(center.k(tokens), sums, sizes, skip), moved

    @staticmethod
    def in_place(layer: Layer, *streams: torch.Tensor) -> bool:
        """Without autograd a layer updates its token streams in place."""
        return not (torch.is_grad_enabled() and (any(t.requires_grad for t in streams) or any(p.requires_grad for p in layer.parameters())))

    def update(
        self,
        layer: Layer,
        tokens: torch.Tensor,
        queries: torch.Tensor,
        heads: list[tuple[nn.Module, torch.Tensor | tuple]],
        in_place: bool | None = None,
        after_rows: Callable[[slice], None] | None = None,
    ) -> torch.Tensor:
        """The definition's :meth:`~ktframe.transformer.model.Layer.update`, ``tokens + Σ
        head(queries, keys)``, in place without autograd. ``keys`` may be given already projected
        (a pair; for linear attention its key sums, or a :class:`ClusterSums` and None).
        ``after_rows(rows)`` is called once those rows are final (in place only)."""
        if not (self.in_place(layer, tokens) if in_place is None else in_place):
            updates = [(head.slot, head(queries, keys)) for head, keys in heads]
            for slot, update in updates:
                tokens = add_in_place(tokens, slot, update)
            return tokens
        # In place, one block of rows at a time, so that each block's logits and values stay in
        # cache. Keys are projected once; a projection that is a view of this very stream is
        # copied first, so that every block reads the stream as it was.
        projected = []
        for head, keys in heads:
            k, v = keys if isinstance(keys, tuple) else head.plan.project(head, keys)
            projected.append((head, *(t.clone() if isinstance(t, torch.Tensor) and _shares_memory(t, tokens) else t for t in (k, v))))
        # A head that only rescales its own slot (the reset: y + (−y) = 0) does so in place, after
        # the other heads have read the block, instead of materialising −y and adding it.
        rescale = [(head.slot, head.plan.rescale) for head, _, _ in projected if head.plan.rescale is not None]
        attending = [(head, k, v) for head, k, v in projected if head.plan.rescale is None]
        written = [head.slot for head, _, _ in attending]
        # A slot reset to 0 that one head writes takes that head's output as a copy: 0 + update
        # without a pass for the 0.
        copied = [written.count(slot) == 1 and (slot, 0.0) in rescale for slot in written]
        rescale = [(slot, factor) for slot, factor in rescale if not (factor == 0.0 and written.count(slot) == 1)]
        B, m = tokens.shape[:2]
        step = min([max(1, CACHE_BLOCK // (B * k.shape[1])) for head, k, _ in attending if head.plan.blocked], default=m)
        if after_rows is not None:  # blocks small enough for the caller's work on them to stay in cache
            step = min(step, max(1, CACHE_BLOCK // (B * tokens.shape[-1])))
        # A single head whose slot is reset writes its output straight into the stream: it has
        # read the block's queries before it writes, and no other head reads them after.
        direct = len(attending) == 1 and copied[0]
        for i in range(0, m, step):
            rows = slice(i, i + step)
            if direct:
                head, k, v = attending[0]
                head.plan.attend_rows(head, queries[:, rows], k, v, CACHE_BLOCK, into=tokens[:, rows, head.slot])
                updates = []
            else:
                updates = [head.plan.attend_rows(head, queries[:, rows], k, v, CACHE_BLOCK) for head, k, v in attending]
            for slot, factor in rescale:
                if factor == 0.0:
                    tokens[:, rows, slot].zero_()
                else:
                    tokens[:, rows, slot].mul_(factor)
            for slot, update, as_copy in zip(written, updates, copied):
                if as_copy:
                    tokens[:, rows, slot].copy_(update)
                else:
                    tokens[:, rows, slot] += update
            if after_rows is not None:
                after_rows(rows)
        return tokens


def _center_slot(layer: Layer) -> slice:
    """The center update's slot, where all its heads (and its FFN) write one; else all."""
    writers = [layer.center_cross, layer.center_self] + ([layer.center_ffn] if layer.center_ffn is not None else [])
    slots = {(w.slot.start, w.slot.stop, w.slot.step) for w in writers}
    return slice(*slots.pop()) if len(slots) == 1 else slice(None)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelPlan(Plan):
    """The route of a :class:`~ktframe.transformer.model.KMeansTransformer`:

    - ``skip_settled``: once a step leaves a task's token streams exactly as they were (Lloyd's
      iteration has converged), the remaining steps skip it, where its layer can tell (by
      cluster, :class:`LayerPlan`) and those steps apply that same layer: each of them would leave
      the task as it is again, so its result is the same. The result's ``n_iter`` counts, for
      each task, the steps up to the first that left it as it was.
    - ``one_kernel_call``: where every step is one and the same layer of ``all_steps``, one kernel
      call takes each small task through all of them (:mod:`ktframe.fast.steps`: the same result,
      bit for bit).

    Each is true where some layer of the model allows it; a plan with either made False
    (``dataclasses.replace``) runs every step on every task, or the steps one by one.

    With ``tol``, a task stops after the first step whose center shift is within its bound
    (:func:`~ktframe.transformer.model.shift_bound`), as the definition says: step by step, its
    centers are repeated from then on and the steps end once every task has stopped (on the
    kernels, one call passes over a step that surely stops no task, the definition's comparison
    deciding the others); the one kernel call stops a task at a step whose shift is surely within
    its bound, and where it cannot tell (a shift within rounding of the bound) or the layer took
    some of its steps itself, the steps after the task's stop are cut off afterwards.
    """

    skip_settled: bool
    one_kernel_call: bool

    @classmethod
    def of(cls, model: KMeansTransformer) -> ModelPlan:
        plans = [layer.plan for layer in model.layers if layer.plan is not None]
        return cls(any(p.by_cluster and p.reports_settled for p in plans), any(p.all_steps for p in plans))

    def forward(
        self,
        model: KMeansTransformer,
        X: torch.Tensor,
        C0: torch.Tensor,
        *,
        n_steps: int | None = None,
        reembed: bool = False,
        tol: float | None = None,
        sample_weight: torch.Tensor | None = None,
    ) -> ClusteringResult:
        X, C0 = check_model_inputs(X, C0, d=model.d, k=model.k, dtype=model.dtype, any_k=model.embedding.any_k)
        steps = model.n_layers if n_steps is None else n_steps
        weights = None if sample_weight is None else sample_weight.to(X.dtype)
        points, centers = model.embedding.points(X, model.k), model.embedding.centers(C0)
        bound = None if tol is None else _shift_bound(X, tol, points, centers)
        layers = [model.layer(step) for step in range(steps)]
        one_layer = self.skip_settled and not reembed and not torch.is_grad_enabled() and steps > 0 and all(layer is layers[0] for layer in layers)
        # Every step one and the same layer: where it is Lloyd's hard-assignment step, one kernel
        # takes each task through all of them (ktframe.fast.steps); its sums are not weighted.
        fused = None
        if one_layer and weights is None and self.one_kernel_call and layers[0].plan is not None and layers[0].plan.all_steps:
            fused = layer_steps.run(layers[0], points, centers, model.embedding.read_centers(centers, model.d), steps, bound)
        if fused is not None:
            trajectory, n_iter, undecided = fused
            if bound is not None and bool(undecided.any()):
                points = _cut_at_tolerance(model, X, layers[0], points, trajectory, n_iter, bound)
        else:
            points, trajectory, n_iter = self._step_by_step(model, X, C0, points, centers, layers, reembed=reembed, bound=bound, weights=weights)
        assignments = model.embedding.read_assignments(points, model.d, model.k)
        if assignments is None:  # tokens without an assignment slot: nearest final center
            assignments = assign(X, trajectory[:, -1])
        return ClusteringResult(centers=trajectory[:, -1], assignments=assignments, trajectory=trajectory, n_iter=n_iter)

    def _step_by_step(
        self,
        model: KMeansTransformer,
        X: torch.Tensor,
        C0: torch.Tensor,
        points: torch.Tensor,
        centers: torch.Tensor,
        layers: list[Layer],
        *,
        reembed: bool,
        bound: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layers' steps, one after another: the last point stream, the trajectory of the
        centers (B, steps + 1, k, d) and each task's ``n_iter``. A task whose step shifts its
        centers by at most its ``bound`` stops there: its streams go on being computed with the
        others' (and are not read again), its centers and its point stream are those it stopped
        at."""
        steps = len(layers)
        embedding, read = model.embedding, model.embedding.read_centers
        trajectory = [C0]  # copies: without autograd the streams are updated in place
        n_iter = torch.full((X.shape[0],), steps, dtype=torch.long)
        settled = torch.zeros(X.shape[0], dtype=torch.bool)
        stopped = torch.zeros(X.shape[0], dtype=torch.bool)
        stopped_points: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tasks, their point streams) when they stopped
        weighted = {} if weights is None else {"sample_weight": weights}
        known = None  # made at the first step that hands it on: see LayerPlan.forward
        # Python flags spare a step the masked tensor operations while no task has settled or
        # stopped (most steps): at a small task those operations cost as much as the step.
        any_settled = any_stopped = False
        # The tasks that stopped at the step before: their point streams are kept aside only
        # once another step follows, which would change them (a copy of the whole stream).
        just_stopped = None
        # Where the steps run on the kernels, one kernel call tells a step that surely stops no
        # task (most steps) from one that may, which the exact comparison decides: after a
        # step's pass over the points, its few array operations take several times that call.
        beyond = bound.double() if bound is not None and kernels.usable(points, centers) else None
        for step, layer in enumerate(layers):
            if just_stopped is not None:
                stopped_points.append((just_stopped, points[just_stopped].clone()))
                just_stopped = None
            if reembed and step > 0:
                points, centers = embedding.points(X, model.k), embedding.centers(trajectory[-1])
            watch = self.skip_settled and not reembed and not torch.is_grad_enabled() and layer.plan is not None and layer.plan.reports_settled
            if watch and all(later is layer for later in layers[step + 1 :]):
                if known is None:
                    known = host.filled(tuple(points.shape[:2]), -1)
                points, centers = layer.plan.forward(layer, points, centers, settled=settled, known=known, **weighted)
                any_settled = bool(settled.any())
                if any_settled:
                    n_iter[settled & (n_iter == steps)] = step + 1
            else:
                settled.fill_(False)  # what another layer leaves as it is, this one may change
                any_settled = False
                points, centers = layer(points, centers, **weighted)
            current = read(centers, model.d).clone()
            if bound is not None:
                if any_stopped:
                    current[stopped] = trajectory[-1][stopped]
                may_stop = beyond is None or not kernels.shifts_beyond(trajectory[-1], current, beyond, stopped if any_stopped else None)
                if may_stop:
                    within = center_shift(trajectory[-1], current) <= bound
                    if any_stopped:
                        within &= ~stopped
                    if bool(within.any()):
                        n_iter[within] = step + 1
                        just_stopped = within.nonzero().squeeze(1)
                        stopped |= within
                        any_stopped = True
            trajectory.append(current)
            # Every remaining step would leave every task as it is, or is not read.
            if (any_settled and bool(settled.all())) or (any_stopped and bool(stopped.all())):
                trajectory += [current] * (steps - step - 1)
                break
        for tasks, kept in stopped_points:
            points[tasks] = kept
        return points, host.stacked(trajectory, dim=1), n_iter


def _shift_bound(X: torch.Tensor, tol: float, points: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """:func:`~ktframe.transformer.model.shift_bound`, on the kernels where a step on these
    token streams begins on them."""
    return shift_bound(X, tol, kernels.mean_square_deviation) if kernels.usable(points, centers) else shift_bound(X, tol)


def _cut_at_tolerance(
    model: KMeansTransformer, X: torch.Tensor, layer: Layer, points: torch.Tensor, trajectory: torch.Tensor, n_iter: torch.Tensor, bound: torch.Tensor
) -> torch.Tensor:
    """Each task of a run of ``layer`` (all its steps, each task on to the step that left it as it
    was) as if it had stopped after its first step ``s`` whose center shift is within ``bound``:
    ``trajectory`` repeats its centers of step s from then on and ``n_iter`` is s, in place; the
    point stream returned holds, for a task cut short, that of step s, made again by the layer
    from the centers before it (a step of this layer reads nothing else of its streams)."""
    steps = trajectory.shape[1] - 1
    within = center_shift(trajectory[:, :-1], trajectory[:, 1:]) <= bound.unsqueeze(1)  # (B, steps)
    stop = torch.where(within.any(dim=1), within.to(torch.int8).argmax(dim=1) + 1, steps)
    cut = stop < n_iter
    if not bool(cut.any()):
        return points
    n_iter.copy_(torch.minimum(n_iter, stop))
    tasks, at = cut.nonzero().squeeze(1), stop[cut]
    after = torch.arange(steps + 1) > at.unsqueeze(1)  # (T, steps + 1)
    kept = trajectory[tasks, at].unsqueeze(1).expand(-1, steps + 1, -1, -1)
    trajectory[tasks] = torch.where(after[..., None, None], kept, trajectory[tasks])
    embedding = model.embedding
    points[tasks] = layer(embedding.points(X[tasks], model.k), embedding.centers(trajectory[tasks, at - 1]))[0]
    return points


# --- choosing the fast path ------------------------------------------------------------------------

PLANS: tuple[tuple[type, type], ...] = ((AttentionHead, HeadPlan), (HeadGroup, GroupPlan), (Layer, LayerPlan), (KMeansTransformer, ModelPlan))


def accelerate(model: nn.Module) -> nn.Module:
    """``model`` on the fast path, in place: every head, head group, layer and model in it (a
    plugin's subclasses of these included) gets its plan, computed from its parts, which are
    planned first. The modules, their classes, weights and submodules stay as they are; a module
    whose parts change afterwards is planned again by calling this again. Returns ``model``."""
    for module in reversed(list(model.modules())):
        for kind, plan in PLANS:
            if isinstance(module, kind):
                module.plan = plan.of(module)
    return model
