"""Writing a user's and a run's files: one check that a folder can be written, and atomic writes
that never leave a file half-written, keep an existing file's mode and write through a symbolic link."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from ktframe.core.errors import InputError


def relative_path(path: str | os.PathLike, folder: str | os.PathLike) -> str:
    """``path`` relative to ``folder``, both resolved, with forward slashes: what an output
    records of a file instead of a machine's absolute path."""
    return Path(os.path.relpath(Path(path).resolve(), Path(folder).resolve())).as_posix()


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists: where a folder not made yet would be made."""
    while not path.exists():
        path = path.parent
    return path


def check_writable_folder(folder: Path, subject: str | os.PathLike, expected: str = "a writable folder") -> None:
    """The one check that files can be made in ``folder`` (an existing path): one line about
    ``subject`` (the file or folder to be written) if not: not a folder, permission denied, or a
    read-only file system."""
    if not folder.is_dir():
        raise InputError(f"{subject}: {folder} is a file, not a folder; expected {expected}")
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        reason = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "Permission denied"
        raise InputError(f"{subject}: cannot write in the folder {folder} ({reason}); expected {expected}")


def check_writable(out: Path, names: tuple[str, ...]) -> None:
    """Refuse an output folder that cannot be made or written, or where one of the files ``names``
    to write there is a folder, before anything is written (or computed) for it."""
    check_writable_folder(nearest_existing(out), out, f"a writable folder for {', '.join(names)}")
    taken = [name for name in names if (out / name).is_dir()]
    if taken:
        raise InputError(f"{out / taken[0]}: is a folder; expected to write a file of that name")


def _umask() -> int:
    """The process's umask, read without setting it (Linux reports it in /proc; elsewhere the usual 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


_NEW_FILE_MODE = 0o666 & ~_umask()


def output_path(path: str | os.PathLike) -> Path | None:
    """Where :func:`write_atomically` writes ``path``, after the checks it makes first (made here
    alone, so that a command can make them before any work): ``path`` itself; the file it names
    where it is a symbolic link (written through: the link stays, its target gets the content);
    None where it is an existing file that is not a regular one, such as ``/dev/null`` or a pipe,
    which is written into as a stream. Refused: a folder, a folder that does not exist, one this
    process cannot write in."""
    path = Path(path)
    try:
        status = path.stat()
    except FileNotFoundError:
        status = None
    except OSError as exc:
        raise InputError(f"{path}: cannot write there ({exc.strerror}); expected a writable file path") from None
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise InputError(f"{path}: is a folder; expected the name of a file to write")
    effective = os.access in os.supports_effective_ids
    if status is not None and not stat.S_ISREG(status.st_mode):
        if not os.access(path, os.W_OK, effective_ids=effective):
            raise InputError(f"{path}: cannot write there (Permission denied); expected a writable file path")
        return None
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{path}: the folder {folder} does not exist")
    check_writable_folder(folder, path)
    return target


def write_atomically(path: str | os.PathLike, content: Iterable[str] | bytes) -> None:
    """Write ``content`` (lines of text, or bytes) to ``path`` through a temporary file in the same
    folder, so that a failure leaves either the old file or none, never a partial one. A file that
    exists keeps its permission mode, a new one gets the process's usual mode (``0o666`` less the
    umask); a symbolic link and a stream are written as :func:`output_path` says."""
    target = output_path(path)
    if target is None:  # a device or a pipe: nothing there to keep, so written as it comes
        try:
            with open(path, "wb") as handle:
                _write(handle, content)
        except OSError as exc:
            raise InputError(f"{path}: could not write the file ({exc.strerror}); expected a writable file path") from None
        return
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = _NEW_FILE_MODE
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise InputError(f"{path}: cannot write in the folder {target.parent} ({exc.strerror}); expected a writable folder") from None
    try:
        os.fchmod(fd, mode)  # mkstemp makes it private (0600)
        with os.fdopen(fd, "wb") as handle:
            _write(handle, content)
        os.replace(tmp, target)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: could not write the file ({exc.strerror}); expected a writable file path") from None
        raise


def _write(handle: BinaryIO, content: Iterable[str] | bytes) -> None:
    if isinstance(content, bytes):
        handle.write(content)
    else:  # streamed a line (or a block of lines) at a time: never one string of the whole file
        for line in content:
            handle.write((line + "\n").encode("utf-8"))


MARKER = ".ktframe-output.json"


def claim_folder(folder: Path, command: str, *, force: bool = False, resume: bool = False) -> bool:
    """The one way a command takes an output folder: a new or empty one gets ``command``'s marker
    file; one that holds ``command``'s marker (its own earlier output) is taken only with
    ``force`` or ``resume``; any other folder that holds files only with ``force``, which lets the
    command replace the files it writes itself and nothing else. True where the folder is the
    command's own (a new one included): only there may it remove a file of its earlier output."""
    check_writable_folder(nearest_existing(folder), folder, f"a writable folder for ktframe {command}'s files")
    marker = folder / MARKER
    try:
        owner = json.loads(marker.read_text(encoding="utf-8")).get("command") if marker.is_file() else None
    except (OSError, ValueError, AttributeError):
        owner = None
    held = folder.is_dir() and any(folder.iterdir())
    if owner == command:
        if not (force or resume):
            again = "--resume to go on with it, " if command == "gamma-sweep" else ""
            raise InputError(f"--out {folder}: holds an earlier ktframe {command}; expected another --out, {again}or --force to replace its files")
        return True
    if resume:
        return False  # the journal of the sweep stopped there decides, and names what --resume expects
    if held and not force:
        raise InputError(
            f"--out {folder}: exists and holds files that ktframe {command} did not write; expected a new folder for --out, or --force to write there"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not held:
            write_atomically(marker, [json.dumps({"command": command})])
    except OSError as exc:
        raise InputError(f"--out {folder}: cannot make the folder ({exc.strerror}); expected a writable folder") from None
    return not held
