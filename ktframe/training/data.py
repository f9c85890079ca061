"""Clustering tasks for training: drawn on the fly, different on every DDP rank and dataloader
worker, plus a fixed, seeded validation set."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

from ktframe.clustering.tasks import mixture
from ktframe.plugin.manager import registry


def draw(cfg, batch: int, generator: torch.Generator, *, n: int | None = None, family: str | None = None, init: str | None = None):
    """``(X, C0, labels)`` for ``batch`` tasks of the data config ``cfg``."""
    X, labels = mixture(batch, n or cfg.n, cfg.d, cfg.k, family=family or cfg.family, std=cfg.std, generator=generator)
    C0 = registry().get("initializer", init or cfg.init)(X, cfg.k, generator)
    return X, C0, labels


class TaskStream(IterableDataset):
    """An endless stream of batches of tasks. The seed mixes the base seed, the DDP rank, the
    worker id and the step the stream starts at, so no two producers repeat each other and a
    resumed run does not replay the tasks it has already seen."""

    def __init__(self, cfg, rank: int = 0, start_step: int = 0) -> None:
        self.cfg, self.rank, self.start_step = cfg, rank, start_step

    def __iter__(self):
        worker = get_worker_info()
        worker_id = worker.id if worker is not None else 0
        generator = torch.Generator().manual_seed(hash((self.cfg.seed, self.rank, worker_id, self.start_step)) & 0x7FFF_FFFF_FFFF)
        while True:
            yield draw(self.cfg, self.cfg.batch_size, generator)


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
        # Lightning adds a DistributedSampler under DDP, so each rank validates its share.
        return DataLoader(self.val, batch_size=self.cfg.val_batch_size, shuffle=False)
