"""Reading a user's points from CSV or ``.npy`` and writing labels, refusing bad files clearly."""

from __future__ import annotations

import codecs
import csv
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ktframe.clustering import numeric_csv
from ktframe.core.errors import InputError

SUFFIXES = (".csv", ".npy")


def load_points(path: str | os.PathLike, dtype: np.dtype | type | str | None = None) -> np.ndarray:
    """Points ``(n, d)`` from a CSV file (one row a point, an optional header row) or a ``.npy``.

    ``dtype``: that of the result (``float32`` or ``float64``); by default a ``float32`` ``.npy``
    stays ``float32`` and everything else is ``float64``."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise InputError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; expected a .csv or .npy file")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    points = _load_npy(path, dtype) if path.suffix.lower() == ".npy" else _load_csv(path, np.dtype(dtype or np.float64))
    if points.size == 0:
        raise InputError(f"{path}: the file holds no points; expected one row per point")
    if not np.isfinite(points).all():
        row, col = np.argwhere(~np.isfinite(points))[0]
        raise InputError(f"{path}: row {row + 1}, column {col + 1} is {points[row, col]}; expected finite numbers (remove or impute missing values)")
    return points


def _load_npy(path: Path, dtype: np.dtype | type | str | None) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"{path}: not a numeric .npy array ({exc}); expected a 2-D array of numbers saved by numpy.save") from None
    except (OSError, EOFError) as exc:  # EOFError: an empty or truncated file
        raise InputError(f"{path}: not a readable .npy file ({exc}); expected a 2-D array of numbers saved by numpy.save") from None
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool) or np.issubdtype(array.dtype, np.complexfloating):
        raise InputError(f"{path}: holds values of type {array.dtype}; expected real numbers")
    if array.ndim != 2:
        raise InputError(f"{path}: array has shape {array.shape}; expected 2 dimensions (points, features)")
    if dtype is None:
        dtype = np.float32 if array.dtype == np.float32 else np.float64
    return array.astype(dtype, copy=False)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_header(cells: list[str]) -> bool:
    """Whether a file's first row names its columns: none of its cells is a number."""
    return not any(_number(cell) is not None for cell in cells)


def _load_csv(path: Path, dtype: np.dtype) -> np.ndarray:
    """The parallel parser of :mod:`~ktframe.clustering.numeric_csv` after the header row, if
    any; where the file is not in its plain layout, numpy's C parser (:func:`numpy.loadtxt`); on
    any failure of that, the file is read again by :func:`_load_csv_slowly`, which either reads it
    (a layout the C parser refuses, such as quoted cells) or says precisely what is wrong."""
    values = _load_csv_quickly(path, dtype)
    if values is not None:
        return values
    try:
        with path.open(encoding="utf-8-sig") as handle:  # -sig: skip the BOM spreadsheets write
            for line in handle:
                if line.strip():
                    break
            else:
                return np.empty((0, 0), dtype)
            first = next(csv.reader([line]), [])
            if not _is_header(first):  # parse the first row too
                handle.seek(0)  # (the decoder skips the BOM again)
                values = np.loadtxt(handle, delimiter=",", comments=None, dtype=dtype, ndmin=2)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "input contained no data": a header only
                    values = np.loadtxt(handle, delimiter=",", comments=None, dtype=dtype, ndmin=2)
    except (ValueError, UnicodeDecodeError):
        return _load_csv_slowly(path).astype(dtype, copy=False)
    return values if values.size else np.empty((0, 0), dtype)


def _load_csv_quickly(path: Path, dtype: np.dtype) -> np.ndarray | None:
    """The file's numbers by :func:`numeric_csv.parse`, or None where it does not read them."""
    size = path.stat().st_size
    data = np.empty(size + 1, np.uint8)  # and a 0 after the text, where strtod stops
    with path.open("rb") as handle:
        if handle.readinto(memoryview(data)[:size]) != size:
            return None
    data[size] = 0
    start = len(codecs.BOM_UTF8) if data[:3].tobytes() == codecs.BOM_UTF8 else 0  # as spreadsheets write
    line, after = _line(data, start, size)
    while not line.strip() and after < size:
        start = after
        line, after = _line(data, start, size)
    try:
        cells = next(csv.reader([line.decode("utf-8")]), [])
    except UnicodeDecodeError:
        return None
    return numeric_csv.parse(data, after if _is_header(cells) else start, dtype)


def _line(data: np.ndarray, start: int, size: int) -> tuple[bytes, int]:
    """The line of ``data`` that starts at ``start`` (without its line end) and where the next one starts."""
    view, end, block = memoryview(data), start, 1 << 16
    while end < size:
        found = bytes(view[end : min(size, end + block)]).find(b"\n")
        if found >= 0:
            return bytes(view[start : end + found]), end + found + 1
        end += block
    return bytes(view[start:size]), size


def _load_csv_slowly(path: Path) -> np.ndarray:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:  # -sig: skip the BOM spreadsheets write
            rows = [row for row in csv.reader(handle) if any(cell.strip() for cell in row)]
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text CSV file; expected UTF-8 text with one point per row") from None
    if rows and _is_header(rows[0]):
        rows = rows[1:]
    if not rows:
        return np.empty((0, 0))
    width = len(rows[0])
    values = np.empty((len(rows), width))
    for i, row in enumerate(rows):
        if len(row) != width:
            raise InputError(f"{path}: row {i + 1} has {len(row)} values but the first row has {width}; expected the same number of columns in every row")
        for j, cell in enumerate(row):
            number = _number(cell)
            if number is None:
                raise InputError(f"{path}: row {i + 1}, column {j + 1} is {cell.strip()!r}, not a number; expected numeric columns only")
            values[i, j] = number
    return values


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


def write_atomically(path: str | os.PathLike, content: Iterable[str] | bytes) -> None:
    """Write ``content`` (lines of text, or bytes) to ``path`` through a temporary file in the same
    folder, so that a failure leaves either the old file or none, never a partial one."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{path}: the folder {folder} does not exist")
    if path.is_dir():
        raise InputError(f"{path}: is a folder; expected the name of a file to write")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise InputError(f"{path}: cannot write in the folder {folder} ({exc.strerror}); expected a writable folder") from None
    try:
        os.fchmod(fd, _NEW_FILE_MODE)  # mkstemp makes it private (0600); a written file is an ordinary one
        with os.fdopen(fd, "wb") as handle:
            if isinstance(content, bytes):
                handle.write(content)
            else:  # streamed a line (or a block of lines) at a time: never one string of the whole file
                for line in content:
                    handle.write((line + "\n").encode("utf-8"))
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: could not write the file ({exc.strerror}); expected a writable file path") from None
        raise


#: labels per block of :func:`label_lines`
LABEL_BLOCK = 1 << 16


def label_lines(labels: Iterable[int] | np.ndarray) -> Iterator[str]:
    """The labels file, ``label`` then one label a line, as blocks of lines (each without its
    final newline, as :func:`write_atomically` takes lines), so that no string holds the whole
    file."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64, copy=False)
    yield "label"
    for start in range(0, len(labels), LABEL_BLOCK):
        yield "\n".join(map(str, labels[start : start + LABEL_BLOCK].tolist()))
