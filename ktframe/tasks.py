"""Synthetic clustering tasks: Gaussian mixtures as in the paper's experiments."""

from __future__ import annotations

import torch


def minmax_scale(X: torch.Tensor) -> torch.Tensor:
    """Per task and per dimension, to [0, 1] (a constant dimension becomes 0)."""
    low = X.amin(dim=1, keepdim=True)
    span = X.amax(dim=1, keepdim=True) - low
    return (X - low) / torch.where(span > 0, span, torch.ones_like(span))


def gaussian_mixture(
    batch: int,
    n: int,
    d: int,
    k: int,
    *,
    std: float = 0.1,
    sizes: str = "multinomial",
    scale: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` tasks of ``n`` points from ``k`` isotropic Gaussians with means ~ U[0, 1]^d.

    ``sizes="equal"`` gives every component n // k points (the remainder to the first ones);
    ``"multinomial"`` draws the sizes with equal weights. Returns points ``(batch, n, d)``, min-max
    scaled per dimension when ``scale``, and true labels ``(batch, n)``.
    """
    means = torch.rand(batch, k, d, generator=generator, dtype=dtype)
    if sizes == "equal":
        labels = (torch.arange(n) % k).sort().values.expand(batch, n)
    elif sizes == "multinomial":
        labels = torch.randint(k, (batch, n), generator=generator)
    else:
        raise ValueError(f"sizes must be 'equal' or 'multinomial'; got {sizes!r}")
    noise = torch.randn(batch, n, d, generator=generator, dtype=dtype) * std
    X = torch.gather(means, 1, labels.unsqueeze(-1).expand(-1, -1, d)) + noise
    return (minmax_scale(X) if scale else X), labels
