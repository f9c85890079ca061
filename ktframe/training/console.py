"""What a fit does to its process beyond training: how many threads PyTorch computes on, and what
reaches the console (ktframe's own lines, the progress bar and the final summary; not Lightning's
greetings and tips).

Both are the fit's own and last only as long as :func:`ktframe.training.run.train` runs: the thread
count and the loggers' levels are put back when it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

import torch
from omegaconf import DictConfig

# A training step's work, in multiply-adds of the point self-attention (batch_size · n² · width),
# from which PyTorch's own thread count pays; below it a step runs on one thread. The quick
# preset's steps (16 · 128² · 13, 3.4 million) take several times longer on two threads than on
# one on a busy 2-core machine, and no less on an idle one (benchmarks/first_hour.py).
THREADED_WORK = 1 << 26
_THIRD_PARTY_LOGGERS = ("lightning.pytorch", "lightning.fabric")
# What the user asked Lightning for is still shown: a profiler's report (trainer.profiler=simple).
_ASKED_FOR_LOGGERS = ("lightning.pytorch.profilers",)


def step_work(cfg: DictConfig) -> int:
    """Multiply-adds of a training step's point self-attention at its largest n and k."""
    data = cfg.data
    n = data.n_range[1] if data.n_range is not None else data.n
    k = data.k_range[1] if data.k_range is not None else data.k
    width = data.d + (k if cfg.model.embedding == "onehot" else 0)
    return data.batch_size * n * n * width * cfg.model.unroll


def thread_count(cfg: DictConfig) -> tuple[int, str]:
    """The intra-op threads of a fit and why: ``trainer.threads`` if given; PyTorch's own where
    ``OMP_NUM_THREADS`` says so (a multirun's ``--jobs`` set it too); else one for a step of less
    than :data:`THREADED_WORK` and PyTorch's count (``torch.set_num_threads``, the cores) otherwise."""
    if cfg.trainer.threads is not None:
        return cfg.trainer.threads, "trainer.threads"
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    if step_work(cfg) < THREADED_WORK:
        return 1, "a small model: trainer.threads=N to change"
    return torch.get_num_threads(), "PyTorch's count"


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    """PyTorch computes on ``count`` threads inside; its count before is put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's informational lines (the devices found, its tips, why the fit stopped) held back
    inside; its warnings, and a profiler's report the user asked for, still shown."""
    held = [(logging.getLogger(name), logging.WARNING) for name in _THIRD_PARTY_LOGGERS]
    shown = [(logging.getLogger(name), logging.INFO) for name in _ASKED_FOR_LOGGERS]
    loggers = [logger for logger, _ in held + shown]
    levels = [logger.level for logger in loggers]
    for logger, level in held + shown:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def say(message: str, quiet: bool) -> None:
    """One of ktframe's own lines of a fit, on standard error."""
    if not quiet:
        print(f"ktframe fit: {message}", file=sys.stderr, flush=True)
