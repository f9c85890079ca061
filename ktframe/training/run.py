"""``train(cfg)``: one training run, from a resolved config to a run folder.

The run folder holds the resolved config, checkpoints (``last.ckpt`` and ``best.ckpt``, loadable
with ``weights_only=True``), the logger's files and ``summary.json``. Everything chosen before the
Trainer starts — the run id, hence the folder and the W&B id — comes from the config or from
``KTFRAME_RUN_ID``, which the first process sets and the processes Lightning's DDP launches
inherit, so every rank agrees.
"""

from __future__ import annotations

import json
import netrc
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig

from ktframe.errors import InputError
from ktframe.training.config import to_dict, to_yaml
from ktframe.training.data import TaskDataModule
from ktframe.training.module import KMeansTransformerModule

RUN_ID_ENV = "KTFRAME_RUN_ID"
LOGGERS = ("wandb", "csv", "tensorboard", "none")


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    summary: dict[str, Any]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _wandb_has_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def _run_folder(cfg: DictConfig) -> tuple[str, Path, Path | None]:
    """The run id, the run folder and the checkpoint to resume from (if any)."""
    root = Path(cfg.root)
    resume = cfg.resume
    if resume not in (None, "auto"):
        ckpt = Path(resume)
        if not ckpt.is_file():
            raise InputError(f"resume={resume}: no such checkpoint file; expected resume=auto or the path of a .ckpt file")
        run_id = torch.load(ckpt, map_location="cpu", weights_only=True)["hyper_parameters"]["config"]["run_id"]
        return run_id, ckpt.parent.parent, ckpt
    run_id = cfg.run_id or os.environ.get(RUN_ID_ENV)
    if resume == "auto" and run_id is None and cfg.name is None:
        runs = sorted((p for p in root.glob("*/checkpoints/last.ckpt")), key=lambda p: p.stat().st_mtime)
        if runs:
            last = runs[-1]
            return torch.load(last, map_location="cpu", weights_only=True)["hyper_parameters"]["config"]["run_id"], last.parent.parent, last
    run_id = run_id or new_run_id()
    run_dir = root / (cfg.name or run_id)
    last = run_dir / "checkpoints" / "last.ckpt"
    return run_id, run_dir, (last if resume == "auto" and last.is_file() else None)


def _logger(cfg: DictConfig, run_id: str, run_dir: Path):
    kind = cfg.logger.kind
    if kind == "none":
        return False
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(run_dir), name="csv", version="")
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="")
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        mode = cfg.logger.mode
        offline = mode == "offline" or (mode == "auto" and not _wandb_has_key())
        return WandbLogger(
            project=cfg.logger.project, entity=cfg.logger.entity, name=cfg.name or run_id, id=run_id,
            save_dir=str(run_dir), offline=offline, resume="allow",
        )
    raise InputError(f"logger.kind must be one of {', '.join(LOGGERS)}; got {kind!r}")


def _figures(module: KMeansTransformerModule, cfg: DictConfig, run_dir: Path, logger) -> None:
    """Pictures of the trained model on the first validation tasks, into ``run_dir/figures``."""
    from ktframe.training import figures
    from ktframe.training.data import draw

    X, C0, labels = draw(cfg.data, min(8, cfg.data.val_tasks), torch.Generator().manual_seed(cfg.data.val_seed))
    figures.save(figures.training_figures(module.model.cpu(), X, C0, labels), run_dir / "figures", logger or None)


def train(cfg: DictConfig) -> RunResult:
    run_id, run_dir, ckpt = _run_folder(cfg)
    os.environ[RUN_ID_ENV] = run_id
    cfg.run_id = run_id
    config = to_dict(cfg)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module = KMeansTransformerModule(config)
    data = TaskDataModule(cfg.data)
    data.resumes = 0 if ckpt is None else 1 + torch.load(ckpt, map_location="cpu", weights_only=True).get("global_step", 0)

    checkpoints = ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="best", monitor="val/ratio", mode="min",
        save_top_k=1, save_last=True, auto_insert_metric_name=False, enable_version_counter=False,
    )
    logger = _logger(cfg, run_id, run_dir)
    trainer = L.Trainer(
        max_steps=cfg.trainer.max_steps,
        val_check_interval=cfg.trainer.val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy,
        num_nodes=cfg.trainer.num_nodes,
        precision=cfg.trainer.precision,
        logger=logger,
        callbacks=[checkpoints],
        log_every_n_steps=cfg.trainer.log_every,
        default_root_dir=str(run_dir),
        enable_progress_bar=cfg.trainer.progress_bar,
        enable_model_summary=False,
    )
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        if logger and cfg.logger.kind == "wandb":
            logger.experiment.config.update(config, allow_val_change=True)
    trainer.fit(module, datamodule=data, ckpt_path=str(ckpt) if ckpt else None)

    summary = {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "best_checkpoint": checkpoints.best_model_path,
        "last_checkpoint": str(run_dir / "checkpoints" / "last.ckpt"),
        "best_val_ratio": float(checkpoints.best_model_score) if checkpoints.best_model_score is not None else None,
        "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
    }
    if trainer.is_global_zero:
        _figures(module, cfg, run_dir, logger)
        if logger and cfg.logger.kind == "wandb" and logger.experiment.settings.mode == "offline":
            summary["wandb_sync"] = f"wandb sync {logger.experiment.dir.rsplit('/files', 1)[0]}"
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(run_id, run_dir, summary)
