"""The loggers of a fit: its metrics' history in ``csv/metrics.csv``, which every run keeps (what
``ktframe report`` draws training curves from), and the logger of ``logger.kind`` beside it:
TensorBoard or W&B (offline without an API key, and offline again when W&B cannot start online),
with the W&B model artifact of the best checkpoint."""

from __future__ import annotations

import csv
import importlib.util
import netrc
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ktframe.core.errors import InputError

# The package each logger needs, and what to install when it is absent.
_LOGGER_PACKAGES = {"wandb": ("wandb", "pip install wandb"), "tensorboard": ("tensorboard", "pip install 'ktframe[tensorboard]'")}


def wandb_has_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def make_logger(cfg: DictConfig, run_id: str, run_dir: Path):
    kind = cfg.logger.kind
    if kind in _LOGGER_PACKAGES:
        package, install = _LOGGER_PACKAGES[kind]
        if importlib.util.find_spec(package) is None:
            raise InputError(f"logger.kind={kind} needs the {package} package, which is not installed; expected `{install}`, or logger.kind=csv or none")
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="")
    if kind == "wandb":
        mode = cfg.logger.mode
        if mode == "online" and not wandb_has_key():  # W&B would ask for a key, or fail deep inside
            raise InputError(
                "logger.mode=online needs a W&B API key (WANDB_API_KEY or `wandb login`) and none is set; expected logger.mode=auto or offline to log offline and sync later"
            )
        return wandb_logger(cfg, run_id, run_dir, offline=mode == "offline" or (mode == "auto" and not wandb_has_key()))
    return False  # csv or none: the history alone; the config's values were checked when it was loaded


def history_logger(run_dir: Path):
    """The CSV logger of the metrics' history, ``RUN/csv/metrics.csv``. Rows reach the disk as they
    are logged, so that a killed run keeps those up to its last checkpoint and a resumed one goes
    on from them (:func:`keep_csv_rows`)."""
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(save_dir=str(run_dir), name="csv", version="", flush_logs_every_n_steps=1)


def wandb_logger(cfg: DictConfig, run_id: str, run_dir: Path, *, offline: bool):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        name=cfg.name or run_id,
        id=run_id,
        save_dir=str(run_dir),
        offline=offline,
        resume="allow",
        group=cfg.logger.group,
        tags=list(cfg.logger.tags) or None,
        job_type=cfg.logger.job_type,
        notes=cfg.logger.notes,
        # silent: W&B's own console lines (its version, the run's folder, the history, how to sync)
        # are replaced by ktframe's: where the run logs as it starts, how to upload it in the summary.
        settings=wandb.Settings(init_timeout=cfg.logger.init_timeout, silent=True),
    )
    # Lightning (2.6) passes anonymous=None to wandb.init, which W&B (0.19+) answers with a
    # deprecation warning whatever its value: the argument is left out.
    getattr(logger, "_wandb_init", {}).pop("anonymous", None)
    return logger


def start_wandb(logger, cfg: DictConfig, run_id: str, run_dir: Path):
    """The W&B run started now, on rank 0. Online with no network, W&B gives up after
    ``logger.init_timeout`` seconds (plus its own ~10 s for the resume request); the run then logs
    offline, to be synced later, rather than fail a job that can train."""
    import wandb

    try:
        logger.experiment  # noqa: B018 - starts the run
        return logger
    except wandb.errors.Error as exc:
        wandb.teardown()  # the failed run still holds its id in W&B's service
        reason = next(iter(str(exc).splitlines()), type(exc).__name__)
        print(f"ktframe fit: warning: W&B could not start online ({reason}); logging offline instead", file=sys.stderr)
        return wandb_logger(cfg, run_id, run_dir, offline=True)


def keep_csv_rows(logger, before_step: int) -> None:
    """A resumed run keeps the rows its earlier part logged up to the checkpoint, and appends to
    them. Lightning's CSV writer, started on a folder that holds files, deletes its metrics.csv and
    warns on the console that it will; the rows are read first and the folder's two files removed
    before the writer starts (hparams.yaml is written again with the run's config), so that it
    starts on an empty folder, as a new run's does."""
    folder = Path(logger.log_dir)
    path = folder / "metrics.csv"
    rows = []
    if path.is_file():
        with path.open(newline="") as file:
            rows = [row for row in csv.DictReader(file) if row.get("step", "").isdigit() and int(row["step"]) < before_step]
    for name in ("metrics.csv", "hparams.yaml"):
        (folder / name).unlink(missing_ok=True)
    writer = logger.experiment  # created now
    writer.metrics[:0] = rows
    writer.save()


def log_model(wandb_run, best: Path, summary: dict[str, Any]) -> None:
    """The best checkpoint as a W&B model artifact, with the figures that chose it."""
    import wandb

    metadata = {"best_val_ratio": summary["best_val_ratio"], "global_step": summary["global_step"], "run_id": summary["run_id"]}
    artifact = wandb.Artifact(name=f"model-{summary['run_id']}", type="model", metadata=metadata)
    artifact.add_file(str(best), name="best.ckpt")
    wandb_run.log_artifact(artifact, aliases=["best", "latest"])
