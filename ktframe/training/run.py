"""``train(cfg)``: one training run, from a resolved config to a run folder.

The run folder holds the resolved config, checkpoints (``last.ckpt`` and ``best.ckpt``, loadable
with ``weights_only=True``), the metrics' history (``csv/metrics.csv``), the logger's files and
``summary.json``. Which folder, which run id and which checkpoint to go on from are decided once,
the same on every rank (:mod:`ktframe.training.folders`). While it runs, PyTorch computes on the
fit's own number of threads and Lightning's informational lines are held back
(:mod:`ktframe.training.console`); both are put back when it returns.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from ktframe.core.errors import InputError
from ktframe.learning.checkpoint_io import AtomicCheckpointIO, check_dimensions, load_weights, model_weights, read_checkpoint
from ktframe.learning.config import to_dict, trainer_extras
from ktframe.learning.data import TaskDataModule
from ktframe.learning.module import KMeansTransformerModule
from ktframe.plugin.manager import registry
from ktframe.training import console
from ktframe.training.callbacks import SeedEachStep, StepProgressBar, ValidateLastStep
from ktframe.training.finish import finish
from ktframe.training.folders import CHECKPOINT_ENV, RUN_DIR_ENV, RUN_ID_ENV, checkpoint_bytes, make_run_folder, own_run_folder, resolve_run
from ktframe.training.launch import agree
from ktframe.training.loggers import history_logger, keep_csv_rows, make_logger, start_wandb
from ktframe.training.preemption import Preemption
from ktframe.training.relative import RunCheckpoint, relative, stored_config

# The config keys that fix the model's weights: a run cannot go on under other values of them.
WEIGHT_KEYS = ("model.variant", "data.d", "data.k", "model.n_layers", "model.embedding", "model.score", "model.attention_map", "model.norm", "model.options")


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    summary: dict[str, Any]


def train(cfg: DictConfig, *, quiet: bool = False) -> RunResult:
    """Train the run ``cfg`` describes. ``quiet``: no progress bar and none of ktframe's own lines
    on standard error (errors and warnings still)."""
    run_id, run_dir, ckpt = agree(lambda: resolve_run(cfg))
    launched = bool(os.environ.get(RUN_DIR_ENV))  # a rank that Lightning's DDP started: its parent made the folder
    # For the processes Lightning's DDP launches (they re-run this command): same id, same folder,
    # same checkpoint. Restored afterwards, so that another train() in this process starts afresh.
    saved = {name: os.environ.get(name) for name in (RUN_ID_ENV, RUN_DIR_ENV, CHECKPOINT_ENV)}
    os.environ.update({RUN_ID_ENV: run_id, RUN_DIR_ENV: str(run_dir), CHECKPOINT_ENV: str(ckpt or "")})
    count, why = console.thread_count(cfg)
    try:
        with console.threads(count), console.quiet_lightning():
            return _train(cfg, run_id, run_dir, ckpt, make_folder=not launched, quiet=quiet, threads=f"{count} thread{'s' * (count > 1)} ({why})")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _train(cfg: DictConfig, run_id: str, run_dir: Path, ckpt: Path | None, *, make_folder: bool, quiet: bool, threads: str) -> RunResult:
    started = time.monotonic()
    cfg.run_id = run_id
    config = stored_config(to_dict(cfg), run_dir)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module = KMeansTransformerModule(config)
    registry().get("initializer", cfg.data.init)  # what a user can get wrong is found before the run folder exists
    checkpoint = _starting_weights(cfg, module, ckpt)
    start_step = 0 if checkpoint is None else checkpoint.get("global_step", 0)
    data = _CombinedTasks(cfg.data, start_step=start_step)
    best, callbacks, preemption = _callbacks(cfg, run_dir)
    logger, history = make_logger(cfg, run_id, run_dir), history_logger(run_dir)
    owned = own_run_folder(run_dir, checkpoint_bytes(module), fresh=ckpt is None, resuming=cfg.resume == "auto")
    with owned if make_folder else contextlib.nullcontext():
        # After the lock: a refusal is then the one line on stderr, before Lightning's greeting.
        trainer = make_trainer(cfg, [logger, history], callbacks, run_dir, progress_bar=cfg.trainer.progress_bar and not quiet)
        try:
            if trainer.is_global_zero:
                make_run_folder(cfg, run_dir)
                what = f"{'resuming' if ckpt else 'training'} {cfg.model.variant} (preset {cfg.preset}) for {cfg.trainer.max_steps} steps on {threads}"
                console.say(f"run {run_id} in {run_dir}: {what}", quiet)
                logger = _start_logging(logger, history, cfg, config, run_id, run_dir, resumed_at=start_step if ckpt else None, quiet=quiet)
                trainer.loggers = [one for one in (logger, history) if one]  # W&B may have fallen back to offline: another logger
            with preemption:
                # weights_only here too: left unset, Lightning's load obeys TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
                trainer.fit(module, datamodule=data, ckpt_path=str(ckpt) if ckpt else None, weights_only=True)
                if checkpoint is not None and trainer.global_step == start_step and not preemption.signum:
                    _validate_unlogged(trainer, module, data)
        except OSError as exc:  # a log file on a full disk, say; the checkpoints have their own error
            raise InputError(
                f"{exc.filename or run_dir}: cannot write ({exc.strerror or exc}); expected free space and a writable run folder, then resume=auto to go on from the last checkpoint"
            ) from None
        summary = _summary(trainer, best, run_id, run_dir)
        summary["seconds"] = round(time.monotonic() - started, 1)
        if trainer.is_global_zero:
            try:
                finish(module, cfg, config, run_dir, logger, Path(best.best_model_path), summary)
            except (OSError, InputError) as exc:
                where = f"{exc.filename or run_dir}: cannot write ({exc.strerror or exc})" if isinstance(exc, OSError) else str(exc)
                raise InputError(
                    f"{where}; training finished and its checkpoints in {run_dir / 'checkpoints'} are intact: resume=auto finishes the run once that is fixed"
                ) from None
    return RunResult(run_id, run_dir, summary)


def _starting_weights(cfg: DictConfig, module: KMeansTransformerModule, ckpt: Path | None) -> dict | None:
    """The checkpoint the run goes on from (its weights checked against this config), or None; a
    new run with ``model.init_from`` starts from that checkpoint's weights instead."""
    if ckpt is not None:
        checkpoint = read_checkpoint(ckpt)
        _check_resumable(checkpoint, cfg, module, ckpt)
        return checkpoint
    if cfg.model.init_from is not None:
        start = read_checkpoint(cfg.model.init_from)
        load_weights(module.model, model_weights(start), cfg.model.init_from)
        check_dimensions(start, module.model, cfg.model.init_from, described_by="this run's config")
    return None


def _check_resumable(checkpoint: dict, cfg: DictConfig, module: KMeansTransformerModule, ckpt: Path) -> None:
    """The checkpoint's weights fit the model this config builds; if not, which keys differ."""
    trained = OmegaConf.create(checkpoint["hyper_parameters"]["config"])
    absent = object()  # a key newer than the checkpoint: the load below still checks the weights
    differ = [key for key in WEIGHT_KEYS if OmegaConf.select(trained, key, default=absent) not in (absent, OmegaConf.select(cfg, key))]
    if differ:
        was = " ".join(f"{key}={OmegaConf.select(trained, key)}" for key in differ)
        now = " ".join(f"{key}={OmegaConf.select(cfg, key)}" for key in differ)
        raise InputError(
            f"{ckpt}: cannot resume: the checkpoint was trained with {was}, this run has {now}; expected the same values (add {was}) or a new run name"
        )
    load_weights(module, checkpoint["state_dict"], ckpt)
    check_dimensions(checkpoint, module.model, ckpt)


def _callbacks(cfg: DictConfig, run_dir: Path) -> tuple[ModelCheckpoint, list, Preemption]:
    """The checkpoint that keeps the best validation, every callback of the fit, and the
    preemption handler among them."""
    # Two checkpoint callbacks: Lightning (2.6) writes a save_last checkpoint only when the
    # monitored one improved, and resuming needs the latest state after every validation.
    best = RunCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor="val/ratio",
        mode="min",
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    latest = RunCheckpoint(dirpath=run_dir / "checkpoints", filename="last", save_top_k=1, enable_version_counter=False)
    preemption = Preemption(run_dir / "checkpoints" / "last.ckpt", cfg.trainer.val_every)
    callbacks = [best, latest, ValidateLastStep(), SeedEachStep(cfg.trainer.seed), preemption]
    if cfg.trainer.early_stopping is not None:
        callbacks.append(EarlyStopping(monitor="val/ratio", mode="min", patience=cfg.trainer.early_stopping, check_on_train_epoch_end=False))
    return best, callbacks, preemption


def _start_logging(logger, history, cfg: DictConfig, config: dict, run_id: str, run_dir: Path, *, resumed_at: int | None, quiet: bool):
    """Rank 0's loggers, started: W&B online or, failing that, offline (said in one line); a
    resumed history keeps the rows logged up to its checkpoint; the config as hyperparameters."""
    if logger and cfg.logger.kind == "wandb":
        logger = start_wandb(logger, cfg, run_id, run_dir)
        run = logger.experiment
        offline = run.settings.mode in ("offline", "dryrun")  # "dryrun" in wandb's settings (0.31), "offline" in older versions
        console.say(f"W&B logs offline into {run.dir.rsplit('/files', 1)[0]} (the summary says how to upload it)" if offline else f"W&B run {run.url}", quiet)
    if resumed_at is not None:
        keep_csv_rows(history, before_step=resumed_at)  # before anything creates the CSV writer
    for one in (logger, history):
        if one:
            one.log_hyperparams(config)
    return logger


def _validate_unlogged(trainer: L.Trainer, module: KMeansTransformerModule, data: TaskDataModule) -> None:
    """A run resumed at its end (stopped after its last step, before its summary) trained and
    validated nothing: its final weights are validated again for the summary's metrics, and not
    logged again (the loggers hold that validation at its step already)."""
    loggers, trainer.loggers = trainer.loggers, []
    try:
        trainer.validate(module, datamodule=data, verbose=False)
    finally:
        trainer.loggers = loggers


def _summary(trainer: L.Trainer, best: ModelCheckpoint, run_id: str, run_dir: Path) -> dict[str, Any]:
    """The run's summary.json; its paths relative to the run folder, so that it holds no machine's."""
    return {
        "run_id": run_id,
        "run_dir": ".",
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,  # the CLI reports on rank 0 only
        "best_checkpoint": relative(best.best_model_path, run_dir) if best.best_model_path else None,
        "last_checkpoint": "checkpoints/last.ckpt",
        "best_val_ratio": float(best.best_model_score) if best.best_model_score is not None else None,
        "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
    }


class _CombinedTasks(TaskDataModule):
    """The run's task data, its loaders handed to Lightning combined as Lightning combines them
    itself, but without the FutureWarning that Lightning's combining (2.6) draws from PyTorch
    (2.10+: ``isinstance(treespec, LeafSpec)`` is deprecated) on the console of every fit."""

    def train_dataloader(self):
        return _combined(super().train_dataloader(), "max_size_cycle")

    def val_dataloader(self):
        return _combined(super().val_dataloader(), "sequential")


def _combined(loader, mode: str):
    from lightning.pytorch.utilities import CombinedLoader

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
        return CombinedLoader(loader, mode)


def make_trainer(cfg: DictConfig, logger, callbacks: list, run_dir: Path, *, progress_bar: bool | None = None) -> L.Trainer:
    """The Trainer of a run, writing and reading checkpoints through :class:`AtomicCheckpointIO`.
    ``trainer.KEY`` values other than ktframe's own are Lightning Trainer arguments, passed as given.
    ``logger``: one, a list, or False; ``progress_bar`` (default ``trainer.progress_bar``): the
    steps' bar (:class:`StepProgressBar`)."""
    progress_bar = cfg.trainer.progress_bar if progress_bar is None else progress_bar
    if isinstance(logger, list):
        logger = [one for one in logger if one] or False
    settings = dict(
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
        callbacks=[*callbacks, *([StepProgressBar()] if progress_bar else [])],
        plugins=[AtomicCheckpointIO()],
        log_every_n_steps=cfg.trainer.log_every,
        default_root_dir=str(run_dir),
        enable_progress_bar=progress_bar,
        enable_model_summary=False,
    )
    extras = trainer_extras(cfg)
    try:
        return L.Trainer(**{**settings, **extras})
    except (MisconfigurationException, ValueError, TypeError) as exc:  # Lightning's checks of these keys
        keys = [f"trainer.{k}" for k in ("accelerator", "devices", "strategy", "num_nodes", "precision", *extras)]
        raise InputError(f"invalid {'/'.join(keys)}: {str(exc).splitlines()[0]}; see docs/training.md") from None
