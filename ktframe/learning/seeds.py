"""Seeds that are pure functions of the run's seed, the rank and the training step.

Every random number a training step draws (its tasks, its dropout masks, anything a component takes
from numpy's or Python's global generator) comes from generators seeded for that step alone. The
checkpoint holds the seed (in the config) and the step, so a run resumed at step s draws exactly
what the uninterrupted run drew from step s on, on every rank and dataloader worker, whatever ran
in between (validation, a dataloader started afresh, a process that imported something else).
"""

from __future__ import annotations

import random

import numpy as np
import torch

# What a seed is for, so that the tasks and the dropout of one step are independent streams.
TASKS, GLOBAL = 0, 1


def step_seed(seed: int, rank: int, step: int, purpose: int) -> int:
    """A 63-bit seed for ``purpose`` at ``step`` on ``rank``. numpy's SeedSequence mixes the four
    numbers, so that neighbouring steps or ranks do not give related streams."""
    words = np.random.SeedSequence([seed % 2**64, rank, step, purpose]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def seed_step(seed: int, rank: int, step: int) -> None:
    """Seed torch's, numpy's and Python's global generators for training step ``step`` on ``rank``."""
    value = step_seed(seed, rank, step, GLOBAL)
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
