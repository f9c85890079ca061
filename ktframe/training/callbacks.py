"""Callbacks of every training run."""

from __future__ import annotations

import lightning as L

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
