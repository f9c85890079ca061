"""Token norms: ``factory(width) -> nn.Module`` applied to every token before attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ktframe.hooks.hookspecs import Register, hookimpl


class SphereNorm(nn.Module):
    """Token-wise normalisation of the first ``d`` coordinates (the data part) to unit length,
    the rest of the token untouched: RMSNorm without its gain, divided by √d. A zero data part
    stays zero. ``d=None`` normalises the whole token."""

    def __init__(self, width: int, d: int | None = None) -> None:
        super().__init__()
        self.width = width
        self.d = width if d is None else d

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        data = F.normalize(tokens[..., : self.d], dim=-1)
        return data if self.d == tokens.shape[-1] else torch.cat([data, tokens[..., self.d :]], dim=-1)

    def extra_repr(self) -> str:
        return f"width={self.width}, d={self.d}"


@hookimpl
def ktframe_register_norms(register: Register) -> None:
    register("identity", lambda width: nn.Identity())
    register("rmsnorm", lambda width: nn.RMSNorm(width))
    register("layernorm", lambda width: nn.LayerNorm(width))
    register("sphere", SphereNorm)
