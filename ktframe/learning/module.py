"""The LightningModule: a k-means transformer, its loss, optimiser and metrics."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchmetrics import MetricCollection

from ktframe.core.loss import softmin_bound
from ktframe.learning.checkpoint_io import DIMENSIONS
from ktframe.learning.metrics import AdjustedRand, KMeansObjective, MeanLogObjective, NormalizedMutualInfo, RatioToLloyd
from ktframe.plugin.build import model_from_config

__all__ = ["KMeansTransformerModule", "model_from_config"]


class KMeansTransformerModule(L.LightningModule):
    """Trains ``model.unroll`` steps of the model (re-embedding in between) against the softmin
    bound; validates on fixed tasks with the k-means objective, its mean log, the ratio to one
    Lloyd step (which drives the learning-rate schedule) and ARI / NMI against the true labels."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        # Plain containers, so that weights_only loading works. The run logs the config itself, once,
        # as flat sections (data.n, optim.lr, ...) rather than nested under "config".
        self.save_hyperparameters({"config": config}, logger=False)
        self.config = config
        self.model = model_from_config(config)
        self.val_metrics = MetricCollection(
            {
                "objective": KMeansObjective(),
                "log_objective": MeanLogObjective(),
                "ratio": RatioToLloyd(),
                "ari": AdjustedRand(),
                "nmi": NormalizedMutualInfo(),
            },
            prefix="val/",
        )

    def forward(self, X: torch.Tensor, C0: torch.Tensor, n_steps: int | None = None):
        steps = n_steps or self.config["model"]["unroll"]
        return self.model(X, C0, n_steps=steps, reembed=True)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        X, C0, _ = batch
        loss = softmin_bound(X, self(X, C0).centers, self.config["optim"]["loss_lambda"])
        self.log("train/loss", loss, prog_bar=True, batch_size=X.shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=X.shape[0])  # the plateau schedule moves it
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        X, C0, labels = batch
        C = self(X, C0).centers
        self.val_metrics["objective"].update(X, C)
        self.val_metrics["log_objective"].update(X, C)
        self.val_metrics["ratio"].update(X, C, C0)
        self.val_metrics["ari"].update(X, C, labels)
        self.val_metrics["nmi"].update(X, C, labels)

    def on_validation_epoch_end(self) -> None:
        values = {name: value.float() for name, value in self.val_metrics.compute().items()}
        self.log("val/ratio", values.pop("val/ratio"), prog_bar=True)
        self.log_dict(values)
        self.val_metrics.reset()

    # Resumed from a checkpoint written at a validation (as last.ckpt always is), Lightning does not
    # rerun that validation but steps the plateau scheduler on val/ratio at once, and fails: nothing
    # in the new process has logged it yet. The checkpoint's scheduler state predates that step, so
    # the checkpoint carries the value and a resumed run hands it back, as an unbroken run would.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[DIMENSIONS] = {"d": self.model.d, "k": self.model.k}
        ratio = self.trainer.callback_metrics.get("val/ratio")
        if ratio is not None:
            checkpoint["val_ratio"] = float(ratio)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_val_ratio = checkpoint.get("val_ratio")

    def on_train_start(self) -> None:
        ratio = getattr(self, "_resumed_val_ratio", None)
        if ratio is not None and "val/ratio" not in self.trainer.callback_metrics:
            self.trainer.callback_metrics["val/ratio"] = torch.tensor(ratio)

    def configure_optimizers(self):
        optim = self.config["optim"]
        optimizer = torch.optim.Adam(self.parameters(), lr=optim["lr"])
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=optim["plateau_factor"], patience=optim["plateau_patience"])
        # Stepped after every validation (every `val_every` steps) on the validation ratio.
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/ratio", "interval": "step", "frequency": self.config["trainer"]["val_every"]},
        }
