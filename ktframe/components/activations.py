"""Activations for the feed-forward blocks: ``factory() -> nn.Module``."""

from __future__ import annotations

import torch
from torch import nn

from ktframe.hooks.hookspecs import Register, hookimpl


class ReQU(nn.Module):
    """Rectified quadratic unit ``max(0, z)²``: with ``[I; −I]`` before it, it sums to ``‖z‖²``."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.relu(z).square()


@hookimpl
def ktframe_register_activations(register: Register) -> None:
    register("relu", nn.ReLU)
    register("requ", ReQU)
