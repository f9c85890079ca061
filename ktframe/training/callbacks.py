"""Callbacks of every training run."""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from ktframe.learning.seeds import seed_step


class ValidateLastStep(L.Callback):
    """Validate (and so checkpoint) at ``max_steps`` whatever the validation interval.

    Lightning validates every ``val_check_interval`` steps only, so a run whose last steps fall
    between two validations would end with them unscored and unsaved. Asking the loop to stop at
    the last step makes it validate there, as it does for early stopping; a last step that falls on
    the interval is validated once.
    """

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class SeedEachStep(L.Callback):
    """Seed the global generators (dropout's among them) for each training step from (seed, rank,
    step), so that a resumed run draws the same masks as the uninterrupted one."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(self, trainer: L.Trainer, module, batch, batch_idx: int) -> None:
        seed_step(self.seed, trainer.global_rank, trainer.global_step)


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar counting the run's steps up to ``trainer.max_steps`` (the tasks are an
    endless stream: an epoch never ends), on standard error as ktframe's other bars are, drawn
    only on a terminal. Validation draws no bar of its own: the step bar shows its ratio."""

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(desc="fit", unit="step", disable=True if self.is_disabled else None, leave=True, dynamic_ncols=True, file=sys.stderr, smoothing=0)

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        self.train_progress_bar.reset(total=trainer.max_steps)
        self.train_progress_bar.update(trainer.global_step)  # a resumed run goes on from its step

    def on_train_batch_end(self, trainer: L.Trainer, module, outputs, batch, batch_idx: int) -> None:
        if self._should_update(trainer.global_step, self.train_progress_bar.total):
            self.train_progress_bar.update(trainer.global_step - self.train_progress_bar.n)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))

    def get_metrics(self, trainer: L.Trainer, module) -> dict:
        metrics = super().get_metrics(trainer, module)
        metrics.pop("v_num", None)  # the logger's version: the run id, printed already
        return metrics
