"""Run and sweep folders: which folder and run id a fit takes (the same on every rank), what a
folder already holds, and the lock that keeps a second process out of it while the first works
there. Everything chosen before the Trainer starts (the run id, hence the folder and the W&B id)
comes from the config or from ``KTFRAME_RUN_ID``, which the first process sets and the processes
Lightning's DDP launches inherit; ranks that ``torchrun`` or ``srun`` started take rank 0's choice
(:func:`ktframe.training.launch.agree`).

The lock is an OS file lock (``flock`` through the ``filelock`` package) on ``.lock`` in the
folder, so the kernel releases it when its holder ends in any way, a SIGKILL included: a killed
run never blocks its own ``resume=auto``. Beside it, ``.lock.holder`` names the holder (pid and
host) for the message another process gets; it is removed on release.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig

from ktframe.core.errors import InputError
from ktframe.core.io import check_writable_folder, nearest_existing, write_atomically
from ktframe.learning.checkpoint_io import read_checkpoint
from ktframe.learning.config import check_path_component, to_yaml
from ktframe.learning.module import KMeansTransformerModule
from ktframe.training.launch import agree

LOCK = ".lock"
HOLDER = ".lock.holder"
# What a run leaves in its folder as soon as it starts training, and what a sweep leaves in its own.
RUN_FILES = ("config.yaml", "checkpoints", "summary.json")
SWEEP_FILE = "multirun.json"


def holds(folder: Path) -> str | None:
    """What ``folder`` holds already, as words for a message: "a run (config.yaml, ...)",
    "a sweep (multirun.json)"; None where it holds neither."""
    if (folder / SWEEP_FILE).is_file():
        return f"a sweep ({SWEEP_FILE})"
    found = [name for name in RUN_FILES if (folder / name).exists()]
    return f"a run ({', '.join(found)})" if found else None


def check_unused(folder: Path, *, sweep: bool, resuming: bool) -> None:
    """Refuse to start a new run (or, with ``sweep``, a new sweep) in a folder that holds one;
    ``resuming`` (``resume=auto``) lets a run go on in a run folder, a sweep in a sweep folder."""
    held = holds(folder)
    if held is None:
        return
    holds_sweep = held.startswith("a sweep")
    if resuming and holds_sweep == sweep:
        return
    how = "`ktframe fit -m ... resume=auto`" if holds_sweep else "resume=auto"
    raise InputError(
        f"{folder}: holds {held} already; expected {how} to continue it, or another name for a new {'sweep' if sweep else 'run'} (e.g. name={free_name(folder)})"
    )


def free_name(folder: Path) -> str:
    """The first of ``NAME-2``, ``NAME-3``, ... that names no folder beside ``folder``."""
    number = 2
    while (folder.parent / f"{folder.name}-{number}").exists():
        number += 1
    return f"{folder.name}-{number}"


class FolderLock:
    """Held with ``with FolderLock(folder, "ktframe fit"):``; the folder is made if need be.
    A folder another process holds is a one-line :class:`InputError` naming that process."""

    def __init__(self, folder: Path, user: str) -> None:
        from filelock import FileLock

        self.folder, self.user = folder, user
        self._lock = FileLock(str(folder / LOCK))

    def __enter__(self) -> FolderLock:
        from filelock import Timeout

        self._made = []  # the folders that the lock makes, innermost first
        missing = self.folder
        while not missing.exists() and missing != missing.parent:
            self._made.append(missing)
            missing = missing.parent
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock.acquire(timeout=0)
        except Timeout:
            raise InputError(
                f"{self.folder}: in use by another {self.user} ({self._holder()}); expected it to end first, or another name= for a new run"
            ) from None
        except OSError as exc:
            raise InputError(f"{self.folder}: cannot lock the folder ({exc.strerror or exc}); expected a writable folder, or another root=") from None
        try:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.user}
            write_atomically(self.folder / HOLDER, [json.dumps(holder)])
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, kind, *exc) -> None:
        # Ended by an error before anything was written, in a folder it made: no trace is left.
        undo = kind is not None and self._made and holds(self.folder) is None
        try:
            (self.folder / HOLDER).unlink(missing_ok=True)
            if undo:
                (self.folder / LOCK).unlink(missing_ok=True)
        finally:
            self._lock.release()
        for folder in self._made if undo else ():
            with contextlib.suppress(OSError):  # not empty: another process has written there since
                folder.rmdir()

    def _holder(self) -> str:
        try:
            holder = json.loads((self.folder / HOLDER).read_text())
            return f"held by pid {holder['pid']} on {holder['host']}"
        except (OSError, ValueError, KeyError, TypeError):  # it has only just taken the lock, or ends now
            return "held by a process that has not said which"


RUN_ID_ENV = "KTFRAME_RUN_ID"


RUN_DIR_ENV = "KTFRAME_RUN_DIR"  # set by train() for the processes DDP launches, then removed


CHECKPOINT_ENV = "KTFRAME_RESUME_FROM"


WANDB_AGENT_RUN_ID_ENV = "WANDB_RUN_ID"  # set by `wandb agent` for each run it starts


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def checkpoint_run_id(ckpt: Path) -> str:
    return read_checkpoint(ckpt)["hyper_parameters"]["config"]["run_id"]


def resolve_run(cfg: DictConfig) -> tuple[str, Path, Path | None]:
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
        return checkpoint_run_id(ckpt), ckpt.parent.parent, ckpt
    if cfg.resume == "auto":
        # The named run goes on under its own id (so its W&B run too); unnamed, the latest run.
        named = cfg.name or cfg.run_id
        candidates = (
            [root / named / "checkpoints" / "last.ckpt"] if named else sorted(root.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)[-1:]
        )
        for last in candidates:
            if last.is_file():
                return checkpoint_run_id(last), last.parent.parent, last
    # Under `wandb agent` the run id is the one W&B assigned, so that the folder and the W&B run agree.
    run_id = cfg.run_id or environment_id(RUN_ID_ENV) or environment_id(WANDB_AGENT_RUN_ID_ENV) or new_run_id()
    run_dir = root / (cfg.name or run_id)
    check_unused(run_dir, sweep=False, resuming=cfg.resume == "auto")
    return run_id, run_dir, None


def environment_id(variable: str) -> str | None:
    """A run id from the environment, checked as the config's run_id is: it names a folder."""
    value = os.environ.get(variable) or None
    check_path_component(f"the run id in the environment variable {variable}", value)
    return value


def check_run_folder(run_dir: Path, checkpoint_bytes: int) -> None:
    """Say in one line why ``run_dir`` cannot hold the run, if it cannot: better before training
    than at the first checkpoint, hours later. Nothing is created yet (the Trainer's own checks
    come first)."""
    existing = nearest_existing(run_dir)
    check_writable_folder(existing, run_dir, "a writable folder with free space for the run, or another root=")
    free, needed = shutil.disk_usage(existing).free, 3 * checkpoint_bytes  # last.ckpt, best.ckpt, the next one's temporary file
    if free < needed:
        raise InputError(f"{run_dir}: {free} bytes free, and its checkpoints need {needed}; expected a folder with more free space, or another root=")


def make_run_folder(cfg: DictConfig, run_dir: Path) -> None:
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        write_atomically(run_dir / "config.yaml", [to_yaml(cfg)])
    except OSError as exc:
        raise InputError(
            f"{run_dir}: cannot write the run folder ({exc.strerror or exc}); expected a writable folder with free space, or another root="
        ) from None


def checkpoint_bytes(module: KMeansTransformerModule) -> int:
    """About what a checkpoint of ``module`` takes: the weights and Adam's two moments."""
    return 3 * sum(p.numel() * p.element_size() for p in module.parameters()) + (1 << 16)


@contextlib.contextmanager
def own_run_folder(run_dir: Path, checkpoint_bytes: int, *, fresh: bool, resuming: bool) -> Iterator[None]:
    """The run folder checked and locked for the whole fit by the process that owns it (rank 0;
    under torchrun or srun every rank hears the verdict): a second process there is refused. A
    ``fresh`` run checks again, under the lock, that no run was written there since
    :func:`resolve_run` looked (with ``resuming``, that no checkpoint to go on from appeared)."""
    with contextlib.ExitStack() as stack:

        def claim() -> None:
            check_run_folder(run_dir, checkpoint_bytes)
            stack.enter_context(FolderLock(run_dir, "ktframe fit"))
            if fresh and not (resuming and not (run_dir / "checkpoints" / "last.ckpt").is_file()):
                check_unused(run_dir, sweep=False, resuming=False)

        agree(claim)
        yield
