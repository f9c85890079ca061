"""What rank 0 writes once training has ended: the figures, the evaluation asked for, the W&B
model and, last, ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from ktframe.core.io import write_atomically
from ktframe.evaluation.evaluate import evaluate_checkpoint, table_rows
from ktframe.learning.data import draw
from ktframe.learning.module import KMeansTransformerModule
from ktframe.training.loggers import log_model


def finish(module: KMeansTransformerModule, cfg: DictConfig, config: dict, run_dir: Path, logger, best: Path, summary: dict[str, Any]) -> None:
    """What rank 0 writes once training ended: the figures, the evaluation if asked for, the W&B
    model, and last ``summary.json``, whose presence says the run is complete."""
    wandb_run = logger.experiment if logger and cfg.logger.kind == "wandb" else None
    draw_figures(module, cfg, run_dir, logger)
    if cfg.eval.after_fit:
        summary["eval"] = evaluate_after_fit(run_dir, logger, config["eval"]).relative_to(run_dir).as_posix()
    if wandb_run is not None:
        if cfg.logger.log_model:
            log_model(wandb_run, best, summary)
        # wandb records offline mode as "dryrun" in its settings (0.31), as "offline" in older versions
        if wandb_run.settings.mode in ("offline", "dryrun"):
            summary["wandb_sync"] = f"wandb sync {wandb_run.dir.rsplit('/files', 1)[0]}"
    write_atomically(run_dir / "summary.json", [json.dumps(summary, indent=2)])


def draw_figures(module: KMeansTransformerModule, cfg: DictConfig, run_dir: Path, logger) -> None:
    """Pictures of the trained model on the first validation tasks, into ``run_dir/figures``."""
    from ktframe.reporting import figures  # matplotlib: imported once there is a picture to draw

    X, C0, labels = draw(cfg.data, min(8, cfg.data.val_tasks), torch.Generator().manual_seed(cfg.data.val_seed))
    figures.save(figures.training_figures(module.model.cpu(), X, C0, labels), run_dir / "figures", logger or None)


def evaluate_after_fit(run_dir: Path, logger, settings: dict[str, Any]) -> Path:
    """The paper's evaluation of the run's best (or, with eval.checkpoint=last, last) checkpoint,
    as ``ktframe eval RUN`` runs it, into the run's ``eval/``, under this run's eval ``settings``: a
    resumed run's may differ from those its checkpoint was saved with. Its table and picture go to
    the logger too when it takes them."""
    out = run_dir / "eval"
    report, picture = evaluate_checkpoint(run_dir, [f"eval.{key}={json.dumps(value)}" for key, value in settings.items()], out=out)
    if logger is not None and hasattr(logger, "log_table"):
        columns, rows = table_rows(report)
        logger.log_table(key="eval/log_objective", columns=columns, data=rows)
        logger.log_image(key="eval/objective", images=[str(picture)])
    return out / "eval.json"
