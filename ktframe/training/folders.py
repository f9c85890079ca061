"""Run and sweep folders belong to one run or sweep: what a folder already holds, and the lock
that keeps a second process out of it while the first works there.

The lock is an OS file lock (``flock`` through the ``filelock`` package) on ``.lock`` in the
folder, so the kernel releases it when its holder ends in any way, a SIGKILL included: a killed
run never blocks its own ``resume=auto``. Beside it, ``.lock.holder`` names the holder (pid and
host) for the message another process gets; it is removed on release.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

from ktframe.core.errors import InputError
from ktframe.core.io import write_atomically

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
