"""Random streams derived from numbers: an experiment's seed and the coordinates of one of its parts
(a cell, a sample, a purpose) give that part a generator of its own, so that a part draws the same
whatever else runs, in whatever order."""

from __future__ import annotations

import numpy as np
import torch


def derived_generator(*numbers: int) -> torch.Generator:
    """A CPU generator seeded from ``numbers`` (non-negative integers) mixed by numpy's
    SeedSequence, so that neighbouring numbers give unrelated streams."""
    state = np.random.SeedSequence(list(numbers)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) >> 1)
