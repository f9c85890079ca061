"""Softmax attention with attention dropout, for training: the same function as
``dropout(softmax(scale · q kᵀ)) v``, without the three costs that dominate it on CPU when it is
written as PyTorch operations.

- **Sparse dropout masks.** At the paper's rate (p = 0.01) a mask over a ``(B, m, n)`` weight
  matrix drops about one weight in a hundred, yet ``bernoulli_`` draws a random number for each of
  them (a third of a training step at n = 512). :func:`dropped_positions` draws the same
  distribution — every weight dropped independently with probability p — as the gaps between
  dropped weights, which are geometric: one draw per dropped weight.
- **One saved matrix.** :class:`SoftmaxDropoutAttention` keeps the dropped weights' values aside,
  zeroes them in place in the softmax output, multiplies by ``v`` and scales the ``(m, f)`` output
  by ``1 / (1 − p)`` (not the ``(m, n)`` weights); its backward restores them for the softmax
  gradient. Autograd through the same operations would keep the logits, the weights, the mask and
  the masked weights, and pass over each of them again.
- **Buffers kept between steps.** A fresh matrix of 32 MiB or more (``(32, 512, 512)`` float32 is
  exactly that) is mapped from the system when it is allocated and unmapped when it is freed, so a
  step that allocates its logits, weights and their gradient afresh pays their page faults — more
  than the products that fill them. A :class:`Workspace` lends the same buffers step after step.

``tests/test_fast.py`` checks outputs and gradients against the plain operations under the same mask.
"""

from __future__ import annotations

import math
import weakref

import torch


def dropped_positions(shape: torch.Size, p: float, generator: torch.Generator | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Flat indices, increasing, into a tensor of ``shape`` of the entries that a dropout of rate
    ``p`` drops: each entry independently with probability ``p``. Between two dropped entries the
    number of kept ones is geometric, ``⌊ln U / ln(1 − p)⌋`` for U uniform in (0, 1], so the
    positions are the running sums of such gaps: one draw per dropped entry, not one per entry."""
    numel = shape.numel()
    if p <= 0 or numel == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    if p >= 1:
        return torch.arange(numel, device=device)
    expected = numel * p
    draws = int(expected + 6 * math.sqrt(expected) + 16)  # enough to pass the end almost always
    log_keep = math.log1p(-p)
    parts, last = [], -1
    while last < numel:
        uniform = 1.0 - torch.rand(draws, generator=generator, dtype=torch.float64)  # in (0, 1]
        gaps = (uniform.log() / log_keep).floor_().clamp_(max=numel).long() + 1
        positions = last + gaps.cumsum(0)
        parts.append(positions[positions < numel])
        last = int(positions[-1])
    picked = torch.cat(parts)
    return picked.to(device) if device is not None else picked


class Workspace:
    """Buffers lent for the ``(B, m, n)`` matrices of :class:`SoftmaxDropoutAttention`, again and
    again. A buffer is taken for the length of one call and given back at its end, or held for a
    graph (the weights its backward reads) until that graph is freed. Where no free buffer has
    the shape asked for (tasks whose n or k changes from step to step), the free ones are let go
    before a new one is made: memory stays that of the buffers in use, as without a workspace."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._holders: list = []  # per buffer: None (free), True (lent in a call), or a weak reference to the graph node holding it

    def _free(self, i: int) -> bool:
        holder = self._holders[i]
        return holder is None or (holder is not True and holder() is None)

    def take(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        for i, buffer in enumerate(self._buffers):
            if self._free(i) and buffer.shape == shape and buffer.dtype == dtype and buffer.device == device:
                self._holders[i] = True
                return buffer
        kept = [i for i in range(len(self._buffers)) if not self._free(i)]
        self._buffers = [self._buffers[i] for i in kept] + [torch.empty(shape, dtype=dtype, device=device)]
        self._holders = [self._holders[i] for i in kept] + [True]
        return self._buffers[-1]

    def _index(self, buffer: torch.Tensor) -> int:
        return next(i for i, own in enumerate(self._buffers) if own is buffer)

    def give(self, buffer: torch.Tensor) -> None:
        self._holders[self._index(buffer)] = None

    def hold(self, buffer: torch.Tensor, node: object) -> None:
        self._holders[self._index(buffer)] = weakref.ref(node)


class SoftmaxDropoutAttention(torch.autograd.Function):
    """``(softmax(scale · q kᵀ) ∘ M) v / (1 − p)`` for queries ``q (B, m, e)``, keys ``k (B, n, e)``
    and values ``v (B, n, f)``, where the mask ``M`` is 0 at the flat positions ``dropped`` of the
    ``(B, m, n)`` weights and 1 elsewhere."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, p: float, dropped: torch.Tensor, workspace: Workspace) -> torch.Tensor:
        q = q * scale  # (m, e), not the (m, n) logits
        shape = torch.Size((q.shape[0], q.shape[1], k.shape[1]))
        logits = torch.bmm(q, k.transpose(1, 2), out=workspace.take(shape, q.dtype, q.device))
        # the weights in float32 at least, as autocast computes a softmax of bf16 logits
        dtype = torch.promote_types(logits.dtype, torch.float32)
        weights = torch.softmax(logits, dim=-1, dtype=dtype, out=workspace.take(shape, dtype, q.device))
        workspace.give(logits)
        flat = weights.view(-1)
        kept_aside = flat[dropped]
        flat[dropped] = 0.0
        out = torch.bmm(weights, v).mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(q, k, v, out, dropped, kept_aside)
        # an intermediate, held on ctx (backward restores and re-masks it in place), and lent
        # from the workspace until this node is freed
        ctx.weights, ctx.scale, ctx.p, ctx.workspace = weights, scale, p, workspace
        if any(ctx.needs_input_grad):
            workspace.hold(weights, ctx)
        else:
            workspace.give(weights)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, dropped, kept_aside = ctx.saved_tensors
        weights, scale, workspace = ctx.weights, ctx.scale, ctx.workspace
        # Under autocast the forward ran in mixed types (bf16 products, a float32 softmax): the
        # backward runs in the weights' type (autograd casts each gradient to its input's type).
        q, k, v, out, grad_out = (t.to(weights.dtype) for t in (q, k, v, out, grad_out))
        grad_v = torch.bmm(weights.transpose(1, 2), grad_out * (1.0 / (1.0 - ctx.p)))
        # The softmax's gradient, w ∘ (g − Σ_j w_j g_j) with g = d(weights) (0 where dropped).
        # Σ_j w_j g_j is, per query, grad_out · out (an (m, f) product, not one over (m, n)); w
        # are the weights as the softmax gave them, restored where dropped and masked again after
        # (a second backward through a retained graph reads them as the first did).
        grad_logits = torch.bmm(grad_out * (1.0 / (1.0 - ctx.p)), v.transpose(1, 2), out=workspace.take(weights.shape, weights.dtype, weights.device))
        grad_logits.view(-1)[dropped] = 0.0
        rows = (grad_out * out).sum(dim=-1, keepdim=True)
        flat = weights.view(-1)
        flat[dropped] = kept_aside
        grad_logits.sub_(rows).mul_(weights)
        flat[dropped] = 0.0
        grad_q = torch.bmm(grad_logits, k).mul_(scale)
        grad_k = torch.bmm(grad_logits.transpose(1, 2), q)
        workspace.give(grad_logits)
        return grad_q, grad_k, grad_v, None, None, None, None


def softmax_dropout_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, p: float, dropped: torch.Tensor | None = None, workspace: Workspace | None = None
) -> torch.Tensor:
    """``dropout(softmax(scale · q kᵀ), p) v``, the dropped weights drawn here (from torch's
    global generator, as ``nn.Dropout`` draws) unless ``dropped`` gives them; its matrices in the
    buffers of ``workspace`` (a caller that attends again and again keeps one), else fresh ones."""
    if dropped is None:
        dropped = dropped_positions(torch.Size((q.shape[0], q.shape[1], k.shape[1])), p, device=q.device)
    return SoftmaxDropoutAttention.apply(q, k, v, scale, p, dropped, workspace if workspace is not None else Workspace())
