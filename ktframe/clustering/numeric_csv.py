"""A numeric CSV's values parsed by compiled code on every core: the numbers :func:`numpy.loadtxt`
reads from such a file, bit for bit, several times faster.

It reads the plain layout that data tools write: a row a line, fields separated by commas, each a
decimal number (``-1.5``, ``2e-3``, ``.5``, ``+7``) with optional spaces or tabs around it, ``\\n``
or ``\\r\\n`` line ends, lines of nothing but spaces skipped. Anything else — a quoted field,
``nan`` or ``inf``, another separator, rows of unequal length, text that is not ASCII — and it
returns None, for the caller to read the file with a general parser that says what is wrong.

Each number is the double nearest its decimal value, as the C library's strtod and NumPy's parser
give it. Where the number's digits form an integer below 2⁵³ and its power of ten is at most 22,
one multiplication or division of two doubles that are exact is that double (Clinger's fast path:
IEEE arithmetic rounds a single operation correctly); other numbers (more than 15 or so
significant digits, large exponents) are handed to strtod. A float32 result is the float64 one
rounded, as :func:`numpy.loadtxt` rounds it.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange, types

from ktframe.kernels.jit import kernel

# The C library's strtod, linked by name (a cached kernel finds it again when it is loaded).
# It takes the text's address and that of a pointer it sets to the end of the number.
_strtod = types.ExternalFunction("strtod", types.float64(types.uintp, types.uintp))

_POWERS = np.array([10.0**e for e in range(23)])  # all exact doubles
_EXACT = 1 << 53
_SPACE, _TAB, _CR, _LF, _COMMA, _DOT, _PLUS, _MINUS, _ZERO, _NINE = (ord(c) for c in " \t\r\n,.+-09")


def parse(data: np.ndarray, start: int, dtype: np.dtype) -> np.ndarray | None:
    """The numbers of ``data[start:]`` (bytes as a uint8 array whose last byte is 0) as an
    ``(rows, columns)`` array of ``dtype`` (float32 or float64), or None where that text is not
    in the layout above. No rows: an ``(0, 0)`` array."""
    if data.ndim != 1 or data.dtype != np.uint8 or not data.size or data[-1] != 0:
        raise ValueError("parse takes the bytes of a file as a uint8 array that ends in a 0 byte")
    end = data.size - 1
    workers = numba.get_num_threads()
    ends = _line_ends(data, start, end, workers)
    firsts = np.concatenate([[start], ends + 1])
    pasts = np.concatenate([ends, [end]])
    if _blank(data, firsts[-1], pasts[-1]):  # what follows the last line end, usually nothing
        firsts, pasts = firsts[:-1], pasts[:-1]
    width = _width(data, firsts, pasts)
    if width == 0:
        return np.empty((0, 0), dtype)
    out = np.empty((firsts.size, width), dtype)
    blank = np.zeros(firsts.size, np.bool_)
    if _parse_rows(data, firsts, pasts, out, blank, _POWERS, min(workers, firsts.size)):
        return None
    return out[~blank] if blank.any() else out


@kernel(parallel=True, nogil=True)
def _line_ends(data, start, end, workers):
    # The offsets of the line feeds in data[start:end], in order: each worker counts them in its
    # share of the bytes, then writes theirs where the counts before it say.
    size = end - start
    counts = np.zeros(workers + 1, np.int64)
    for worker in prange(workers):
        count = 0
        for i in range(start + worker * size // workers, start + (worker + 1) * size // workers):
            count += data[i] == _LF
        counts[worker + 1] = count
    at = np.cumsum(counts)
    ends = np.empty(at[-1], np.int64)
    for worker in prange(workers):
        k = at[worker]
        for i in range(start + worker * size // workers, start + (worker + 1) * size // workers):
            if data[i] == _LF:
                ends[k] = i
                k += 1
    return ends


@kernel(nogil=True)
def _blank(data, first, past):
    for i in range(first, past):
        c = data[i]
        if not (c == _SPACE or c == _TAB or c == _CR):
            return False
    return True


@kernel(nogil=True)
def _width(data, firsts, pasts):
    # The number of fields of the first line that is not blank; 0 where there is none.
    for r in range(firsts.size):
        if not _blank(data, firsts[r], pasts[r]):
            count = 1
            for i in range(firsts[r], pasts[r]):
                count += data[i] == _COMMA
            return count
    return 0


@kernel(inline="always", nogil=True)
def _blanks(data, i, past):
    while i < past and (data[i] == _SPACE or data[i] == _TAB):
        i += 1
    return i


@kernel(inline="always", nogil=True)
def _digits(data, i, past):
    while i < past and _ZERO <= data[i] <= _NINE:
        i += 1
    return i


@kernel(inline="always", nogil=True)
def _number(data, i, past, powers, end):
    # The decimal number in data from i (after spaces or tabs) up to a comma or past: (its
    # value, where it stops, whether it is one). end: strtod's end pointer (scratch).
    i = _blanks(data, i, past)
    start = i
    negative = False
    if i < past and (data[i] == _PLUS or data[i] == _MINUS):
        negative = data[i] == _MINUS
        i += 1
    # The digits as an integer w (up to 19 significant ones, which fit in 64 bits) times 10^scale.
    w = np.uint64(0)
    significant = 0
    scale = 0
    whole = _digits(data, i, past)
    point = whole < past and data[whole] == _DOT
    stop = _digits(data, whole + 1, past) if point else whole
    if stop - i - point == 0:  # no digit at all
        return 0.0, i, False
    for p in range(i, stop):
        c = data[p]
        if c == _DOT:
            continue
        if p > whole:
            scale -= 1
        if significant == 0 and c == _ZERO:
            continue
        significant += 1
        if significant <= 19:
            w = w * np.uint64(10) + np.uint64(c - _ZERO)
        else:
            scale += 1  # a digit dropped: strtod takes the number
    i = stop
    exponent = 0
    if i < past and (data[i] == 101 or data[i] == 69):  # e, E
        i += 1
        sign = 1
        if i < past and (data[i] == _PLUS or data[i] == _MINUS):
            sign = -1 if data[i] == _MINUS else 1
            i += 1
        digits = _digits(data, i, past)
        if digits == i:
            return 0.0, i, False
        for p in range(i, min(digits, i + 6)):
            exponent = exponent * 10 + (data[p] - _ZERO)
        exponent = sign * exponent if digits - i <= 6 else sign * 10**7  # beyond any double: strtod
        i = digits
    stop = i
    i = _blanks(data, i, past)
    if i < past and data[i] != _COMMA:
        return 0.0, i, False
    power = scale + exponent
    if w == 0:
        return -0.0 if negative else 0.0, i, True
    if significant <= 19 and w <= np.uint64(_EXACT) and -22 <= power <= 22:
        value = np.float64(w) * powers[power] if power >= 0 else np.float64(w) / powers[-power]
        return -value if negative else value, i, True
    # Pointers as unsigned integers throughout: numba adds a signed and an unsigned one in floats.
    address = np.uint64(data.ctypes.data)
    value = _strtod(address + np.uint64(start), end.ctypes.data)
    return value, i, end[0] == address + np.uint64(stop)  # else strtod read it otherwise (another locale's decimal point)


@kernel(parallel=True, nogil=True)
def _parse_rows(data, firsts, pasts, out, blank, powers, workers):
    # out[r] = the numbers of line r, or blank[r] = True for a line of nothing but spaces, tabs
    # and carriage returns; the number of other lines that do not hold exactly out's width of
    # numbers. Each worker takes a run of lines.
    rows, width = out.shape
    bad = 0
    for worker in prange(workers):
        end = np.empty(1, np.uintp)
        for r in range(worker * rows // workers, (worker + 1) * rows // workers):
            i, past = firsts[r], pasts[r]
            if past > i and data[past - 1] == _CR:
                past -= 1
            if _blank(data, i, past):
                blank[r] = True
                continue
            ok = True
            for c in range(width):
                value, i, ok = _number(data, i, past, powers, end)
                if not ok or (c < width - 1) == (i == past):  # a comma after each field but the last
                    ok = False
                    break
                out[r, c] = value
                i += 1
            bad += np.int64(not ok)
    return bad
