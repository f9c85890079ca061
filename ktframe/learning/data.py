"""Clustering tasks for training: drawn on the fly, different on every DDP rank, the tasks of each
step a pure function of (seed, rank, step); plus a fixed, seeded validation set, split across
ranks without padding."""

from __future__ import annotations

import dataclasses
import itertools

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset, get_worker_info

from ktframe.core import reference
from ktframe.core.tasks import TaskDistribution
from ktframe.learning.seeds import TASKS, step_seed
from ktframe.plugin.manager import registry


def distribution(cfg, family: str | None = None) -> TaskDistribution:
    """The tasks the data config ``cfg`` describes (its family, std and the switches of the general
    distribution). ``family``, where it is not the config's own ``data.family``, replaces the
    family of every task (``data.families`` included): an evaluation on another family."""
    tasks = TaskDistribution.of(cfg)
    return tasks if family is None or family == cfg.family else dataclasses.replace(tasks, family=family, families=None)


def draw(cfg, batch: int, generator: torch.Generator, *, n: int | None = None, k: int | None = None, family: str | None = None, init: str | None = None):
    """``(X, C0, labels)`` for ``batch`` tasks of the data config ``cfg``."""
    k = k or cfg.k
    X, labels = distribution(cfg, family).draw(batch, n or cfg.n, cfg.d, k, generator=generator)
    C0 = registry().get("initializer", init or cfg.init)(X, k, generator)
    return X, C0, labels


def _pick(span, generator: torch.Generator) -> int | None:
    """A number drawn uniformly from ``span = [lo, hi]``, or None where there is no span."""
    return None if span is None else int(torch.randint(span[0], span[1] + 1, (), generator=generator))


def draw_step(cfg, generator: torch.Generator):
    """One training step's batch: its k and n drawn first from ``data.k_range`` / ``data.n_range``
    where they are set (one k and one n for all the tasks of a step, so that a batch is one
    tensor), then its tasks. Without ranges the generator draws exactly what :func:`draw` does.
    With ``data.warm_start``, the initial centers are then moved by a number of Lloyd steps drawn
    from its range: a model iterated twenty times spends most steps near a fixed point, which
    one step from the initial centers alone never shows it."""
    k, n = _pick(cfg.k_range, generator), _pick(cfg.n_range, generator)
    X, C0, labels = draw(cfg, cfg.batch_size, generator, n=n, k=k)
    warm = _pick(cfg.warm_start, generator)
    return (X, reference.lloyd(X, C0, warm).centers, labels) if warm else (X, C0, labels)


class TaskStream(IterableDataset):
    """An endless stream of batches of tasks from ``start_step`` on. The batch of step s is drawn
    from a generator seeded with (seed, rank, s) alone, so no two ranks repeat each other, a resumed
    run draws what the uninterrupted run drew, and the number of workers changes nothing."""

    def __init__(self, cfg, rank: int = 0, start_step: int = 0) -> None:
        self.cfg, self.rank, self.start_step = cfg, rank, start_step

    def __iter__(self):
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        # The DataLoader takes one batch from each worker in turn: worker w makes steps w, w + workers, ...
        for step in itertools.count(self.start_step + worker_id, workers):
            yield draw_step(self.cfg, torch.Generator().manual_seed(step_seed(self.cfg.seed, self.rank, step, TASKS)))


class UnpaddedShards(DistributedSampler):
    """Rank r of w gets tasks r, r + w, r + 2w, ...: every task once, on one rank. (torch's
    DistributedSampler pads the shares to equal length with repeated tasks, which the summed
    metric states would count twice.) A subclass of it, so that Lightning keeps it as it is."""

    def __init__(self, dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.indices = list(range(rank, len(dataset), num_replicas))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class TaskDataModule(L.LightningDataModule):
    def __init__(self, cfg, start_step: int = 0) -> None:
        super().__init__()
        self.cfg, self.start_step = cfg, start_step

    def setup(self, stage: str | None = None) -> None:
        generator = torch.Generator().manual_seed(self.cfg.val_seed)
        self.val = TensorDataset(*draw(self.cfg, self.cfg.val_tasks, generator))

    def train_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        stream = TaskStream(self.cfg, rank=rank, start_step=self.start_step)
        return DataLoader(stream, batch_size=None, num_workers=self.cfg.num_workers, persistent_workers=self.cfg.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        shards = UnpaddedShards(self.val, num_replicas=world, rank=rank)
        return DataLoader(self.val, batch_size=self.cfg.val_batch_size, sampler=shards)
