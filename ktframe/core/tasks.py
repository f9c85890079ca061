"""Synthetic clustering tasks: mixtures as in the paper's experiments.

Component means are uniform in [0, 1]^d; each point is its component's mean plus noise of scale
``std`` from one of the families below; then every task is min-max scaled per dimension to
[0, 1]. The heavy-tailed and skewed families are for out-of-distribution tests.
"""

from __future__ import annotations

import math

import torch

FAMILIES = ("gaussian", "cauchy", "gumbel", "laplace", "lognormal")


def minmax_scale(X: torch.Tensor) -> torch.Tensor:
    """Per task and per dimension, to [0, 1] (a constant dimension becomes 0)."""
    low = X.amin(dim=1, keepdim=True)
    span = X.amax(dim=1, keepdim=True) - low
    return (X - low) / torch.where(span > 0, span, torch.ones_like(span))


def _noise(family: str, shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """Unit-scale noise, location 0 (the log-normal is shifted so that its median is 0)."""
    if family == "gaussian":
        return torch.randn(shape, generator=generator, dtype=dtype)
    if family == "lognormal":
        return torch.randn(shape, generator=generator, dtype=dtype).exp() - 1.0
    # Inverse CDFs of the others, from uniforms kept away from 0 and 1.
    tiny = torch.finfo(dtype).eps
    u = torch.rand(shape, generator=generator, dtype=dtype).clamp(tiny, 1 - tiny)
    if family == "cauchy":
        return torch.tan(math.pi * (u - 0.5))
    if family == "gumbel":
        return -torch.log(-torch.log(u))
    if family == "laplace":
        centered = u - 0.5
        return -torch.sign(centered) * torch.log1p(-2 * centered.abs())
    raise ValueError(f"unknown family {family!r}; expected one of: {', '.join(FAMILIES)}")


def mixture(
    batch: int,
    n: int,
    d: int,
    k: int,
    *,
    family: str = "gaussian",
    std: float = 0.1,
    sizes: str = "multinomial",
    scale: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` tasks of ``n`` points from ``k`` components. ``sizes="equal"`` gives every
    component n // k points (the remainder to the first ones); ``"multinomial"`` draws them with
    equal weights. Returns points ``(batch, n, d)`` and the true labels ``(batch, n)``."""
    means = torch.rand(batch, k, d, generator=generator, dtype=dtype)
    if sizes == "equal":
        labels = (torch.arange(n) % k).sort().values.expand(batch, n)
    elif sizes == "multinomial":
        labels = torch.randint(k, (batch, n), generator=generator)
    else:
        raise ValueError(f"sizes must be 'equal' or 'multinomial'; got {sizes!r}")
    X = torch.gather(means, 1, labels.unsqueeze(-1).expand(-1, -1, d)) + std * _noise(family, (batch, n, d), generator, dtype)
    return (minmax_scale(X) if scale else X), labels
