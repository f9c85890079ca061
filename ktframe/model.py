"""The k-means transformer (Clarkson et al. 2026, Theorem 2.1): two token streams, four attention heads per layer.

Read top to bottom: projections, one attention head, a feed-forward block, one layer, the model.

    points:  X̄ ← X̄ + A_cross(X̄ → C̄) + A_self(X̄ → X̄)
    centers: C̄ ← C̄ + A_cross(C̄ → X̄_new) + A_self(C̄ → C̄)   (then C̄ ← C̄ + FFN(C̄), if any)

Every head has its own Q, K, V. A head's value projection may write only a slot of the token (the
assignment, or the data coordinates): the hand-built constructions are sparse, and writing the
slot alone keeps them cheap without changing what they compute.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, NamedTuple, Sequence

import torch
from torch import nn

from ktframe import kernels
from ktframe.components.embeddings import Embedding
from ktframe.components.maps import AttentionMap, MapOutput
from ktframe.components.scores import Score
from ktframe.reference import assign
from ktframe.result import ClusteringResult
from ktframe.validation import check_model_inputs

# Queries are processed in blocks so that one block of logits holds at most MEMORY_BLOCK numbers:
# the n × n point self-attention then needs memory that grows with n, not n². Without autograd a
# layer goes further and updates its streams in blocks of CACHE_BLOCK logits, whose intermediates
# stay in cache (2^20 on a 2-core CPU: with the fused kernels of ktframe.kernels, fewer blocks cost
# less Python per layer; before them 2^18 ran 1.6x faster per layer than 2^24).
MEMORY_BLOCK = 1 << 24
CACHE_BLOCK = 1 << 20


# --- projections -----------------------------------------------------------------------------


class Select(nn.Module):
    """A fixed sparse projection: output coordinate ``o`` is ``scale[o] * token[source[o]]``.

    It is the matrix with one non-zero per row (see :attr:`matrix`), applied as a gather. The
    hand-built constructions are made of these.
    """

    def __init__(self, width: int, source: Sequence[int], scale: Sequence[float] | float = 1.0) -> None:
        super().__init__()
        source = list(source)
        scales = [float(scale)] * len(source) if isinstance(scale, (int, float)) else [float(s) for s in scale]
        if len(scales) != len(source):
            raise ValueError("Select needs one scale per source coordinate")
        self.width = width
        # Python copies, for the layer's checks of what a projection reads (no tensor op per call).
        self.sources, self.scales = tuple(source), tuple(scales)
        self.register_buffer("source", torch.tensor(source, dtype=torch.long), persistent=False)
        self.register_buffer("scale", torch.tensor(scales), persistent=False)
        contiguous = source == list(range(source[0], source[0] + len(source))) if source else False
        self._slice = slice(source[0], source[0] + len(source)) if contiguous else None
        self._unit = all(s == 1.0 for s in scales)

    @property
    def matrix(self) -> torch.Tensor:
        """The dense ``(out, width)`` matrix this projection applies."""
        m = torch.zeros(len(self.source), self.width, dtype=self.scale.dtype, device=self.scale.device)
        m[torch.arange(len(self.source)), self.source] = self.scale
        return m

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        picked = tokens[..., self._slice] if self._slice is not None else tokens.index_select(-1, self.source)
        return picked if self._unit else picked * self.scale.to(tokens.dtype)


class Linear(nn.Linear):
    """A learnable projection; :attr:`matrix` for symmetry with :class:`Select`."""

    @property
    def matrix(self) -> torch.Tensor:
        return self.weight


# --- one attention head ----------------------------------------------------------------------


class AttentionHead(nn.Module):
    """``softmax_like(score(Q z, K z')) · V z'``, written into ``slot`` of the query tokens.

    ``score`` and ``attention_map`` are registry components. ``gamma`` is the inverse temperature
    (``scale`` multiplies it, e.g. 1/√d_emb for learned heads). ``identity=True`` is the documented
    limit mode of a reset head whose queries are its keys: with the hand-built weights in the hard
    limit its map is exactly the identity, so it is applied as such, in O(n) instead of O(n²).

    A softmax head whose score has a dot-product form (Euclidean, dot) runs through PyTorch's
    fused ``scaled_dot_product_attention``: ``−γ‖q − k‖²`` is ``2γ q·k − γ‖k‖²`` up to a constant
    per query, so the kernel gets scale ``2γ`` and the per-key bias ``−γ‖k‖²`` as one more
    coordinate of the keys, and never holds the whole (m, n) weight matrix.
    """

    def __init__(
        self,
        q: nn.Module,
        k: nn.Module,
        v: nn.Module,
        score: Score,
        attention_map: AttentionMap,
        *,
        slot: slice,
        gamma: float = 1.0,
        scale: float = 1.0,
        dropout: float = 0.0,
        identity: bool = False,
    ) -> None:
        super().__init__()
        self.q, self.k, self.v = q, k, v
        self.score, self.map = score, attention_map
        self.slot = slot
        self.gamma = float(gamma) * float(scale)
        self.dropout = nn.Dropout(dropout)
        self.identity = identity
        self.fused = not identity and attention_map.softmax and score.dot_product_form(self.gamma) is not None
        # An arg-max over dot-product-form logits: on CPU a kernel reduces them tile by tile
        # without building the block's logits (ktframe.kernels.argmax_dot).
        self.fused_argmax = not identity and attention_map.argmax and score.dot_product_form(self.gamma) is not None

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
        if not (self.identity and isinstance(v, Select) and v._slice == self.slot and len(set(v.scales)) == 1):
            return None
        return 1.0 + v.scales[0]

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.attend(queries, *self.project(keys))

    def project(self, keys: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The keys' K and V projections (none for the identity mode, which reads no keys). Linear
        attention reads its keys only through ``Σ kᵢ vᵢᵀ`` and ``Σ kᵢ``: those are returned instead,
        computed once for every block of queries."""
        if self.identity:
            return None, None
        if self.linear_attention:
            return key_value_sums(self.k(keys), self.v(keys))
        return self.k(keys), self.v(keys)

    def attend(self, queries: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, block: int = MEMORY_BLOCK, into: torch.Tensor | None = None) -> torch.Tensor:
        """The head's output for ``queries`` given projected keys, in blocks of ``block`` logits;
        written into ``into`` (say, rows of the token stream's slot) if given, and returned."""
        if not self.needs_row_blocks:
            if self.identity:
                values = self.v(queries)
            elif self.fused:
                values = self._fused(self.q(queries), k, v)
            else:  # linear attention, which may write into its slot itself
                return self._linear_attention(self.q(queries), k, v, queries, into)
            return values if into is None else into.copy_(values)
        q = self.q(queries)
        step = max(1, block // max(1, k.shape[0] * k.shape[1]))
        if into is not None:
            for i in range(0, q.shape[1], step):
                self._block(q[:, i : i + step], k, v, queries[:, i : i + step], into[:, i : i + step])
            return into
        if step >= q.shape[1]:
            return self._block(q, k, v, queries)
        return torch.cat([self._block(q[:, i : i + step], k, v, queries[:, i : i + step]) for i in range(0, q.shape[1], step)], dim=1)

    def weights(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The dense attention map ``(B, m, n)`` (for inspection and pictures)."""
        if self.identity:
            return torch.eye(queries.shape[1], dtype=queries.dtype, device=queries.device).expand(queries.shape[0], -1, -1)
        return self.map_weights(self.q(queries), self.k(keys))

    def map_weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The dense map ``(B, m, n)`` of projected queries and keys."""
        out = self.map(self._logits(q, k))
        if out.weights is not None:
            return out.weights
        weights = torch.nn.functional.one_hot(out.index, k.shape[1]).to(q.dtype)
        if out.ties is not None:
            tied, tie_weights = out.ties
            weights[tied[:, 0], tied[:, 1]] = tie_weights
        return weights

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

    def _logits(self, q, k):
        score = self.score.up_to_query_constant if self.map.shift_invariant else self.score
        return score(q, k, self.gamma)

    def _block(self, q, k, v, queries, into=None):
        found = self.winners(q, k)
        if found is not None and not found.undecided:
            out = MapOutput(index=found.index)
        else:  # not fused, or a tie / NaN among the kernel's rows: the map decides
            out = self.map(self._logits(q, k))
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
    ) -> kernels.Winners | None:
        """The CPU arg-max kernel's :class:`~ktframe.kernels.Winners` for projected queries and
        keys, where a query without a clear winner (close rivals, a NaN: the map must decide it)
        has index −1; the other arguments as in :func:`ktframe.kernels.argmax_dot`. None
        where the kernel does not apply: not an arg-max head of dot-product form, a GPU, autograd."""
        if not (self.fused_argmax and min(*q.shape, k.shape[1]) and kernels.usable(q, k)):
            return None
        return kernels.argmax_dot(q, k, *self.score.dot_product_form(self.gamma), values=values, gather=gather, skip=skip, track_moved=track_moved)

    def _fused(self, q, k, v):
        a, b = self.score.dot_product_form(self.gamma)
        f = v.shape[-1]
        if b:
            # The per-key bias b‖k‖² rides in one more coordinate: [q, 1]·[k, (b/a)‖k‖²]. As an
            # additive mask it would need a gradient, which sends PyTorch's CPU kernel down its
            # unfused path.
            q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)
            k = torch.cat([k, (b / a) * k.pow(2).sum(-1, keepdim=True)], dim=-1)
        # The fused kernels want q, k and v of one width: zero coordinates change nothing.
        width = max(q.shape[-1], f)
        q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))
        p = self.dropout.p if self.training else 0.0
        out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), dropout_p=p, scale=a)
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


class KeyValueSums:
    """Running ``Σᵢ kᵢ vᵢᵀ`` (B, e, f) and ``Σᵢ kᵢ`` (B, e) over blocks of keys ``k`` (B, n, e) and
    values ``v`` (B, n, f): all that normalized linear attention reads of its keys.

    Summed over blocks of keys, which stay in cache where one product over all keys would not.
    Sparse keys (the one-hot assignments) are summed by a kernel that visits only their
    non-zeros, O(n · f) instead of the O(n · e · f) product (:mod:`ktframe.kernels`).
    """

    def __init__(self) -> None:
        self.kv: torch.Tensor | None = None
        self.mass: torch.Tensor | None = None

    def add(self, k: torch.Tensor, v: torch.Tensor) -> None:
        B, n, e = k.shape
        if self.kv is None:
            self.kv, self.mass = k.new_zeros(B, e, v.shape[-1]), k.new_zeros(B, e)
        if kernels.usable(k, v, self.kv) and kernels.add_sparse_key_sums(k, v, self.kv, self.mass):
            return
        step = max(1, CACHE_BLOCK // max(1, B * e))
        for i in range(0, n, step):
            keys = k[:, i : i + step]
            self.kv.baddbmm_(keys.transpose(1, 2), v[:, i : i + step])
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


class FeedForward(nn.Module):
    """``down(activation(up(z)))`` written into ``slot``."""

    def __init__(self, up: nn.Module, activation: nn.Module, down: nn.Module, *, slot: slice) -> None:
        super().__init__()
        self.up, self.activation, self.down = up, activation, down
        self.slot = slot

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(tokens)))


def add_into(tokens: torch.Tensor, slot: slice, update: torch.Tensor) -> torch.Tensor:
    """One residual step, ``update`` landing in ``slot`` alone. Without autograd the tokens are
    updated in place: the streams are the model's own working tensors, and copying a
    (B, n, d + k) stream at every step would cost more than the attention itself."""
    if torch.is_grad_enabled() and (tokens.requires_grad or update.requires_grad):
        if slot.start in (0, None) and slot.stop in (None, tokens.shape[-1]):
            return tokens + update
        out = tokens.clone()
        out[..., slot] = out[..., slot] + update
        return out
    tokens[..., slot] += update
    return tokens


# --- one layer ------------------------------------------------------------------------------


class Layer(nn.Module):
    """One Lloyd iteration's worth of attention: the point stream, then the center stream reading
    the points as this layer left them.

    ``forward`` can also keep track of the tasks that have converged, in ``settled``, a ``(B,)``
    bool tensor. A step that leaves a task's streams exactly as they were marks it True (where
    the layer can tell: a hard assignment by cluster, see :meth:`_assign`; elsewhere every task
    is marked False). Applied again, the layer (a deterministic function of each task's
    streams) would leave such a task as it is, so the next step given the same ``settled``
    skips it: its streams stay as they are, at no cost.
    """

    def __init__(
        self,
        point_cross: AttentionHead,
        point_self: AttentionHead,
        center_cross: AttentionHead,
        center_self: AttentionHead,
        *,
        point_norm: nn.Module | None = None,
        center_norm: nn.Module | None = None,
        center_ffn: FeedForward | None = None,
    ) -> None:
        super().__init__()
        self.point_cross, self.point_self = point_cross, point_self
        self.center_cross, self.center_self = center_cross, center_self
        self.point_norm = point_norm or nn.Identity()
        self.center_norm = center_norm or nn.Identity()
        self.center_ffn = center_ffn

    def forward(self, points: torch.Tensor, centers: torch.Tensor, settled: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        in_place = self._in_place(points, centers)
        p, c = self.point_norm(points), self.center_norm(centers)
        summed = in_place and self.center_cross.linear_attention
        # A hard assignment is made, and the center keys summed, by cluster where it can be.
        skip = settled if settled is not None and bool(settled.any()) else None
        assigned = self._assign(points, c, skip, track_moved=settled is not None) if summed else None
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

            points = self._update(points, p, [(self.point_cross, c), (self.point_self, p)], in_place, add_rows)
            center_keys = sums.result()
        elif center_keys is None:
            points = self._update(points, p, [(self.point_cross, c), (self.point_self, p)], in_place)
            center_keys = self.point_norm(points)
        centers = self._update(centers, c, [(self.center_cross, center_keys), (self.center_self, c)], in_place)
        if self.center_ffn is not None:
            centers = add_into(centers, self.center_ffn.slot, self.center_ffn(centers))
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

    def _assign(self, points: torch.Tensor, c: torch.Tensor, skip: torch.Tensor | None = None, track_moved: bool = False) -> tuple[ClusterSums, torch.Tensor | None] | None:
        """The point update of a hard assignment, in place, and the center update's key sums by
        cluster, from the winners' index, with (if ``track_moved``) a ``(B,)`` bool tensor of the
        tasks in which the update changed a point; None (and nothing written) where this does
        not apply. Tasks marked in ``skip`` are left as they are.

        It applies when the point stream's one writer is an arg-max head whose slot is reset (the
        new assignment replaces the old) and the center update's keys read nothing but that slot
        (and its values nothing of it). Every point's key is then the key ``T_j`` of the value
        row ``j`` it was given, and ``Σᵢ kᵢ vᵢᵀ = Σⱼ T_j (Σ_{i→j} vᵢ)ᵀ``: sums by cluster, which
        the arg-max kernel takes in its own pass, O(n · f), and which never read the n × width
        slot just written.
        """
        cross, reset, center = self.point_cross, self.point_self, self.center_cross
        if not (
            kernels.usable(points, c)
            and points.stride(-1) == 1  # the kernel writes the slot's rows in place
            and getattr(cross, "fused_argmax", False)
            and reset.slot_factor == 0.0
            and reset.slot == cross.slot
            and isinstance(self.point_norm, nn.Identity)
            and isinstance(center.k, Select)
            and isinstance(center.v, Select)
            and all(cross.slot.start <= i < cross.slot.stop for i in center.k.sources)
            and not any(cross.slot.start <= i < cross.slot.stop for i in center.v.sources)
        ):
            return None
        k, v = cross.project(c)
        q, values, slot = cross.q(points), center.v(points), points[..., cross.slot]
        found = cross.winners(q, k, values, gather=(v, slot), skip=skip, track_moved=track_moved)
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
        written = (center.slot, self.center_self.slot)
        if (
            isinstance(cross.v, Select)
            and cross.v._unit
            and cross.v._slice == cross.slot
            and c.shape[-1] == points.shape[-1]
            and not any(s.start <= i < s.stop for s in written for i in center.k.sources)
        ):
            return ClusterSums(center.k(c), sums, sizes, skip), moved
        tokens = v.new_zeros(*v.shape[:2], points.shape[-1])
        tokens[..., cross.slot] = v
        return ClusterSums(center.k(tokens), sums, sizes, skip), moved

    def _in_place(self, *streams: torch.Tensor) -> bool:
        """Without autograd a layer updates its token streams in place."""
        return not (torch.is_grad_enabled() and (any(t.requires_grad for t in streams) or any(p.requires_grad for p in self.parameters())))

    def _update(
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
                tokens = add_into(tokens, slot, update)
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
                head.attend(queries[:, rows], k, v, CACHE_BLOCK, into=tokens[:, rows, head.slot])
                updates = []
            else:
                updates = [head.attend(queries[:, rows], k, v, CACHE_BLOCK) for head, k, v in attending]
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


class KMeansTransformer(nn.Module):
    """Embeds points and initial centers, runs the layers, reads the centers back.

    ``layers`` holds one layer per step, or a single layer shared by every step. ``forward`` can
    run more steps than layers (the layers repeat) and, with ``reembed=True``, rebuild fresh tokens
    from the current centers after every step (how a trained one-layer model is iterated).
    """

    def __init__(self, embedding: Embedding, layers: Sequence[Layer], *, d: int, k: int, n_layers: int | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(layers)
        self.d, self.k = d, k
        self.n_layers = n_layers if n_layers is not None else len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        for tensor in self.buffers():
            if tensor.is_floating_point():
                return tensor.dtype
        return next(self.parameters()).dtype

    def layer(self, step: int) -> Layer:
        return self.layers[step % len(self.layers)]

    def forward(self, X: torch.Tensor, C0: torch.Tensor, *, n_steps: int | None = None, reembed: bool = False, skip_settled: bool = True) -> ClusteringResult:
        """Cluster each task of ``X`` (B, n, d) from its initial centers ``C0`` (B, k, d).

        Once a step leaves a task's token streams exactly as they were (Lloyd's iteration has
        converged), the remaining steps skip it, where its layers can tell (:class:`Layer`) and
        those steps apply that same layer: each of them would leave the task as it is again, so
        its result is the same. ``skip_settled=False`` runs every step on every task. The
        result's ``n_iter`` counts, for each task, the steps up to the first that left it as it was.
        """
        X, C0 = check_model_inputs(X, C0, d=self.d, k=self.k, dtype=self.dtype)
        steps = self.n_layers if n_steps is None else n_steps
        points, centers = self.embedding.points(X, self.k), self.embedding.centers(C0)
        trajectory = [C0]  # copies: without autograd the streams are updated in place
        n_iter = torch.full((X.shape[0],), steps, dtype=torch.long)
        settled = torch.zeros(X.shape[0], dtype=torch.bool)
        layers = [self.layer(step) for step in range(steps)]
        for step, layer in enumerate(layers):
            if reembed and step > 0:
                points, centers = self.embedding.points(X, self.k), self.embedding.centers(trajectory[-1])
            watch = skip_settled and not reembed and not torch.is_grad_enabled() and _reports_settled(layer)
            if watch and all(later is layer for later in layers[step + 1 :]):
                points, centers = layer(points, centers, settled=settled)
                n_iter[settled & (n_iter == steps)] = step + 1
            else:
                settled.fill_(False)  # what another layer leaves as it is, this one may change
                points, centers = layer(points, centers)
            trajectory.append(self.embedding.read_centers(centers, self.d).clone())
        assignments = self.embedding.read_assignments(points, self.d, self.k)
        if assignments is None:  # tokens without an assignment slot: nearest final center
            assignments = assign(X, trajectory[-1])
        return ClusteringResult(centers=trajectory[-1], assignments=assignments, trajectory=torch.stack(trajectory, dim=1), n_iter=n_iter)


@functools.cache
def _takes_settled(forward: Callable) -> bool:
    return "settled" in inspect.signature(forward).parameters


def _reports_settled(layer: nn.Module) -> bool:
    """Whether a layer's forward takes ``settled`` (see :class:`Layer`): a subclass that
    overrides it without that argument cannot tell which tasks a step left as they were."""
    return _takes_settled(type(layer).forward)
