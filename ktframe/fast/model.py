"""The fast path of the k-means transformer: the same mathematics as :mod:`ktframe.transformer.model`,
computed the way a CPU (or GPU) wants it. A variant chooses it when it builds its model, with
:func:`accelerate`; ``tests/test_fast.py`` checks each variant's fast model against the plain one.

What it changes, and why each is still the definition:
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

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from torch import nn

from ktframe.components.maps import MapOutput
from ktframe.core.reference import assign
from ktframe.core.result import ClusteringResult
from ktframe.core.validation import check_model_inputs
from ktframe.fast import steps as layer_steps
from ktframe.fast.attention import Workspace, softmax_dropout_attention
from ktframe.kernels import cpu as kernels
from ktframe.transformer.construction import HeadGroup
from ktframe.transformer.model import MEMORY_BLOCK, AttentionHead, KMeansTransformer, Layer, Select, add_into

# Without autograd a layer updates its streams in blocks of CACHE_BLOCK logits, whose intermediates
# stay in cache (with the fused kernels, fewer, larger blocks cost less Python per layer).
CACHE_BLOCK = 1 << 20


# --- one head ---------------------------------------------------------------------------------


class FastAttentionHead(AttentionHead):
    """:class:`~ktframe.transformer.model.AttentionHead` with the fused softmax and arg-max kernels and linear
    attention by key sums. It adds no state: :func:`accelerate` turns a plain head into one."""

    @functools.cached_property
    def fused(self) -> bool:
        """A softmax over dot-product-form logits: PyTorch's fused attention kernel applies it."""
        return not self.identity and self.map.softmax and self.score.dot_product_form(self.gamma) is not None

    @functools.cached_property
    def workspace(self) -> Workspace:
        """Buffers of this head's attention with dropout, lent again at every training step."""
        return Workspace()

    @functools.cached_property
    def fused_argmax(self) -> bool:
        """An arg-max over dot-product-form logits: on CPU a kernel reduces them tile by tile
        without building the block's logits (:func:`ktframe.kernels.cpu.argmax_dot`)."""
        return not self.identity and self.map.argmax and self.score.dot_product_form(self.gamma) is not None

    @property
    def linear_attention(self) -> bool:
        """Normalized linear attention, which reads its keys only through :class:`KeyValueSums`."""
        return self.score.linear and self.map.linear

    @property
    def needs_row_blocks(self) -> bool:
        """Whether the layer should feed this head its queries in cache-sized blocks: true of the
        heads that build their logits explicitly. The fused kernel blocks for itself, and the
        linear-attention path shares its Kᵀ V among all queries."""
        return not (self.identity or self.fused or self.linear_attention)

    @property
    def slot_factor(self) -> float | None:
        """For an identity-mode head whose value is ``s`` times the very slot it writes (the
        reset that erases the old assignment, ``s = −1``), the factor ``1 + s`` that its residual
        step multiplies the slot by; None for any other head."""
        v = self.v
        if not (self.identity and isinstance(v, Select) and v.span == self.slot and len(set(v.scales)) == 1):
            return None
        return 1.0 + v.scales[0]

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.attend_rows(queries, *self.project(keys))

    def project(self, keys: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The keys' K and V projections (none for the identity mode, which reads no keys). Linear
        attention reads its keys only through ``Σ kᵢ vᵢᵀ`` and ``Σ kᵢ``: those are returned instead,
        computed once for every block of queries."""
        if self.identity:
            return None, None
        if self.linear_attention:
            return key_value_sums(self.k(keys), self.v(keys))
        return self.k(keys), self.v(keys)

    def attend_rows(
        self, queries: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, block: int = MEMORY_BLOCK, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's output for ``queries`` given projected keys, in blocks of ``block`` logits;
        written into ``into`` (say, rows of the token stream's slot) if given, and returned."""
        if not self.needs_row_blocks:
            if self.identity:
                values = self.v(queries)
            elif self.fused:
                values = self._fused(self.q(queries), k, v, into)
            else:  # linear attention, which may write into its slot itself
                return self._linear_attention(self.q(queries), k, v, queries, into)
            return values if into is None else into.copy_(values)
        q = self.q(queries)
        step = max(1, block // max(1, k.shape[0] * k.shape[1]))
        if into is not None:
            for i in range(0, q.shape[1], step):
                self.attend(q[:, i : i + step], k, v, queries[:, i : i + step], into[:, i : i + step])
            return into
        if step >= q.shape[1]:
            return self.attend(q, k, v, queries)
        return torch.cat([self.attend(q[:, i : i + step], k, v, queries[:, i : i + step]) for i in range(0, q.shape[1], step)], dim=1)

    def map_rows(self, q: torch.Tensor, k: torch.Tensor, task: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """The dense map ``(T, n)`` of the few projected queries ``q[task, row]`` (in order of
        task, as ``nonzero`` gives them), each against its own task's keys: the queries of a task
        are taken together, padded to the largest such group, so that no task's keys are copied
        more than once."""
        tasks, group, per_task = task.unique_consecutive(return_inverse=True, return_counts=True)
        place = torch.arange(len(task)) - (per_task.cumsum(0) - per_task)[group]
        queries = q.new_zeros(len(tasks), int(per_task.max()), q.shape[-1])
        queries[group, place] = q[task, row]
        return self.map_weights(queries, k[tasks])[group, place]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """The definition's (4) for one block of projected queries, the arg-max through the kernel
        where it applies; written into ``into`` if given."""
        found = self.winners(q, k)
        if found is not None and not found.undecided:
            out = MapOutput(index=found.index)
        else:  # not fused, or a tie / NaN among the kernel's rows: the map decides
            out = self.map(self.logits(q, k))
        if out.index is not None:  # one winner per query: pick its value row instead of a one-hot product
            if into is not None and out.ties is None and into.stride(-1) == 1 and kernels.usable(v, into):
                kernels.gather_rows(v, out.index, into)
                return into
            B, n, e = v.shape
            rows = out.index + torch.arange(B, device=v.device).unsqueeze(-1) * n
            values = v.reshape(B * n, e).index_select(0, rows.flatten()).view(B, -1, e)
            if out.ties is not None:
                tied, weights = out.ties
                values[tied[:, 0], tied[:, 1]] = torch.bmm(weights.unsqueeze(1), v[tied[:, 0]]).squeeze(1)
        else:
            values = torch.bmm(self.dropout(out.weights), v)
        if out.stay is not None:
            values = values + out.stay * self.v(queries)
        return values if into is None else into.copy_(values)

    def winners(
        self,
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
        where the kernel does not apply: not an arg-max head of dot-product form, a GPU, autograd."""
        if not (self.fused_argmax and min(*q.shape, k.shape[1]) and kernels.usable(q, k)):
            return None
        return kernels.argmax_dot(q, k, *self.score.dot_product_form(self.gamma), values=values, gather=gather, skip=skip, track_moved=track_moved, known=known)

    def _fused(self, q, k, v, into=None):
        a, b = self.score.dot_product_form(self.gamma)
        f = v.shape[-1]
        if f > q.shape[-1] + 1 and not torch.is_grad_enabled() and not (self.training and self.dropout.p > 0):
            return _softmax_rows(q, k, v, a, b, into)
        if b:
            # The per-key bias b‖k‖² rides in one more coordinate: [q, 1]·[k, (b/a)‖k‖²]. As an
            # additive mask it would need a gradient, which sends PyTorch's CPU kernel down its
            # unfused path.
            q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)
            k = torch.cat([k, (b / a) * k.pow(2).sum(-1, keepdim=True)], dim=-1)
        if self.training and self.dropout.p > 0:  # PyTorch's kernels would draw a dense mask
            return softmax_dropout_attention(q, k, v, a, self.dropout.p, workspace=self.workspace)
        # The fused kernels want q, k and v of one width: zero coordinates change nothing.
        width = max(q.shape[-1], f)
        q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), scale=a)
        return out.squeeze(1)[..., :f]

    def _linear_attention(self, q, kv, mass, queries, into=None):
        # Normalized linear attention is associative: (q Kᵀ) V / (q Kᵀ 1) = q (Kᵀ V) / q (Kᵀ 1),
        # which costs O(n) per query instead of building the (m, n) weight matrix.
        if isinstance(kv, ClusterSums):
            own = self.v(queries)
            if kernels.usable(q, own, kv.keys, kv.sums, kv.sizes) and (into is None or kernels.usable(into)):
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
            values = values + empty.to(values.dtype) * self.v(queries)
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


class FastHeadGroup(HeadGroup):
    """:class:`~ktframe.transformer.construction.HeadGroup` as the fast layer drives a head: its heads'
    projections travel concatenated, so a group holds no linear-attention head (whose projection
    is a pair of key sums, not one row per key), and it is never an in-place rescale."""

    linear_attention = False
    slot_factor = None

    @property
    def needs_row_blocks(self) -> bool:
        return any(head.needs_row_blocks for head in self.heads)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.attend_rows(queries, *self.project(keys))

    def project(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projected = [head.project(keys) for head in self.heads]
        if any(head.linear_attention or head.slot_factor is not None for head in self.heads):
            raise ValueError("a HeadGroup cannot hold a linear-attention head or an in-place reset; give it a layer slot of its own")
        return torch.cat([k for k, _ in projected], dim=-1), torch.cat([v for _, v in projected], dim=-1)

    def attend_rows(self, queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int = MEMORY_BLOCK) -> torch.Tensor:
        ks = k.split([kw for kw, _ in self.widths], dim=-1)
        vs = v.split([vw for _, vw in self.widths], dim=-1)
        return torch.cat([head.attend_rows(queries, hk, hv, block) for head, hk, hv in zip(self.heads, ks, vs)], dim=-1)


def add_in_place(tokens: torch.Tensor, slot: slice, update: torch.Tensor) -> torch.Tensor:
    """One residual step, ``update`` landing in ``slot`` alone. Without autograd the tokens are
    updated in place: the streams are the model's own working tensors, and copying a (B, n, d + k)
    stream at every step would cost more than the attention itself."""
    if torch.is_grad_enabled() and (tokens.requires_grad or update.requires_grad):
        return add_into(tokens, slot, update)
    tokens[..., slot] += update
    return tokens


# --- one layer --------------------------------------------------------------------------------


class FastLayer(Layer):
    """:class:`~ktframe.transformer.model.Layer`, updating its streams in place, making a hard assignment and
    its cluster sums in one kernel pass where it can (:meth:`_assign`), and keeping track of the
    tasks that have converged.

    ``forward`` takes ``settled``, a ``(B,)`` bool tensor, if given: a step that leaves a task's
    streams exactly as they were marks it True (where the layer can tell: a hard assignment by
    cluster; elsewhere every task is marked False). Applied again, the layer (a deterministic
    function of each task's streams) would leave such a task as it is, so the next step given the
    same ``settled`` skips it: its streams stay as they are, at no cost.

    ``known``, a ``(B, n)`` int64 tensor, if given: the assignment that each point's slot holds,
    as the previous step of this layer on these very streams left it (−1: not known; all −1 to
    begin with). A step that makes its hard assignment by cluster reads it, to leave unread the
    rows of the points that stay where they were, and leaves the new one there; any other step
    sets it to −1.
    """

    def forward(
        self, points: torch.Tensor, centers: torch.Tensor, settled: torch.Tensor | None = None, known: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        in_place = self._in_place(points, centers)
        p, c = self.point_norm(points), self.center_norm(centers)
        summed = in_place and self.center_cross.linear_attention
        # A hard assignment is made, and the center keys summed, by cluster where it can be.
        skip = settled if settled is not None and bool(settled.any()) else None
        usable = known if known is not None and self.gathers_fixed_rows else None
        assigned = self._assign(points, c, skip, track_moved=settled is not None, known=usable) if summed else None
        if known is not None and (assigned is None or usable is None):
            known.fill_(-1)  # the next step cannot know what this one left in the slot
        by_cluster, moved = assigned if assigned is not None else (None, None)
        if settled is not None:
            # The point stream changes only where the kernel moved an assignment; the center
            # stream, only in the slots its update writes, which are compared as they were.
            written = self._center_slot()
            before = centers[..., written].clone() if moved is not None else None
        center_keys: torch.Tensor | tuple | None = None if by_cluster is None else (by_cluster, None)
        if center_keys is None and summed:
            # The center update's key sums are taken block by block as the point stream is
            # updated, while each block of new assignments is still in cache: one pass over the
            # points per layer instead of two.
            sums = KeyValueSums()

            def add_rows(rows: slice) -> None:
                block = self.point_norm(points[:, rows])
                sums.add(self.center_cross.k(block), self.center_cross.v(block))

            points = self.update(points, p, [(self.point_self, p), (self.point_cross, c)], in_place, add_rows)
            center_keys = sums.result()
        elif center_keys is None:
            points = self.update(points, p, [(self.point_self, p), (self.point_cross, c)], in_place)
            center_keys = self.point_norm(points)
        centers = self.update(centers, c, [(self.center_self, c), (self.center_cross, center_keys)], in_place)
        if self.center_ffn is not None:
            centers = add_in_place(centers, self.center_ffn.slot, self.center_ffn(centers))
        if settled is not None:
            if before is None:
                settled.fill_(False)
            else:
                torch.logical_not(moved.logical_or_(kernels.tasks_changed(centers[..., written], before)), out=settled)
        return points, centers

    def _center_slot(self) -> slice:
        """The center update's slot, where all its heads (and its FFN) write one; else all."""
        writers = [self.center_cross, self.center_self] + ([self.center_ffn] if self.center_ffn is not None else [])
        slots = {(w.slot.start, w.slot.stop, w.slot.step) for w in writers}
        return slice(*slots.pop()) if len(slots) == 1 else slice(None)

    def _assign(
        self, points: torch.Tensor, c: torch.Tensor, skip: torch.Tensor | None = None, track_moved: bool = False, known: torch.Tensor | None = None
    ) -> tuple[ClusterSums, torch.Tensor | None] | None:
        """The point update of a hard assignment, in place, and the center update's key sums by
        cluster, from the winners' index, with (if ``track_moved``) a ``(B,)`` bool tensor of the
        tasks in which the update changed a point; None (and nothing written) where this does
        not apply. Tasks marked in ``skip`` are left as they are; ``known`` as in :meth:`forward`.

        It applies when the point stream's one writer is an arg-max head whose slot is reset (the
        new assignment replaces the old) and the center update's keys read nothing but that slot
        (and its values nothing of it). Every point's key is then the key ``T_j`` of the value
        row ``j`` it was given, and ``Σᵢ kᵢ vᵢᵀ = Σⱼ T_j (Σ_{i→j} vᵢ)ᵀ``: sums by cluster, which
        the arg-max kernel takes in its own pass, O(n · f), and which never read the n × width
        slot just written.
        """
        if not (kernels.usable(points, c) and points.stride(-1) == 1 and self.assigns_by_cluster):  # the kernel writes the slot's rows in place
            return None
        cross, center = self.point_cross, self.center_cross
        k, v = cross.project(c)
        q, values, slot = cross.q(points), center.v(points), points[..., cross.slot]
        found = cross.winners(q, k, values, gather=(v, slot), skip=skip, track_moved=track_moved, known=known)
        if found is None:
            return None
        sums, sizes, moved = found.sums, found.sizes, found.moved
        if found.undecided:
            # The map decides the few queries without a clear winner: each is given its weights'
            # mixture of value rows, and counts in each row's sums with its weight there. Only
            # the (query, key) pairs of non-zero weight are spelled out.
            unsettled = found.index < 0 if skip is None else (found.index < 0) & ~skip.unsqueeze(1)
            task, row = unsettled.nonzero().unbind(1)
            weights = cross.map_rows(q, k, task, row)
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
        if c.shape[-1] == points.shape[-1] and self.keys_in_center_tokens:
            return ClusterSums(center.k(c), sums, sizes, skip), moved
        tokens = v.new_zeros(*v.shape[:2], points.shape[-1])
        tokens[..., cross.slot] = v
        return ClusterSums(center.k(tokens), sums, sizes, skip), moved

    @functools.cached_property
    def assigns_by_cluster(self) -> bool:
        """Whether :meth:`_assign` applies to this layer's heads: the point stream's one writer
        is a fused arg-max head whose slot is reset, and the center update's keys read nothing
        but that slot (and its values nothing of it)."""
        cross, reset, center = self.point_cross, self.point_self, self.center_cross
        return (
            getattr(cross, "fused_argmax", False)
            and reset.slot_factor == 0.0
            and reset.slot == cross.slot
            and isinstance(self.point_norm, nn.Identity)
            and isinstance(center.k, Select)
            and isinstance(center.v, Select)
            and all(cross.slot.start <= i < cross.slot.stop for i in center.k.sources)
            and not any(cross.slot.start <= i < cross.slot.stop for i in center.v.sources)
        )

    @functools.cached_property
    def gathers_fixed_rows(self) -> bool:
        """Whether the rows that :meth:`_assign` gathers into the points' slot (the value rows of
        the point update's arg-max head) are a part of the center stream that no head of the
        center update writes: the same rows from one step of this layer to the next."""
        cross = self.point_cross
        written = [self.center_cross.slot, self.center_self.slot] + ([self.center_ffn.slot] if self.center_ffn is not None else [])
        return (
            isinstance(self.center_norm, nn.Identity)
            and isinstance(cross.v, Select)
            and not any(s.start <= i < s.stop for s in written for i in cross.v.sources)
        )

    @functools.cached_property
    def keys_in_center_tokens(self) -> bool:
        """Whether, under :meth:`_assign`, the key of each value row is the center update's key
        projection of the center tokens themselves: the rows are the very slot of the key tokens
        (the index ``e_j`` of each center), which the center update does not write (given
        streams of one width)."""
        cross, center = self.point_cross, self.center_cross
        written = (center.slot, self.center_self.slot)
        return (
            isinstance(cross.v, Select)
            and cross.v.unit
            and cross.v.span == cross.slot
            and not any(s.start <= i < s.stop for s in written for i in center.k.sources)
        )

    def _in_place(self, *streams: torch.Tensor) -> bool:
        """Without autograd a layer updates its token streams in place."""
        return not (torch.is_grad_enabled() and (any(t.requires_grad for t in streams) or any(p.requires_grad for p in self.parameters())))

    def update(
        self,
        tokens: torch.Tensor,
        queries: torch.Tensor,
        heads: list[tuple[AttentionHead, torch.Tensor | tuple]],
        in_place: bool | None = None,
        after_rows: Callable[[slice], None] | None = None,
    ) -> torch.Tensor:
        """``tokens + Σ head(queries, keys)``, each head writing its slot, every head reading the
        stream as it was before this step. ``keys`` may be given already projected (a pair; for
        linear attention its key sums, or a :class:`ClusterSums` and None).
        ``after_rows(rows)`` is called once those rows are final (in place only)."""
        if not (self._in_place(tokens) if in_place is None else in_place):
            updates = [(head.slot, head(queries, keys)) for head, keys in heads]
            for slot, update in updates:
                tokens = add_in_place(tokens, slot, update)
            return tokens
        # In place, one block of rows at a time, so that each block's logits and values stay in
        # cache. Keys are projected once; a projection that is a view of this very stream is
        # copied first, so that every block reads the stream as it was.
        projected = []
        for head, keys in heads:
            k, v = keys if isinstance(keys, tuple) else head.project(keys)
            projected.append((head, *(t.clone() if isinstance(t, torch.Tensor) and _shares_memory(t, tokens) else t for t in (k, v))))
        # A head that only rescales its own slot (the reset: y + (−y) = 0) does so in place, after
        # the other heads have read the block, instead of materialising −y and adding it.
        rescale, attending = [], []
        for head, k, v in projected:
            factor = head.slot_factor
            if factor is None:
                attending.append((head, k, v))
            else:
                rescale.append((head.slot, factor))
        written = [head.slot for head, _, _ in attending]
        # A slot reset to 0 that one head writes takes that head's output as a copy: 0 + update
        # without a pass for the 0.
        copied = [written.count(slot) == 1 and (slot, 0.0) in rescale for slot in written]
        rescale = [(slot, factor) for slot, factor in rescale if not (factor == 0.0 and written.count(slot) == 1)]
        B, m = tokens.shape[:2]
        step = min([max(1, CACHE_BLOCK // (B * k.shape[1])) for head, k, _ in attending if head.needs_row_blocks], default=m)
        if after_rows is not None:  # blocks small enough for the caller's work on them to stay in cache
            step = min(step, max(1, CACHE_BLOCK // (B * tokens.shape[-1])))
        # A single head whose slot is reset writes its output straight into the stream: it has
        # read the block's queries before it writes, and no other head reads them after.
        direct = len(attending) == 1 and copied[0]
        for i in range(0, m, step):
            rows = slice(i, i + step)
            if direct:
                head, k, v = attending[0]
                head.attend_rows(queries[:, rows], k, v, CACHE_BLOCK, into=tokens[:, rows, head.slot])
                updates = []
            else:
                updates = [head.attend_rows(queries[:, rows], k, v, CACHE_BLOCK) for head, k, v in attending]
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


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# --- the model --------------------------------------------------------------------------------


class FastKMeansTransformer(KMeansTransformer):
    """:class:`~ktframe.transformer.model.KMeansTransformer` whose steps skip the tasks that have converged."""

    def forward(
        self, X: torch.Tensor, C0: torch.Tensor, *, n_steps: int | None = None, reembed: bool = False, skip_settled: bool = True, one_call: bool = True
    ) -> ClusteringResult:
        """Cluster each task of ``X`` (B, n, d) from its initial centers ``C0`` (B, k, d).

        Once a step leaves a task's token streams exactly as they were (Lloyd's iteration has
        converged), the remaining steps skip it, where its layers can tell (:class:`Layer`) and
        those steps apply that same layer: each of them would leave the task as it is again, so
        its result is the same. ``skip_settled=False`` runs every step on every task. The
        result's ``n_iter`` counts, for each task, the steps up to the first that left it as it was.

        Where every step is Lloyd's hard-assignment layer, one kernel call takes each small task
        through all of them (:mod:`ktframe.fast.steps`: the same result, bit for bit);
        ``one_call=False`` runs the steps one by one all the same.
        """
        X, C0 = check_model_inputs(X, C0, d=self.d, k=self.k, dtype=self.dtype, any_k=self.embedding.any_k)
        steps = self.n_layers if n_steps is None else n_steps
        points, centers = self.embedding.points(X, self.k), self.embedding.centers(C0)
        layers = [self.layer(step) for step in range(steps)]
        one_layer = one_call and skip_settled and not reembed and not torch.is_grad_enabled() and steps > 0 and all(layer is layers[0] for layer in layers)
        # Every step one and the same layer: where it is Lloyd's hard-assignment step, one kernel
        # takes each task through all of them (ktframe.fast.steps).
        fused = None
        if one_layer and type(layers[0]).forward is FastLayer.forward:
            fused = layer_steps.run(layers[0], points, centers, self.embedding.read_centers(centers, self.d), steps)
        if fused is not None:
            trajectory, n_iter = fused
        else:
            points, trajectory, n_iter = self._step_by_step(X, C0, points, centers, layers, reembed=reembed, skip_settled=skip_settled)
        assignments = self.embedding.read_assignments(points, self.d, self.k)
        if assignments is None:  # tokens without an assignment slot: nearest final center
            assignments = assign(X, trajectory[:, -1])
        return ClusteringResult(centers=trajectory[:, -1], assignments=assignments, trajectory=trajectory, n_iter=n_iter)

    def _step_by_step(
        self, X: torch.Tensor, C0: torch.Tensor, points: torch.Tensor, centers: torch.Tensor, layers: list[nn.Module], *, reembed: bool, skip_settled: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layers' steps, one after another: the last point stream, the trajectory of the
        centers (B, steps + 1, k, d) and each task's ``n_iter``."""
        steps = len(layers)
        read = self.embedding.read_centers
        trajectory = [C0]  # copies: without autograd the streams are updated in place
        n_iter = torch.full((X.shape[0],), steps, dtype=torch.long)
        settled = torch.zeros(X.shape[0], dtype=torch.bool)
        known = None  # made at the first step that hands it on: see FastLayer
        for step, layer in enumerate(layers):
            if reembed and step > 0:
                points, centers = self.embedding.points(X, self.k), self.embedding.centers(trajectory[-1])
            watch = skip_settled and not reembed and not torch.is_grad_enabled() and _reports_settled(layer)
            if watch and all(later is layer for later in layers[step + 1 :]):
                if known is None and _takes(type(layer).forward, "known"):
                    known = torch.full(points.shape[:2], -1, dtype=torch.long)
                points, centers = layer(points, centers, settled=settled, **({} if known is None else {"known": known}))
                n_iter[settled & (n_iter == steps)] = step + 1
                if bool(settled.all()):  # every remaining step would leave every task as it is
                    trajectory += [read(centers, self.d).clone()] * (steps - step)
                    break
            else:
                settled.fill_(False)  # what another layer leaves as it is, this one may change
                points, centers = layer(points, centers)
            trajectory.append(read(centers, self.d).clone())
        return points, torch.stack(trajectory, dim=1), n_iter


@functools.cache
def _takes(forward: Callable, argument: str) -> bool:
    return argument in inspect.signature(forward).parameters


def _reports_settled(layer: nn.Module) -> bool:
    """Whether a layer's forward takes ``settled`` (see :class:`Layer`): a subclass that
    overrides it without that argument cannot tell which tasks a step left as they were."""
    return _takes(type(layer).forward, "settled")


# --- choosing the fast path ------------------------------------------------------------------------

FAST: dict[type, type] = {AttentionHead: FastAttentionHead, HeadGroup: FastHeadGroup, Layer: FastLayer, KMeansTransformer: FastKMeansTransformer}


def accelerate(model: nn.Module, also: Mapping[type, type] | None = None) -> nn.Module:
    """``model`` on the fast path, in place: every head, head group, layer and the model itself
    become their class's fast version (which adds no state, so weights and submodules stay as they
    are). A subclass of these of a plugin's own names its fast version in ``also``, e.g.
    ``{MedoidLayer: FastMedoidLayer}`` with ``class FastMedoidLayer(MedoidLayer, FastLayer)``."""
    table = {**FAST, **(also or {})}
    fast = set(table.values())
    for module in model.modules():
        cls = type(module)
        if cls in table:
            module.__class__ = table[cls]
        elif cls not in fast and isinstance(module, tuple(FAST)):
            raise TypeError(
                f"{cls.__name__} has no fast version; pass accelerate(model, also={{{cls.__name__}: Fast{cls.__name__}}}) with a class Fast{cls.__name__}({cls.__name__}, one of {', '.join(c.__name__ for c in FAST.values())})"
            )
    return model
