"""Token norms: ``factory(width) -> nn.Module`` applied to every token before attention."""

from __future__ import annotations

from torch import nn

from ktframe.hookspecs import Register, hookimpl


@hookimpl
def ktframe_register_norms(register: Register) -> None:
    register("identity", lambda width: nn.Identity())
    register("rmsnorm", lambda width: nn.RMSNorm(width))
    register("layernorm", lambda width: nn.LayerNorm(width))
