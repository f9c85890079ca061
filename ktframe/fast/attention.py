"""Softmax attention with attention dropout, for training: the same function as
``dropout(softmax(scale · q kᵀ)) v``, without the two costs that dominate it on CPU when it is
written as PyTorch operations.

- **Sparse dropout masks.** At the paper's rate (p = 0.01) a mask over a ``(B, m, n)`` weight
  matrix drops about one weight in a hundred, yet ``bernoulli_`` draws a random number for each of
  them (a third of a training step at n = 512). :func:`dropped_positions` draws the same
  distribution — every weight dropped independently with probability p — as a binomial count of
  dropped weights and that many distinct positions, uniformly.
- **One saved matrix.** :class:`SoftmaxDropoutAttention` keeps the dropped weights' values aside,
  zeroes them in place in the softmax output, multiplies by ``v`` and scales the ``(m, f)`` output
  by ``1 / (1 − p)`` (not the ``(m, n)`` weights); its backward restores them for the softmax
  gradient. Autograd through the same operations would keep the logits, the weights, the mask and
  the masked weights, and pass over each of them again.

``tests/test_fast.py`` checks outputs and gradients against the plain operations under the same mask.
"""

from __future__ import annotations

import torch


def dropped_positions(shape: torch.Size, p: float, generator: torch.Generator | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Flat indices into a tensor of ``shape`` of the entries that a dropout of rate ``p`` drops:
    each entry independently with probability ``p``. The number of dropped entries is drawn from
    Binomial(numel, p), then that many distinct positions, each set of that size equally likely
    (positions drawn uniformly, repeats drawn again: a draw that treats every position alike)."""
    numel = shape.numel()
    count = int(torch.binomial(torch.tensor(float(numel)), torch.tensor(float(p)), generator=generator))
    picked = torch.empty(0, dtype=torch.int64)
    while len(picked) < count:
        picked = torch.cat([picked, torch.randint(numel, (count - len(picked),), generator=generator)]).unique()
    return picked.to(device) if device is not None else picked


class SoftmaxDropoutAttention(torch.autograd.Function):
    """``(softmax(scale · q kᵀ) ∘ M) v / (1 − p)`` for queries ``q (B, m, e)``, keys ``k (B, n, e)``
    and values ``v (B, n, f)``, where the mask ``M`` is 0 at the flat positions ``dropped`` of the
    ``(B, m, n)`` weights and 1 elsewhere."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, p: float, dropped: torch.Tensor) -> torch.Tensor:
        q = q * scale  # (m, e), not the (m, n) logits
        weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        flat = weights.view(-1)
        kept_aside = flat[dropped]
        flat[dropped] = 0.0
        out = torch.bmm(weights, v).mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(q, k, v, out, dropped, kept_aside)
        # an intermediate, held on ctx: backward restores and re-masks it in place
        ctx.weights, ctx.scale, ctx.p = weights, scale, p
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, dropped, kept_aside = ctx.saved_tensors
        weights, scale = ctx.weights, ctx.scale
        # Under autocast the forward ran in mixed types (bf16 products, a float32 softmax): the
        # backward runs in the weights' type (autograd casts each gradient to its input's type).
        q, k, v, out, grad_out = (t.to(weights.dtype) for t in (q, k, v, out, grad_out))
        grad_v = torch.bmm(weights.transpose(1, 2), grad_out * (1.0 / (1.0 - ctx.p)))
        # The softmax's gradient, w ∘ (g − Σ_j w_j g_j) with g = d(weights) (0 where dropped).
        # Σ_j w_j g_j is, per query, grad_out · out (an (m, f) product, not one over (m, n)); w
        # are the weights as the softmax gave them, restored where dropped and masked again after
        # (a second backward through a retained graph reads them as the first did).
        grad_logits = torch.bmm(grad_out * (1.0 / (1.0 - ctx.p)), v.transpose(1, 2))
        grad_logits.view(-1)[dropped] = 0.0
        rows = (grad_out * out).sum(dim=-1, keepdim=True)
        flat = weights.view(-1)
        flat[dropped] = kept_aside
        grad_logits.sub_(rows).mul_(weights)
        flat[dropped] = 0.0
        grad_q = torch.bmm(grad_logits, k).mul_(scale)
        grad_k = torch.bmm(grad_logits.transpose(1, 2), q)
        return grad_q, grad_k, grad_v, None, None, None


def softmax_dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, p: float, dropped: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(softmax(scale · q kᵀ), p) v``, the dropped weights drawn here (from torch's
    global generator, as ``nn.Dropout`` draws) unless ``dropped`` gives them."""
    if dropped is None:
        dropped = dropped_positions(torch.Size((q.shape[0], q.shape[1], k.shape[1])), p, device=q.device)
    return SoftmaxDropoutAttention.apply(q, k, v, scale, p, dropped)
