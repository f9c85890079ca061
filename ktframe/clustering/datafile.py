"""Reading a user's points from CSV or ``.npy`` and writing labels, refusing bad files clearly."""

from __future__ import annotations

import codecs
import csv
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from ktframe.core.errors import InputError
from ktframe.core.validation import check_magnitude, peak_magnitude
from ktframe.kernels import jit

SUFFIXES = (".csv", ".npy")


def load_points(path: str | os.PathLike, dtype: np.dtype | type | str | None = None) -> np.ndarray:
    """Points ``(n, d)`` from a CSV file (one row a point, an optional header row) or a ``.npy``.

    ``dtype``: that of the result (``float32`` or ``float64``); by default a ``float32`` ``.npy``
    stays ``float32`` and everything else is ``float64``. Refused, with one line: a folder, a file
    that is missing, unreadable or too large for the memory, one that is not numbers, and points
    whose squared distances overflow the dtype."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder; expected a .csv or .npy file")
    if path.suffix.lower() not in SUFFIXES:
        raise InputError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; expected a .csv or .npy file")
    if not path.is_file():
        raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file; expected a .csv or .npy file")
    try:
        points = _load_npy(path, dtype) if path.suffix.lower() == ".npy" else _load_csv(path, np.dtype(dtype or np.float64))
    except MemoryError:
        raise InputError(f"{path}: not enough memory to read its points ({path.stat().st_size:,} bytes); expected a file whose points fit in memory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc}); expected a file this user can read") from None
    if points.size == 0:
        raise InputError(f"{path}: the file holds no points; expected one row per point")
    tensor = torch.from_numpy(points)
    peak = peak_magnitude(tensor)
    if not math.isfinite(peak):
        row, col = np.argwhere(~np.isfinite(points))[0]
        raise InputError(f"{path}: row {row + 1}, column {col + 1} is {points[row, col]}; expected finite numbers (remove or impute missing values)")
    check_magnitude(peak, points.shape[1], tensor.dtype, str(path))
    return points


def _load_npy(path: Path, dtype: np.dtype | type | str | None) -> np.ndarray:
    with path.open("rb") as handle:  # opened first: a file that cannot be opened is not a bad .npy
        try:
            array = np.load(handle, allow_pickle=False)
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
    """The file's numbers by :func:`numeric_csv.parse`, or None where it does not read them (or
    the file is too small to repay loading the parser's kernels: NumPy's parser reads it then)."""
    size = path.stat().st_size
    if size < 8 * jit.MIN_NUMBERS:  # a number and its comma take 8 bytes or more, as the writers write them
        return None
    from ktframe.clustering import numeric_csv  # numba, imported for a file that repays it

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
