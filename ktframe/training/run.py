"""``train(cfg)``: one training run, from a resolved config to a run folder.

The run folder holds the resolved config, checkpoints (``last.ckpt`` and ``best.ckpt``, loadable
with ``weights_only=True``), the logger's files and ``summary.json``. Everything chosen before the
Trainer starts — the run id, hence the folder and the W&B id — comes from the config or from
``KTFRAME_RUN_ID``, which the first process sets and the processes Lightning's DDP launches
inherit; ranks that ``torchrun`` or ``srun`` started take rank 0's choice (``launch.agree``). So
every rank agrees.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import netrc
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from ktframe.core.errors import InputError
from ktframe.core.io import check_writable_folder, nearest_existing, write_atomically
from ktframe.evaluation.evaluate import evaluate_checkpoint, table_rows
from ktframe.learning.checkpoint_io import AtomicCheckpointIO, check_dimensions, load_weights, model_weights, read_checkpoint
from ktframe.learning.config import check_path_component, to_dict, to_yaml, trainer_extras
from ktframe.learning.data import TaskDataModule, draw
from ktframe.learning.module import KMeansTransformerModule
from ktframe.plugin.manager import registry
from ktframe.training.callbacks import SeedEachStep, ValidateLastStep
from ktframe.training.folders import FolderLock, check_unused
from ktframe.training.launch import agree
from ktframe.training.preemption import Preemption

RUN_ID_ENV = "KTFRAME_RUN_ID"
RUN_DIR_ENV = "KTFRAME_RUN_DIR"  # set by train() for the processes DDP launches, then removed
CHECKPOINT_ENV = "KTFRAME_RESUME_FROM"
WANDB_AGENT_RUN_ID_ENV = "WANDB_RUN_ID"  # set by `wandb agent` for each run it starts
# The config keys that fix the model's weights: a run cannot go on under other values of them.
WEIGHT_KEYS = ("model.variant", "data.d", "data.k", "model.n_layers", "model.embedding", "model.score", "model.attention_map", "model.norm", "model.options")


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


def _checkpoint_run_id(ckpt: Path) -> str:
    return read_checkpoint(ckpt)["hyper_parameters"]["config"]["run_id"]


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


def _run_folder(cfg: DictConfig) -> tuple[str, Path, Path | None]:
    """The run id, the run folder and the checkpoint to resume from (if any). A process that
    Lightning's DDP launched takes all three from the environment its parent set, so that no rank
    can pick another folder or checkpoint."""
    if os.environ.get(RUN_DIR_ENV):
        ckpt = os.environ.get(CHECKPOINT_ENV)
        return os.environ[RUN_ID_ENV], Path(os.environ[RUN_DIR_ENV]), Path(ckpt) if ckpt else None
    root = Path(cfg.root)
    if cfg.resume not in (None, "auto"):
        ckpt = Path(cfg.resume)
        if not ckpt.is_file():
            raise InputError(f"resume={cfg.resume}: no such checkpoint file; expected resume=auto or the path of a .ckpt file")
        return _checkpoint_run_id(ckpt), ckpt.parent.parent, ckpt
    if cfg.resume == "auto":
        # The named run goes on under its own id (so its W&B run too); unnamed, the latest run.
        named = cfg.name or cfg.run_id
        candidates = (
            [root / named / "checkpoints" / "last.ckpt"] if named else sorted(root.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)[-1:]
        )
        for last in candidates:
            if last.is_file():
                return _checkpoint_run_id(last), last.parent.parent, last
    # Under `wandb agent` the run id is the one W&B assigned, so that the folder and the W&B run agree.
    run_id = cfg.run_id or _environment_id(RUN_ID_ENV) or _environment_id(WANDB_AGENT_RUN_ID_ENV) or new_run_id()
    run_dir = root / (cfg.name or run_id)
    check_unused(run_dir, sweep=False, resuming=cfg.resume == "auto")
    return run_id, run_dir, None


def _environment_id(variable: str) -> str | None:
    """A run id from the environment, checked as the config's run_id is: it names a folder."""
    value = os.environ.get(variable) or None
    check_path_component(f"the run id in the environment variable {variable}", value)
    return value


# The package each logger needs, and what to install when it is absent.
_LOGGER_PACKAGES = {"wandb": ("wandb", "pip install wandb"), "tensorboard": ("tensorboard", "pip install 'ktframe[tensorboard]'")}


def _logger(cfg: DictConfig, run_id: str, run_dir: Path):
    kind = cfg.logger.kind
    if kind in _LOGGER_PACKAGES:
        package, install = _LOGGER_PACKAGES[kind]
        if importlib.util.find_spec(package) is None:
            raise InputError(f"logger.kind={kind} needs the {package} package, which is not installed; expected `{install}`, or logger.kind=csv or none")
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        # Rows reach the disk as they are logged, so that a killed run keeps those up to its last
        # checkpoint and a resumed one goes on from them.
        return CSVLogger(save_dir=str(run_dir), name="csv", version="", flush_logs_every_n_steps=1)
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="")
    if kind == "wandb":
        mode = cfg.logger.mode
        if mode == "online" and not _wandb_has_key():  # W&B would ask for a key, or fail deep inside
            raise InputError(
                "logger.mode=online needs a W&B API key (WANDB_API_KEY or `wandb login`) and none is set; expected logger.mode=auto or offline to log offline and sync later"
            )
        return _wandb_logger(cfg, run_id, run_dir, offline=mode == "offline" or (mode == "auto" and not _wandb_has_key()))
    return False  # "none": the config's values were checked when it was loaded


def _wandb_logger(cfg: DictConfig, run_id: str, run_dir: Path, *, offline: bool):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    return WandbLogger(
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
        settings=wandb.Settings(init_timeout=cfg.logger.init_timeout),
    )


def _start_wandb(logger, cfg: DictConfig, run_id: str, run_dir: Path):
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
        return _wandb_logger(cfg, run_id, run_dir, offline=True)


def _figures(module: KMeansTransformerModule, cfg: DictConfig, run_dir: Path, logger) -> None:
    """Pictures of the trained model on the first validation tasks, into ``run_dir/figures``."""
    from ktframe.reporting import figures  # matplotlib: imported once there is a picture to draw

    X, C0, labels = draw(cfg.data, min(8, cfg.data.val_tasks), torch.Generator().manual_seed(cfg.data.val_seed))
    figures.save(figures.training_figures(module.model.cpu(), X, C0, labels), run_dir / "figures", logger or None)


def _check_folder(run_dir: Path, checkpoint_bytes: int) -> None:
    """Say in one line why ``run_dir`` cannot hold the run, if it cannot: better before training
    than at the first checkpoint, hours later. Nothing is created yet (the Trainer's own checks
    come first)."""
    existing = nearest_existing(run_dir)
    check_writable_folder(existing, run_dir, "a writable folder with free space for the run, or another root=")
    free, needed = shutil.disk_usage(existing).free, 3 * checkpoint_bytes  # last.ckpt, best.ckpt, the next one's temporary file
    if free < needed:
        raise InputError(f"{run_dir}: {free} bytes free, and its checkpoints need {needed}; expected a folder with more free space, or another root=")


def _make_folder(cfg: DictConfig, run_dir: Path) -> None:
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        write_atomically(run_dir / "config.yaml", [to_yaml(cfg)])
    except OSError as exc:
        raise InputError(
            f"{run_dir}: cannot write the run folder ({exc.strerror or exc}); expected a writable folder with free space, or another root="
        ) from None


def _checkpoint_bytes(module: KMeansTransformerModule) -> int:
    """About what a checkpoint of ``module`` takes: the weights and Adam's two moments."""
    return 3 * sum(p.numel() * p.element_size() for p in module.parameters()) + (1 << 16)


def _keep_csv_rows(logger, before_step: int) -> None:
    """Lightning's CSV writer deletes an existing metrics.csv when it starts; a resumed run keeps
    the rows its earlier part logged up to the checkpoint, and appends to them."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with path.open(newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("step", "").isdigit() and int(row["step"]) < before_step]
    writer = logger.experiment  # created now: it deletes the file
    writer.metrics[:0] = rows
    writer.save()


def train(cfg: DictConfig) -> RunResult:
    run_id, run_dir, ckpt = agree(lambda: _run_folder(cfg))
    launched = bool(os.environ.get(RUN_DIR_ENV))  # a rank that Lightning's DDP started: its parent made the folder
    # For the processes Lightning's DDP launches (they re-run this command): same id, same folder,
    # same checkpoint. Restored afterwards, so that another train() in this process starts afresh.
    saved = {name: os.environ.get(name) for name in (RUN_ID_ENV, RUN_DIR_ENV, CHECKPOINT_ENV)}
    os.environ.update({RUN_ID_ENV: run_id, RUN_DIR_ENV: str(run_dir), CHECKPOINT_ENV: str(ckpt or "")})
    try:
        return _train(cfg, run_id, run_dir, ckpt, make_folder=not launched)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _train(cfg: DictConfig, run_id: str, run_dir: Path, ckpt: Path | None, *, make_folder: bool) -> RunResult:
    cfg.run_id = run_id
    config = to_dict(cfg)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    module = KMeansTransformerModule(config)
    # What a user can get wrong is found here, before the run folder exists.
    registry().get("initializer", cfg.data.init)
    checkpoint = None if ckpt is None else read_checkpoint(ckpt)
    if checkpoint is not None:
        _check_resumable(checkpoint, cfg, module, ckpt)
    elif cfg.model.init_from is not None:  # a resumed run has its own weights already
        start = read_checkpoint(cfg.model.init_from)
        load_weights(module.model, model_weights(start), cfg.model.init_from)
        check_dimensions(start, module.model, cfg.model.init_from, described_by="this run's config")
    start_step = 0 if checkpoint is None else checkpoint.get("global_step", 0)
    data = TaskDataModule(cfg.data, start_step=start_step)

    # Two callbacks: Lightning (2.6) writes a save_last checkpoint only when the monitored one
    # improved, and resuming needs the latest state after every validation.
    checkpoints = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor="val/ratio",
        mode="min",
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    latest = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="last", save_top_k=1, enable_version_counter=False)
    preemption = Preemption(run_dir / "checkpoints" / "last.ckpt", cfg.trainer.val_every)
    callbacks = [checkpoints, latest, ValidateLastStep(), SeedEachStep(cfg.trainer.seed), preemption]
    if cfg.trainer.early_stopping is not None:
        callbacks.append(EarlyStopping(monitor="val/ratio", mode="min", patience=cfg.trainer.early_stopping, check_on_train_epoch_end=False))
    logger = _logger(cfg, run_id, run_dir)
    owned = _own_folder(run_dir, _checkpoint_bytes(module), fresh=ckpt is None, resuming=cfg.resume == "auto")
    with owned if make_folder else contextlib.nullcontext():
        # After the lock: a refusal is then the one line on stderr, before Lightning's greeting.
        trainer = make_trainer(cfg, logger, callbacks, run_dir)
        try:
            if trainer.is_global_zero:
                _make_folder(cfg, run_dir)
                if logger and cfg.logger.kind == "wandb":
                    trainer.logger = logger = _start_wandb(logger, cfg, run_id, run_dir)
                if logger and cfg.logger.kind == "csv" and ckpt is not None:
                    _keep_csv_rows(logger, before_step=start_step)  # before anything creates the CSV writer
                if logger:
                    logger.log_hyperparams(config)
            with preemption:
                # weights_only here too: left unset, Lightning's load obeys TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
                trainer.fit(module, datamodule=data, ckpt_path=str(ckpt) if ckpt else None, weights_only=True)
                if checkpoint is not None and trainer.global_step == start_step and not preemption.signum:
                    # Resumed at its end (stopped after its last step, before its summary): nothing was
                    # trained or validated, so the final weights are validated again for the summary's
                    # metrics, and not logged again (the loggers hold that validation at its step already).
                    loggers, trainer.loggers = trainer.loggers, []
                    try:
                        trainer.validate(module, datamodule=data, verbose=False)
                    finally:
                        trainer.loggers = loggers
        except OSError as exc:  # a log file on a full disk, say; the checkpoints have their own error
            raise InputError(
                f"{exc.filename or run_dir}: cannot write ({exc.strerror or exc}); expected free space and a writable run folder, then resume=auto to go on from the last checkpoint"
            ) from None

        summary = {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "global_step": trainer.global_step,
            "world_size": trainer.world_size,
            "rank": trainer.global_rank,  # the CLI reports on rank 0 only
            "best_checkpoint": checkpoints.best_model_path,
            "last_checkpoint": str(run_dir / "checkpoints" / "last.ckpt"),
            "best_val_ratio": float(checkpoints.best_model_score) if checkpoints.best_model_score is not None else None,
            "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
        }
        if trainer.is_global_zero:
            try:
                _finish(module, cfg, config, run_dir, logger, Path(checkpoints.best_model_path), summary)
            except (OSError, InputError) as exc:
                where = f"{exc.filename or run_dir}: cannot write ({exc.strerror or exc})" if isinstance(exc, OSError) else str(exc)
                raise InputError(
                    f"{where}; training finished and its checkpoints in {run_dir / 'checkpoints'} are intact: resume=auto finishes the run once that is fixed"
                ) from None
    return RunResult(run_id, run_dir, summary)


@contextlib.contextmanager
def _own_folder(run_dir: Path, checkpoint_bytes: int, *, fresh: bool, resuming: bool) -> Iterator[None]:
    """The run folder checked and locked for the whole fit by the process that owns it (rank 0;
    under torchrun or srun every rank hears the verdict): a second process there is refused. A
    ``fresh`` run checks again, under the lock, that no run was written there since
    :func:`_run_folder` looked (with ``resuming``, that no checkpoint to go on from appeared)."""
    with contextlib.ExitStack() as stack:

        def claim() -> None:
            _check_folder(run_dir, checkpoint_bytes)
            stack.enter_context(FolderLock(run_dir, "ktframe fit"))
            if fresh and not (resuming and not (run_dir / "checkpoints" / "last.ckpt").is_file()):
                check_unused(run_dir, sweep=False, resuming=False)

        agree(claim)
        yield


def _finish(module: KMeansTransformerModule, cfg: DictConfig, config: dict, run_dir: Path, logger, best: Path, summary: dict[str, Any]) -> None:
    """What rank 0 writes once training ended: the figures, the evaluation if asked for, the W&B
    model, and last ``summary.json``, whose presence says the run is complete."""
    wandb_run = logger.experiment if logger and cfg.logger.kind == "wandb" else None
    _figures(module, cfg, run_dir, logger)
    if cfg.eval.after_fit:
        summary["eval"] = str(_evaluate_after_fit(best, run_dir / "eval", logger, config["eval"]))
    if wandb_run is not None:
        if cfg.logger.log_model:
            _log_model(wandb_run, best, summary)
        # wandb records offline mode as "dryrun" in its settings (0.31), as "offline" in older versions
        if wandb_run.settings.mode in ("offline", "dryrun"):
            summary["wandb_sync"] = f"wandb sync {wandb_run.dir.rsplit('/files', 1)[0]}"
    write_atomically(run_dir / "summary.json", [json.dumps(summary, indent=2)])


def _evaluate_after_fit(best: Path, out: Path, logger, settings: dict[str, Any]) -> Path:
    """The paper's evaluation of the best checkpoint, as ``ktframe eval`` runs it, under this run's
    eval ``settings``: a resumed run's may differ from those its checkpoint was saved with. Its
    table and picture go to the logger too when it takes them."""
    report, picture = evaluate_checkpoint(best, [f"eval.{key}={json.dumps(value)}" for key, value in settings.items()], out=out)
    if logger is not None and hasattr(logger, "log_table"):
        columns, rows = table_rows(report)
        logger.log_table(key="eval/log_objective", columns=columns, data=rows)
        logger.log_image(key="eval/objective", images=[str(picture)])
    return out / "eval.json"


def _log_model(wandb_run, best: Path, summary: dict[str, Any]) -> None:
    """The best checkpoint as a W&B model artifact, with the figures that chose it."""
    import wandb

    metadata = {"best_val_ratio": summary["best_val_ratio"], "global_step": summary["global_step"], "run_id": summary["run_id"]}
    artifact = wandb.Artifact(name=f"model-{summary['run_id']}", type="model", metadata=metadata)
    artifact.add_file(str(best), name="best.ckpt")
    wandb_run.log_artifact(artifact, aliases=["best", "latest"])


def make_trainer(cfg: DictConfig, logger, callbacks: list, run_dir: Path) -> L.Trainer:
    """The Trainer of a run, writing and reading checkpoints through :class:`AtomicCheckpointIO`.
    ``trainer.KEY`` values other than ktframe's own are Lightning Trainer arguments, passed as given."""
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
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        log_every_n_steps=cfg.trainer.log_every,
        default_root_dir=str(run_dir),
        enable_progress_bar=cfg.trainer.progress_bar,
        enable_model_summary=False,
    )
    extras = trainer_extras(cfg)
    try:
        return L.Trainer(**{**settings, **extras})
    except (MisconfigurationException, ValueError, TypeError) as exc:  # Lightning's checks of these keys
        keys = [f"trainer.{k}" for k in ("accelerator", "devices", "strategy", "num_nodes", "precision", *extras)]
        raise InputError(f"invalid {'/'.join(keys)}: {str(exc).splitlines()[0]}; see docs/training.md") from None
