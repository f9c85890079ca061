"""Fused CPU loops (numba) for the hot spots of hard attention that eager PyTorch runs as many passes.

- :func:`argmax_count`: every row's arg-max and number of maximal entries, in one parallel pass
  over a block of logits (the arg-max map; eager PyTorch takes a max, a compare and a reduction).
- :func:`argmax_dot`: each query's winning key for logits ``a (q·k) + b ‖k‖²`` without building
  them all: a thread's tile of a few hundred queries at a time, summed on the spot for few
  coordinates or by a single-threaded BLAS product for more, and reduced while it is in cache.
  Queries whose best key does not win by more than rounding are left to the caller (−1).
  Optionally with the sums, by winner, of value rows (a cluster's points), O(n · f), and the
  winners' value rows written into a slot of the stream, in the same pass.
- :func:`add_sparse_key_sums`: ``Σᵢ kᵢ vᵢᵀ`` and ``Σᵢ kᵢ`` over keys with few non-zeros (the
  one-hot assignments that the center update reads), touching only the non-zeros: O(nnz · f)
  instead of the O(n · e · f) dense product.
- :func:`cluster_attention`: normalized linear attention over keys summed by cluster (what the
  arg-max kernel's sums give the center update), written straight into a slot of the stream.
- :func:`hard_steps`: every step of Lloyd's hard-assignment layer (the arg-max kernel's pass,
  then the cluster attention) for each small task on its own, in one call.
- :func:`gather_rows`: value rows picked by index, written straight into a slot of the stream.
- :func:`inertia`: the k-means objective of given labels, in one pass over the points (PyTorch
  gathers an index as large as the points and takes three more passes).
- :func:`mean_square_deviation`: each task's mean squared deviation from its mean point (the
  ``tol`` bound), in two passes (NumPy's casts to float64 cost more than the sums).
- :func:`tasks_changed`: which tasks' rows differ between two copies, in one pass (PyTorch takes
  a compare, a reduction and their temporaries).
- :func:`shifts_beyond`: whether a step's center shift is surely beyond every task's ``tol``
  bound, in one call where the exact comparison takes three array operations.

On finite inputs they compute what their PyTorch counterparts compute (sums in another order).
They run on CPU tensors of float32 or float64 that need no gradient; :func:`usable` says when,
and ``KTFRAME_NO_KERNELS=1`` turns them off (PyTorch's own ops are used then, as on a GPU).
They use as many threads as PyTorch does (``torch.set_num_threads``, ``OMP_NUM_THREADS``), and
one for small work (:func:`_thread_count`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

from ktframe.core import switches
from ktframe.kernels import jit
from ktframe.kernels.jit import kernel, load_numba, prange

OFF_ENV = "KTFRAME_NO_KERNELS"
_KERNEL_DTYPES = (torch.float32, torch.float64)


def eligible(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors, whatever their size: CPU, float32/float64, no
    autograd, not turned off, not in a process forked from one whose kernels run on OpenMP
    (:func:`ktframe.kernels.jit.forked_from_openmp_pool`). The rest of a step whose first kernel has
    run (:func:`usable`) goes to the kernels on this test alone: a PyTorch operation between two
    kernel launches that is large enough for PyTorch's OpenMP threads (a small matrix product is)
    leaves them spinning on the cores that the next launch's threads need, for longer than the
    launch itself."""
    if switches.on(OFF_ENV) or jit.forked_from_openmp_pool():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:  # a loop, not all(...) over a generator: this runs several times per layer
        if t.device.type != "cpu" or t.dtype not in _KERNEL_DTYPES or (grad and t.requires_grad):
            return False
    return True


def usable(*tensors: torch.Tensor, numbers: int | None = None) -> bool:
    """Whether a step begins on the kernels: :func:`eligible` tensors of together at least
    :data:`ktframe.kernels.jit.MIN_NUMBERS` numbers, or of a problem of that many ``numbers``
    where the caller counts it otherwise."""
    return eligible(*tensors) and (sum(t.numel() for t in tensors) if numbers is None else numbers) >= jit.MIN_NUMBERS


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# --- threads ----------------------------------------------------------------------------------

# Below this much work (about one unit per number read or multiplied) a kernel runs on the calling
# thread: waking the pool costs more than the work and, on a machine busy with other processes, a
# woken thread can wait a whole scheduler slice (tens of milliseconds) for a core.
SERIAL_WORK = 1 << 16
# Held while a thread runs ktframe's kernels (reentrant: a kernel's caller may call another).
_LAUNCH = threading.RLock()


def _thread_count(work: int) -> int:
    """How many threads a kernel of ``work`` runs on: as many as PyTorch uses (the process's
    budget: ``torch.set_num_threads``, ``OMP_NUM_THREADS``; a multirun's ``--jobs`` share the
    cores by it), at most numba's pool, and one for less than ``SERIAL_WORK``."""
    numba = load_numba()
    return 1 if work < SERIAL_WORK else max(1, min(numba.config.NUMBA_NUM_THREADS, torch.get_num_threads()))


@contextlib.contextmanager
def _using(threads: int) -> Iterator[None]:
    """The numba kernels called inside run on ``threads`` threads (numba's setting is the calling
    thread's own), one calling thread at a time: numba's workqueue layer, ktframe's last choice
    (:func:`ktframe.kernels.jit.load_numba`), takes one parallel launch at a time, and a second one
    at once would end the process."""
    numba = load_numba()
    with _LAUNCH:
        previous = numba.get_num_threads()
        if previous == threads:  # most calls: each set costs microseconds, a few dozen of them per fit
            yield
            return
        numba.set_num_threads(threads)
        try:
            yield
        finally:
            numba.set_num_threads(previous)


# --- arg-max ----------------------------------------------------------------------------------


@kernel(fastmath={"nnan", "nsz"}, nogil=True)
def _row_max(row):
    # The maximum of numbers is the same in any order, which these flags allow; NaNs are caught
    # by the caller's count pass.
    best = row[0]
    for j in range(1, row.shape[0]):
        best = max(best, row[j])
    return best


@kernel(nogil=True)
def _maxima(row):
    # (sum of the columns of the maximal entries, their number; a row holding a NaN: count 0).
    floor = _row_max(row)
    hits = 0
    columns = 0
    nans = 0
    for j in range(row.shape[0]):  # sums of compares and selects: vectorised, unlike a first-hit search
        x = row[j]
        hits += np.int64(x >= floor)
        columns += j if x >= floor else 0
        nans += np.int64(x != x)
    return columns, 0 if nans else hits


@kernel(parallel=True, nogil=True)
def _argmax_rows(logits, index, count):
    for r in prange(logits.shape[0]):
        index[r], count[r] = _maxima(logits[r])


def argmax_count(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For logits ``(…, n)``: each row's number of maximal entries and the column of its maximum
    (with several maxima: the sum of their columns; a row holding a NaN counts 0), as int64."""
    flat = logits.reshape(-1, logits.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    index = torch.empty(flat.shape[0], dtype=torch.int64)
    count = torch.empty(flat.shape[0], dtype=torch.int64)
    with _using(_thread_count(flat.numel())):
        _argmax_rows(_array(flat), index.numpy(), count.numpy())
    return count.view(logits.shape[:-1]), index.view(logits.shape[:-1])


# The helpers that take shared arrays are inlined: a call (or a view) counts references to
# them, atomically, from every thread at once, and costs more than the helper's work.
@kernel(inline="always", nogil=True)
def _slack(squares, reach, bounds):
    # How far apart two logits a (q·k) + b ‖k‖² of one query must be for every rounding of them
    # (the kernel's, PyTorch's) to order them alike, or inf where a logit might overflow (or is
    # NaN): bounds = (4 (d + 3) u, |b|, a safe magnitude), squares = ‖a q‖², reach = max ‖k‖.
    # Each rounding of a logit is within (d + 3) u (‖a q‖ ‖k‖ + |b| ‖k‖²) of its exact value
    # (u: the unit roundoff; Σ |a q_c k_c| ≤ ‖a q‖ ‖k‖), and a comparison of two logits under two
    # roundings meets four such errors. The same sum bounds every partial sum of a logit.
    # bounds is a tuple, not an array: a tuple's entries cannot change under the stores of a loop
    # over queries, so they stay in registers.
    size = np.sqrt(squares) * reach + bounds[1] * reach * reach
    return bounds[0] * size if size < bounds[2] else np.inf


@kernel(inline="always", nogil=True)
def _decide(logits, rows, squares, reach, bounds, best, floor, margin, hits, columns):
    # For the key-major logits (n, ≥ rows) of a tile's queries: margin[i], the query's _slack;
    # hits[i], 1 where its best key wins by more than that (every other logit falls below
    # best − margin), 2 where a rival comes within it, and 0 where the margin is inf (only then
    # can a logit be NaN, since a NaN comes from an input that is not finite or from an
    # overflow); columns[i], the best key where hits[i] is 1. best and floor are scratch.
    # Two passes, each a loop across the tile's queries that vectorises: each query's best
    # logit, then how many of its logits lie within the margin of it and the sum of their
    # columns (the best's own column where it is alone there). A running top two in one pass
    # stores three numbers per logit, and took three times as long. A NaN (x > y false) is never
    # taken as best after the first key; it can only come where the margin is inf.
    n = logits.shape[0]
    for i in range(rows):
        best[i] = logits[0, i]
    for j in range(1, n):
        x = logits[j]
        for i in range(rows):
            best[i] = x[i] if x[i] > best[i] else best[i]
    for i in range(rows):
        margin[i] = _slack(squares[i], reach, bounds)
        floor[i] = np.float64(best[i]) - margin[i]
        hits[i] = 0
        columns[i] = 0
    for j in range(n):
        x = logits[j]
        key = np.int32(j)
        for i in range(rows):
            near = np.float64(x[i]) >= floor[i]
            hits[i] += np.int32(near)
            columns[i] += key if near else np.int32(0)
    for i in range(rows):
        alone = np.int32(1) if hits[i] == 1 else np.int32(2)
        hits[i] = alone if margin[i] < np.inf else np.int32(0)


@kernel(nogil=True)
def _exact_winner(query, keys_t, exact):
    # A near tie of float32 logits, settled in float64: exact = (a, b, 4 (d + 3) u₆₄, on). Each
    # product of two float32 numbers is exact in float64, so a logit summed in float64 is within
    # (d + 3) u₆₄ (‖a q‖ ‖k‖ + |b| ‖k‖²) of its exact value, and a key that wins by more than
    # four such errors is the exact arg-max. Returns its column, or −1 where float64 cannot tell
    # either (an exact tie). keys_t holds a key per column (its first d rows).
    a, b = exact[0], exact[1]
    d, n = query.shape[0], keys_t.shape[1]
    best = runner = -np.inf
    column = -1
    scale = reach = 0.0
    for c in range(d):
        scale += (a * np.float64(query[c])) ** 2
    for j in range(n):
        dot = squares = 0.0
        for c in range(d):
            w = np.float64(keys_t[c, j])
            dot += np.float64(query[c]) * w
            squares += w * w
        x = a * dot + b * squares
        reach = max(reach, squares)
        if x > best:
            best, runner, column = x, best, j
        elif x > runner:
            runner = x
    return column if best - runner > exact[2] * (np.sqrt(scale * reach) + abs(b) * reach) else -1


@kernel(inline="always", nogil=True)
def _settle(b, lo, rows, hits, columns, index, segments, tally, write, part):
    # What follows for the queries lo, ..., lo + rows - 1 of task b: index[b, i] is the key that
    # query i wins outright, or −1 (no clear winner). For a winner j: the query's value row is
    # added to segment j of partial sums number `part`, and row j of the table is copied to the
    # query's row of out where it differs, with moved[b] set then (where moved has rows). The
    # table and out come as their bits (unsigned integers): a copy of bits, compared bit for bit.
    # Comparing first writes only the rows that change, which is most of the time none; where
    # index comes known (write[5]: it holds the key whose table row each out row holds, as a
    # previous call on an unchanged table left them), a query that wins that key again needs no
    # compare either: its row cannot have changed.
    # Rows are flat unit-stride runs (see _flat), located in unsigned arithmetic, which spares
    # every access a test for a negative index; empty sums or out arrays ask for neither.
    # Returns the number of queries without a clear winner.
    values, value_strides, sums, sizes = tally
    table, table_strides, out, out_strides, moved, known = write
    u = np.uint64
    tasks, n, f = u(index.shape[0]), u(segments), u(sums.shape[0] // max(1, sizes.shape[0]))
    width = out_strides[2]
    row = index[b, lo : lo + rows]
    if f or width:
        for r in range(rows):
            if hits[r] != 1:
                continue
            i, j = lo + r, columns[r]
            if f:
                segment = (u(part) * tasks + u(b)) * n + u(j)
                sizes[segment] += 1
                source = u(b) * value_strides[0] + u(i) * value_strides[1]
                target = segment * f
                for c in range(f):
                    sums[target + c] += values[source + c]
            if width and not (known and row[r] == j):
                source = u(b) * table_strides[0] + u(j) * table_strides[1]
                target = u(b) * out_strides[0] + u(i) * out_strides[1]
                same = True
                for c in range(width):
                    same &= out[target + c] == table[source + c]
                if not same:
                    for c in range(width):
                        out[target + c] = table[source + c]
                    if moved.shape[0]:
                        moved[b] = True
    undecided = 0
    for r in range(rows):  # a pass of selects, which vectorises
        won = hits[r] == 1
        row[r] = columns[r] if won else -1
        undecided += np.int64(not won)
    return undecided


@kernel(inline="always", nogil=True)
def _share(worker, workers, total):
    # The items of slot `worker` among `workers`: a contiguous run of the `total`, so that
    # neighbouring items, whose outputs (a task's sums, its `moved` flag) may share a cache
    # line, go to the same thread; dealt out one by one, two threads writing neighbours would
    # pass that line to and fro.
    per = (total + workers - 1) // workers
    return range(worker * per, min(total, (worker + 1) * per))


@kernel(inline="always", nogil=True)
def _tile(t, chunks, chunk, m):
    # Tile number t, of `chunks` tiles per task: its task, first query and number of queries.
    b = t // chunks
    lo = (t - b * chunks) * chunk
    return b, lo, min(m, lo + chunk) - lo


@kernel(parallel=True, nogil=True)
def _argmax_tiles(q, q_strides, B, m, d, keys, a, bk, reach, bounds, exact, index, skip, chunk, workers, tally, write):
    # Each of `workers` slots takes a run of tiles of `chunk` queries (_share), with scratch space
    # of its own (many small tasks make many small tiles) and its own partial sums if there are
    # several (see argmax_dot): a tile's logits, made and reduced while they are in cache (the
    # logits of a whole block, as PyTorch would build them, go out to memory and back), its
    # verdict, then what follows of it (_settle). Keys (B, n, d) of as many coordinates as the
    # queries have their scores summed here (_direct_logits), and a tile's task's key terms
    # taken when the slot reaches it: one pass over n × d keys beside the tile's rows × n × d
    # products, and no call of its own. Keys (B, n, d + 1) hold the bias b ‖k‖² as their last
    # coordinate and reach (B,) their tasks' largest norms: a tile's logits are one BLAS product
    # (_gemm_logits). The queries come as flat unit-stride rows (see _flat).
    n = keys.shape[1]
    direct = keys.shape[2] == d
    chunks = (m + chunk - 1) // chunk
    parts = tally[3].shape[0] // max(1, B * n)
    undecided = np.zeros(workers, np.int64)
    for worker in prange(workers):
        part = worker if parts > 1 else 0
        space = _tile_scratch(chunk, d, n if direct else 0, q.dtype)
        bias, hits, columns = space[0], space[6], space[7]
        task_reach = 0.0
        task = -1
        for t in _share(worker, workers, B * chunks):
            b, lo, rows = _tile(t, chunks, chunk, m)
            if skip[b]:
                continue
            if b != task:
                task_reach, task = _task_key_terms(keys, b, bk, bias) if direct else reach[b], b
            logits = _direct_logits(q, q_strides, keys, b, lo, rows, a, space) if direct else _gemm_logits(q, q_strides, keys, b, lo, rows, a, space)
            _verdict(q, q_strides, keys, b, lo, rows, logits, task_reach, bounds, exact, space)
            undecided[worker] += _settle(b, lo, rows, hits, columns, index, n, tally, write, part)
    return undecided.sum()


@kernel(inline="always", nogil=True)
def _tile_scratch(chunk, d, n, dtype):
    # A slot's scratch space for a tile of `chunk` queries: (the key biases (n), the tile's
    # queries times a, coordinate-major, with a last coordinate 1 for a product's bias, their
    # logits, key-major (n of them: none where a product makes them), _decide's scratch (best,
    # floor), their squared norms, margins, hits and winning columns).
    f = np.empty
    return f(n, dtype), f((d + 1, chunk), dtype), f((n, chunk), dtype), (f(chunk, dtype), f(chunk)), f(chunk), f(chunk), f(chunk, np.int32), f(chunk, np.int32)


@kernel(inline="always", nogil=True)
def _direct_logits(q, q_strides, keys, b, lo, rows, a, space):
    # The logits (key-major, in the scratch `space`) of the queries lo, ..., lo + rows − 1 of
    # task b against keys (B, n, d) whose biases are in space (_task_key_terms): for a few
    # coordinates a matrix product costs more in its own overhead than in arithmetic, so the
    # scores are summed here, key by key across the tile's queries.
    bias, scaled, logits, squares = space[0], space[1], space[2], space[4]
    d, n = keys.shape[2], keys.shape[1]
    u = np.uint64
    for i in range(rows):
        squares[i] = 0.0
    for c in range(d):
        for i in range(rows):
            x = a * q[u(b) * q_strides[0] + u(lo + i) * q_strides[1] + u(c)]
            scaled[c, i] = x
            squares[i] += np.float64(x) * np.float64(x)
    for j in range(n):
        logit = logits[j]
        for i in range(rows):
            logit[i] = bias[j]
        for c in range(d):
            w = keys[b, j, c]
            for i in range(rows):
                logit[i] += scaled[c, i] * w
    return logits


@kernel(inline="always", nogil=True)
def _gemm_logits(q, q_strides, keys, b, lo, rows, a, space):
    # The logits (key-major) of the queries lo, ..., lo + rows − 1 of task b against keys
    # (B, n, d + 1) whose last coordinate is the bias: one BLAS product with the tile of queries
    # times a (coordinate-major, as BLAS wants it), whose last coordinate 1 adds the bias.
    whole, squares = space[1], space[4]
    d = whole.shape[0] - 1
    tile = whole if rows == whole.shape[1] else np.empty((d + 1, rows), whole.dtype)
    u = np.uint64
    for i in range(rows):
        start = u(b) * q_strides[0] + u(lo + i) * q_strides[1]
        total = 0.0
        for c in range(u(d)):
            x = a * q[start + c]
            tile[c, i] = x
            total += np.float64(x) * np.float64(x)
        squares[i] = total
        tile[d, i] = 1
    return np.dot(keys[b], tile)


@kernel(inline="always", nogil=True)
def _verdict(q, q_strides, keys, b, lo, rows, logits, reach, bounds, exact, space):
    # The verdict (hits, columns in the scratch `space`: see _decide) on the queries lo, ...,
    # lo + rows − 1 of task b from their key-major logits, reach being task b's largest key norm;
    # for float32 inputs, a query inside the rounding bound is settled again in float64
    # (_exact_winner), which leaves only exact ties (and NaN) undecided.
    scratch, squares, margin, hits, columns = space[3], space[4], space[5], space[6], space[7]
    d = space[1].shape[0] - 1
    u = np.uint64
    _decide(logits, rows, squares, reach, bounds, scratch[0], scratch[1], margin, hits, columns)
    for i in range(rows):
        if exact[3] and hits[i] > 1 and margin[i] < np.inf:
            start = u(b) * q_strides[0] + u(lo + i) * q_strides[1]
            columns[i] = _exact_winner(q[start : start + u(d)], keys[b].T, exact)
            hits[i] = 1 if columns[i] >= 0 else hits[i]


@kernel(inline="always", nogil=True)
def _task_key_terms(keys, t, b, bias):
    # Task t's key biases b ‖k‖² into bias (in the keys' type, as the logits add it), and its
    # largest key norm (for the rounding bound) returned.
    top = 0.0  # the largest ‖k‖², in a local: a running maximum in memory would wait on it
    for j in range(keys.shape[1]):
        total = keys.dtype.type(0)
        for c in range(keys.shape[2]):
            total += keys[t, j, c] * keys[t, j, c]
        bias[j] = b * total
        # A key that is not finite makes the reach inf: no query of its task is decided.
        top = max(top, np.float64(total)) if total == total else np.inf
    return np.sqrt(top)


@kernel(nogil=True)
def _key_terms(keys, b):
    # Every task's key terms (_task_key_terms), one pass where PyTorch would take five.
    B, n, d = keys.shape
    bias = np.empty((B, n), keys.dtype)
    reach = np.empty(B)
    for t in range(B):
        reach[t] = _task_key_terms(keys, t, b, bias[t])
    return bias, reach


# With at most this many coordinates, scores summed inside the kernel beat a matrix product.
DIRECT_MAX_WIDTH = 8
# Queries per tile: 256 × n logits stay in a core's cache for n in the hundreds.
DIRECT_TILE = GEMM_TILE = 256


def _skipped(skip: torch.Tensor | None, B: int) -> np.ndarray:
    """A kernel's (B,) mask of the tasks it leaves out: none if not given."""
    return np.zeros(B, np.bool_) if skip is None else _array(skip)


@functools.cache
def _blas_controller():
    # The BLAS that numba's np.dot calls (SciPy's), which must run one thread per tile: the
    # kernel's own threads already share the tiles, and nested BLAS threads oversubscribe the CPU.
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library the controller must see)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class Winners(NamedTuple):
    """What :func:`argmax_dot` finds: per query ``(B, m)``, the index of the key it wins outright,
    or −1 where it has no clear winner (close rivals, a NaN), and how many such queries there
    are; if it was given values ``(B, m, f)``, the sums ``(B, n, f)`` and numbers ``(B, n)``
    of the value rows of the queries that each key wins; and if it was asked to track them while
    it gathers rows, ``moved`` ``(B,)``: whether any row it gathered into a task's ``out`` differed
    from the row there, in any bit."""

    index: torch.Tensor
    undecided: int
    sums: torch.Tensor | None = None
    sizes: torch.Tensor | None = None
    moved: torch.Tensor | None = None


@functools.cache
def _limits(dtype: np.dtype) -> tuple[float, float]:
    """The machine epsilon and largest number of a float type (np.finfo, which takes a while)."""
    info = np.finfo(dtype)
    return float(info.eps), float(info.max)


def _rounding(d: int, a: float, b: float, dtype: np.dtype) -> tuple[tuple, tuple]:
    """The arg-max kernels' rounding bounds for logits ``a (q·k) + b ‖k‖²`` over ``d``
    coordinates of ``dtype``: ``bounds`` (see _slack) and ``exact`` (see _exact_winner)."""
    # eps = 2u; no partial sum of a logit overflows where its bound stays below a quarter of
    # the largest float.
    eps, top = _limits(dtype)
    bounds = (2 * (d + 3) * eps, abs(float(b)), top / 4)
    # Near ties of float32 logits are settled in float64 (_exact_winner); float64 ones go to the caller.
    exact = (float(a), float(b), 2 * (d + 3) * _limits(np.dtype(np.float64))[0], dtype == np.float32)
    return bounds, exact


# Stands in for the rows of an output that is never read.
_NOTHING = (np.zeros(1), np.zeros(2, np.uint64))


def _tally(values: torch.Tensor | None, parts: int, B: int, n: int, dtype: np.dtype) -> tuple[tuple, np.ndarray, np.ndarray]:
    """_settle's ``tally`` for sums, by winner, of ``values`` (B, m, f) in ``parts`` sets of
    partial sums (none without values), and those sums (parts·B·n·f) and numbers (parts·B·n)."""
    f = 0 if values is None else values.shape[-1]
    sums = np.zeros(parts * B * n * f, dtype=dtype)
    sizes = np.zeros(parts * B * n, dtype=dtype)
    rows = _flat(values) if f else (_NOTHING[0].astype(dtype), _NOTHING[1])
    return (*rows, sums, sizes), sums, sizes


def _write(gather: tuple[torch.Tensor, torch.Tensor] | None, dtype: torch.dtype, moved: torch.Tensor, known: bool = False) -> tuple:
    """_settle's ``write``: (table, its strides, out, its strides and width, moved by task,
    whether the index comes known), as bits, for ``gather=(table, out)``; width 0 (nothing
    written) without one."""
    bits = np.dtype(f"u{dtype.itemsize}")
    if gather is None or not gather[1].numel():
        return (_NOTHING[0].astype(bits), _NOTHING[1], np.zeros(1, bits), np.zeros(3, np.uint64), moved.numpy(), False)
    table, out = gather
    if out.stride(-1) != 1 and out.shape[-1] > 1:
        raise ValueError("argmax_dot writes rows whose coordinates are contiguous")
    if table.dtype != out.dtype or table.dtype != dtype:
        raise ValueError(f"argmax_dot gathers rows of the keys' dtype {dtype}, got {table.dtype} into {out.dtype}")
    (rows, row_strides), (target, strides) = _flat(table), _flat(out)
    return (rows.view(bits), row_strides, target.view(bits), np.array([*strides, out.shape[-1]], dtype=np.uint64), moved.numpy(), known)


def argmax_dot(
    q: torch.Tensor,
    k: torch.Tensor,
    a: float,
    b: float,
    values: torch.Tensor | None = None,
    gather: tuple[torch.Tensor, torch.Tensor] | None = None,
    skip: torch.Tensor | None = None,
    track_moved: bool = False,
    known: torch.Tensor | None = None,
) -> Winners:
    """The arg-max over keys of the logits ``a (q·k) + b ‖k‖²`` for queries ``q`` (B, m, d) and
    keys ``k`` (B, n, d), without building them: each thread sums one tile of queries at a time
    and reduces it while it is in cache. All of B, m, n and d must be at least 1.

    A query is decided only if its best key wins by more than a bound on how far two roundings
    of the logits may differ (sums in another order, BLAS or PyTorch): a winner that any
    rounding of these logits agrees on. A query with a rival inside that bound (an exact tie, a
    duplicate key) or a NaN gets index −1 and is for the caller to decide, e.g. through the
    map as on the plain path.

    In the same pass, for the decided queries: with ``values`` (B, m, f), their value rows are
    summed by winning key (a cluster's sum and size); with ``gather=(table, out)``,
    ``out[b, i] = table[b, winner]`` as in :func:`gather_rows` (other rows are left as they are),
    and with ``track_moved``, ``moved[b]`` tells whether that changed any row of task b: a step
    that leaves a task's assignments as they were is how a caller sees that it has converged.

    ``skip`` (B,) bool: tasks left out altogether (a converged task, whose rows would come out
    as they are): their index rows are left unset (and count as neither decided nor
    undecided), their sums are zero, nothing of theirs is written, and they have not moved.

    ``known`` (B, m) int64, with ``gather``: for each query, the key whose table row its ``out``
    row holds, or −1 where that is not known — the index of an earlier call on this very ``out``
    and a table unchanged since, which nothing else has written. A query that wins that key
    again is not compared: its row stays as it is, unread. The index is written into ``known``
    (and returned), ready for the next call.
    """
    B, m, d = q.shape
    n = k.shape[1]
    if known is not None and (known.shape != (B, m) or known.dtype != torch.int64 or not known.is_contiguous()):
        raise ValueError(f"argmax_dot's known index must be a contiguous int64 tensor of shape {(B, m)}")
    index = torch.empty(B, m, dtype=torch.int64) if known is None else known
    keys = _array(k)
    dtype = keys.dtype
    bounds, exact = _rounding(d, a, b, dtype)
    direct = d <= DIRECT_MAX_WIDTH
    tile = DIRECT_TILE if direct else GEMM_TILE
    chunks = -(-m // tile)
    # Tiles are dealt to slots, one slot per thread: a task of one tile sums into its own
    # rows of the sums, and large tasks spread over several slots sum into partial sums per
    # slot, added up in slot order at the end: which thread ran a slot never changes a result.
    threads = _thread_count(B * m * n * d)
    slots = min(B * chunks, threads)
    parts = 0 if values is None else 1 if chunks == 1 else slots
    f = 0 if values is None else values.shape[-1]
    tally, sums, sizes = _tally(values, parts, B, n, dtype)
    tracking = gather is not None and track_moved
    moved = torch.zeros(B if tracking else 0, dtype=torch.bool)
    write = _write(gather, k.dtype, moved, known is not None)
    a, b = dtype.type(a), dtype.type(b)
    if direct:  # the key terms are taken in the kernel; contiguous keys, which a product would want
        keys, reach, blas = np.ascontiguousarray(keys), np.empty(0), contextlib.nullcontext()
    else:  # the bias rides as the keys' last coordinate
        bias, reach = _key_terms(keys, b)
        keys, blas = np.concatenate([keys, bias[..., None]], axis=-1), _blas_controller().limit(limits=1, user_api="blas")
    with blas, _using(threads):
        undecided = _argmax_tiles(*_flat(q), B, m, d, keys, a, b, reach, bounds, exact, index.numpy(), _skipped(skip, B), tile, slots, tally, write)
    moved = moved if tracking else None
    if values is None:
        return Winners(index, int(undecided), moved=moved)
    sums, sizes = sums.reshape(parts, B, n, f), sizes.reshape(parts, B, n)
    if parts > 1:
        sums, sizes = sums.sum(axis=0), sizes.sum(axis=0)
    return Winners(index, int(undecided), torch.from_numpy(sums.reshape(B, n, f)), torch.from_numpy(sizes.reshape(B, n)), moved)


# --- key sums over sparse keys ----------------------------------------------------------------


@kernel(parallel=True, nogil=True)
def _sparse_key_sums(keys, key_strides, values, value_strides, B, R, e, f, kv, mass, budget):
    # keys[b, r, j] is keys[b * key_strides[0] + r * key_strides[1] + j] (likewise the values):
    # flat unit-stride rows, which LLVM vectorises where a strided 3-D view is not. Each task's
    # rows are split into len(kv) runs, each summed into its own partial sums; a run stops once
    # it has met more than `budget` non-zeros (the keys are not sparse).
    split = kv.shape[0]
    step = (R + split - 1) // split
    u = np.uint64
    dense = np.zeros(B * split, np.bool_)
    for t in prange(B * split):
        b = t // split
        s = t - b * split
        sums = kv[s, b]
        counts = mass[s, b]
        seen = 0
        for r in range(s * step, min(R, (s + 1) * step)):
            start = u(b) * key_strides[0] + u(r) * key_strides[1]
            row = keys[start : start + e]
            start = u(b) * value_strides[0] + u(r) * value_strides[1]
            value = values[start : start + f]
            hits = 0
            column = 0
            for j in range(e):  # the count and (if one) the column of the non-zeros, vectorised
                hit = np.int64(row[j] != 0)
                hits += hit
                column += hit * j
            seen += hits
            if seen > budget:
                dense[t] = True
                break
            for j in range(column, column + 1) if hits == 1 else range(e if hits else 0):
                w = row[j]
                if w != 0:
                    counts[j] += w
                    acc = sums[j]
                    for c in range(f):
                        acc[c] += w * value[c]
    return not dense.any()


def _flat(t: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A (B, R, e) tensor as one flat array from its first element to its last, and its two outer
    strides: zero-copy when its rows are contiguous."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    (B, R, e), (outer, row, step) = t.shape, t.stride()
    span = (B - 1) * outer + (R - 1) * row + (e - 1) * step + 1
    return _array(torch.as_strided(t, (span,), (1,))), np.array((outer, row), dtype=np.uint64)


def add_sparse_key_sums(k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, mass: torch.Tensor) -> bool:
    """Add ``Σᵢ kᵢ vᵢᵀ`` to ``kv`` (B, e, f) and ``Σᵢ kᵢ`` to ``mass`` (B, e) for keys ``k``
    (B, n, e) and values ``v`` (B, n, f), visiting only the keys' non-zeros. Returns False, and
    adds nothing, if the keys hold more than two non-zeros per row on average: a dense product is
    then the faster way."""
    B, n, e = k.shape
    if B * n == 0:
        return True
    if e == 0 or v.shape[-1] == 0:  # nothing to vectorise over: the product handles it
        return False
    # Tasks are summed in parallel; a task's rows are split only where there are fewer tasks than threads.
    threads = _thread_count(B * n * e)
    split = max(1, min(n, -(-threads // B)))
    partial_kv = np.zeros((split, *kv.shape), dtype=_array(kv).dtype)
    partial_mass = np.zeros((split, *mass.shape), dtype=_array(mass).dtype)
    budget = 2 * (-(-n // split))
    keys, key_strides = _flat(k)
    values, value_strides = _flat(v)
    with _using(threads):
        sparse = _sparse_key_sums(keys, key_strides, values, value_strides, B, n, e, v.shape[-1], partial_kv, partial_mass, budget)
    if not sparse:
        return False
    kv.add_(torch.from_numpy(partial_kv.sum(axis=0)))
    mass.add_(torch.from_numpy(partial_mass.sum(axis=0)))
    return True


# --- linear attention over keys summed by cluster ---------------------------------------------


@kernel(parallel=True, nogil=True)
def _cluster_attention(q, keys, sums, sizes, own, out, skip, workers):
    # Per task: kv = Σ_r keys_r sums_rᵀ and mass = Σ_r keys_r sizes_r, summed as the batched
    # product sums them (over r, in order); then each query's q·kv / q·mass. Zero weights are
    # skipped, as in _sparse_key_sums: the keys and queries of the hand-built center update are
    # one-hot, and most of a product over them would add zeros. The task's keys are
    # read before any of its rows is written, and each row is read before it is written: out may
    # be the very rows that own (or q) reads. Each of `workers` slots takes a run of tasks
    # (_share), with scratch space of its own (an allocation per task would cost more than its sums).
    B, e, f = q.shape[0], q.shape[2], sums.shape[2]
    for worker in prange(workers):
        kv = np.empty((e, f), sums.dtype)
        mass = np.empty(e, sums.dtype)
        numerator = np.empty(f, sums.dtype)
        for b in _share(worker, workers, B):
            if not skip[b]:
                _attend_clusters(q, keys, sums, sizes, own, out, b, kv, mass, numerator)


@kernel(inline="always", nogil=True)
def _attend_clusters(q, keys, sums, sizes, own, out, b, kv, mass, numerator):
    # _cluster_attention of task b, in the scratch space kv (e, f), mass (e) and numerator (f).
    m, e = q.shape[1], q.shape[2]
    r, f = sums.shape[1], sums.shape[2]
    kv[:] = 0
    mass[:] = 0
    for j in range(r):
        for o in range(e):
            w = keys[b, j, o]
            if w != 0:
                mass[o] += w * sizes[b, j]
                for c in range(f):
                    kv[o, c] += w * sums[b, j, c]
    for i in range(m):
        total = sums.dtype.type(0)
        for c in range(f):
            numerator[c] = 0
        for o in range(e):
            x = q[b, i, o]
            if x != 0:
                total += x * mass[o]
                for c in range(f):
                    numerator[c] += x * kv[o, c]
        for c in range(f):
            # No key matches: the query keeps its own value (an empty cluster stays).
            out[b, i, c] = numerator[c] / total if total != 0 else numerator[c] + own[b, i, c]


def cluster_attention(
    q: torch.Tensor, keys: torch.Tensor, sums: torch.Tensor, sizes: torch.Tensor, own: torch.Tensor, out: torch.Tensor, skip: torch.Tensor | None = None
) -> None:
    """Normalized linear attention of queries ``q`` (B, m, e) over keys that take one of a few
    values, given by cluster: ``keys`` (B, r, e), and the sums ``sums`` (B, r, f) and numbers
    ``sizes`` (B, r) of the values of each cluster's members. ``out[b, i]`` (B, m, f) becomes
    ``q·Σ_r keys_r sums_rᵀ / q·Σ_r keys_r sizes_r``, or ``own[b, i]`` (plus the numerator) where
    no key matches. One pass per task, where PyTorch takes two batched products for the key sums,
    two for the queries and a division; ``out`` may overlap ``own`` row for row. Tasks marked
    in ``skip`` (B,) are left as they are."""
    if out.numel():
        threads = _thread_count(q.numel() + keys.numel() + sums.numel())
        workers = min(q.shape[0], threads)
        with _using(threads):
            _cluster_attention(_array(q), _array(keys), _array(sums), _array(sizes), _array(own), _array(out), _skipped(skip, q.shape[0]), workers)


# --- every step of a hard-assignment layer, task by task -------------------------------------


@kernel(inline="always", nogil=True)
def _record(read, b, trajectory, first, last):
    # trajectory[b, t] = read[b] for t = first, ..., last − 1: task b's centers after step t.
    for t in range(first, last):
        for j in range(read.shape[1]):
            for c in range(read.shape[2]):
                trajectory[b, t, j, c] = read[b, j, c]


@kernel(inline="always", nogil=True)
def _stops(shift, bound, eps):
    # Whether a task stops at a squared center shift `shift`, summed in float64, against its
    # bound: within a relative eps of the bound the sum in the tensors' dtype
    # (core.host.squared_shift) may fall on either side. 0 stops, 1 goes on, 2 cannot tell.
    if shift * (1.0 + eps) <= bound:
        return 0
    return 1 if shift * (1.0 - eps) > bound else 2


@kernel(inline="always", nogil=True)
def _shift_verdict(trajectory, b, s, stop):
    # _stops of task b after step s, against stop = (the bounds, ε).
    shift = 0.0
    for j in range(trajectory.shape[2]):
        for c in range(trajectory.shape[3]):
            gap = np.float64(trajectory[b, s, j, c]) - np.float64(trajectory[b, s - 1, j, c])
            shift += gap * gap
    return _stops(shift, stop[0][b], stop[1])


def _shift_rounding(width: int, dtype: np.dtype) -> float:
    """The relative ε of :func:`_stops` for shifts summed over ``width`` numbers: a sum of that
    many squared gaps in ``dtype`` is within (width + 2) units of its roundoff of the exact sum,
    as the float64 sum is of its own; ε covers both, twice."""
    return (width + 3) * _limits(dtype)[0]


@kernel(parallel=True, nogil=True)
def _hard_steps(q, q_strides, B, m, keys, a, bk, bounds, exact, index, tally, write, update, trajectory, state, stop, steps, workers):
    # hard_steps: each task on its own, step after step, in one tile of _direct_logits; each of
    # `workers` slots takes a run of tasks (_share), with scratch space of its own.
    n, d = keys.shape[1], keys.shape[2]
    cq, ckeys, own, out, read = update
    at, settled, n_iter, stopped, doubt = state
    flat_sums, flat_sizes, moved = tally[2], tally[3], write[4]
    f = out.shape[2]
    sums, sizes = flat_sums.reshape(B, n, f), flat_sizes.reshape(B, n)
    for worker in prange(workers):
        space = _tile_scratch(m, d, n, q.dtype)
        bias, hits = space[0], space[6]
        kv = np.empty((cq.shape[2], f), out.dtype)
        mass = np.empty(cq.shape[2], out.dtype)
        numerator = np.empty(f, out.dtype)
        before = np.empty((1, out.shape[1], f), out.dtype)
        for b in _share(worker, workers, B):
            s = at[b]
            while s < steps and not settled[b]:
                reach = _task_key_terms(keys, b, bk, bias)
                _verdict(q, q_strides, keys, b, 0, m, _direct_logits(q, q_strides, keys, b, 0, m, a, space), reach, bounds, exact, space)
                clear = True
                for i in range(m):
                    clear &= hits[i] == 1
                if not clear:  # a query without a clear winner: the layer's map decides this step
                    stopped[b] = True
                    break
                for x in range(b * n * f, (b + 1) * n * f):
                    flat_sums[x] = 0
                for x in range(b * n, (b + 1) * n):
                    flat_sizes[x] = 0
                moved[b] = False
                _settle(b, 0, m, hits, space[7], index, n, tally, write, 0)
                for j in range(out.shape[1]):
                    for c in range(f):
                        before[0, j, c] = out[b, j, c]
                _attend_clusters(cq, ckeys, sums, sizes, own, out, b, kv, mass, numerator)
                changed = moved[b] or _differs(out, b, before, 0)
                s += 1
                _record(read, b, trajectory, s, s + 1)
                verdict = _shift_verdict(trajectory, b, s, stop) if stop[0].shape[0] else 1
                doubt[b] = doubt[b] or verdict == 2
                if not changed or verdict == 0:  # the task is done: left as it was, or within its bound
                    settled[b] = True
                    n_iter[b] = s
            if not stopped[b]:
                _record(read, b, trajectory, s + 1, steps + 1)
                s = steps
            at[b] = s


def hard_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    a: float,
    b: float,
    values: torch.Tensor,
    gather: tuple[torch.Tensor, torch.Tensor],
    update: tuple[torch.Tensor, ...],
    trajectory: torch.Tensor,
    at: torch.Tensor,
    settled: torch.Tensor,
    n_iter: torch.Tensor,
    bound: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps of the hard-assignment layer that :mod:`ktframe.fast.steps` describes, each task
    taken through all of its steps at once, for tasks of at most ``DIRECT_TILE`` points in at
    most ``DIRECT_MAX_WIDTH`` coordinates; every argument is a view of the layer's streams,
    which change in place. A step is :func:`argmax_dot` of queries ``q`` (B, m, d) over keys
    ``k`` (B, n, d) with ``values`` and ``gather``, as one tile, then :func:`cluster_attention`
    of ``update = (q, keys, own, out, read)`` over its sums, tracking as the layer does whether
    it changed the task; ``read`` (B, n, e): the centers that ``trajectory`` (B, steps + 1, n, e)
    records after each step.

    Task b starts at step ``at[b]`` (int64); a step that leaves it as it was marks it in
    ``settled`` (bool) and sets ``n_iter[b]`` (int64) to its number, and so does, given
    ``bound`` (B,), a step whose squared center shift is surely within ``bound[b]``, as
    :func:`ktframe.core.host.squared_shift` rounds it; a settled task, or one out of steps, has
    the rest of its trajectory filled and ``at[b] = steps``. Returns ``stopped`` (B,) bool: the
    tasks stopped at a step with a query without a clear winner, left as they were before it,
    ``at[b]`` that step, for the caller to take through it; and ``doubt`` (B,) bool: the tasks
    with a step whose shift lies too near ``bound`` to tell, which went on, for the caller to
    decide."""
    B, m, d = q.shape
    n = k.shape[1]
    dtype = _array(k).dtype
    bounds, exact = _rounding(d, a, b, dtype)
    tally, _, _ = _tally(values, 1, B, n, dtype)
    moved = torch.zeros(B, dtype=torch.bool)
    stopped = torch.zeros(B, dtype=torch.bool)
    doubt = torch.zeros(B, dtype=torch.bool)
    state = (_array(at), _array(settled), _array(n_iter), stopped.numpy(), doubt.numpy())
    stop = (np.empty(0) if bound is None else bound.double().numpy(), _shift_rounding(trajectory.shape[2] * trajectory.shape[3], _array(trajectory).dtype))
    threads = _thread_count(B * m * n * d)
    with _using(threads):
        _hard_steps(
            *_flat(q), B, m, _array(k), dtype.type(a), dtype.type(b), bounds, exact, np.empty((B, m), np.int64), tally, _write(gather, k.dtype, moved),
            tuple(_array(t) for t in update), _array(trajectory), state, stop, trajectory.shape[1] - 1, min(B, threads),
        )  # fmt: skip
    return stopped, doubt


@kernel(nogil=True)
def _shifts_beyond(before, after, bound, eps, skip):
    for b in range(before.shape[0]):
        if not skip[b]:
            shift = 0.0
            for j in range(before.shape[1]):
                for c in range(before.shape[2]):
                    gap = np.float64(after[b, j, c]) - np.float64(before[b, j, c])
                    shift += gap * gap
            if _stops(shift, bound[b], eps) != 1:
                return False
    return True


def shifts_beyond(before: torch.Tensor, after: torch.Tensor, bound: torch.Tensor, skip: torch.Tensor | None = None) -> bool:
    """Whether every task's squared center shift ``Σ (after − before)²`` (centers (B, k, e) each)
    is surely beyond its ``bound`` (B,) float64, as :func:`ktframe.core.host.squared_shift` rounds
    it in the centers' dtype, the tasks marked in ``skip`` (B,) left out. One call on the calling
    thread, where the shift, the comparison and the reduction would be three: after a step's
    pass over the points, each costs more than its handful of numbers. False where some task
    may stop: the exact comparison decides it."""
    width = before.shape[1] * before.shape[2]
    return _shifts_beyond(_array(before), _array(after), _array(bound), _shift_rounding(width, _array(before).dtype), _skipped(skip, before.shape[0]))


# --- gathering value rows ---------------------------------------------------------------------


@kernel(parallel=True, nogil=True)
def _gather_rows(table, table_strides, index, out, out_strides, B, m, e):
    u = np.uint64
    for t in prange(B * m):
        b = t // m
        i = t - b * m
        if index[b, i] < 0:
            continue
        start = u(b) * table_strides[0] + u(index[b, i]) * table_strides[1]
        source = table[start : start + e]
        start = u(b) * out_strides[0] + u(i) * out_strides[1]
        target = out[start : start + e]
        for c in range(e):
            target[c] = source[c]


def gather_rows(table: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """``out[b, i] = table[b, index[b, i]]`` for ``table`` (B, n, e), ``index`` (B, m) and ``out``
    (B, m, e), which may be a view into a larger tensor (rows of a token stream's slot): one pass,
    where PyTorch gathers into a new tensor and copies that. Rows of negative index are left as
    they are."""
    B, m, e = out.shape
    if out.stride(-1) != 1 and e > 1:
        raise ValueError("gather_rows writes rows whose coordinates are contiguous")
    if out.numel() == 0:
        return
    values, value_strides = _flat(table)
    target, target_strides = _flat(out)
    with _using(_thread_count(out.numel())):
        _gather_rows(values, value_strides, _array(index), target, target_strides, B, m, e)


# --- the k-means objective of given labels ---------------------------------------------------------

# Rows of one task that a slot sums at a time (the objective, the deviations): enough to spread
# one large task over the threads.
INERTIA_ROWS = 4096


@kernel(parallel=True, nogil=True)
def _inertia(X, C, labels, totals, chunks, workers):
    # totals[slot, b] = Σ ‖X[b, i] − C[b, labels[b, i]]‖² over the rows of task b in the slot's
    # run of (task, block of INERTIA_ROWS rows) items, in float64. A slot's partial sums are its
    # own, added up in slot order by the caller: which thread ran a slot never changes a result.
    B, m, d = X.shape
    for worker in prange(workers):
        for item in _share(worker, workers, B * chunks):
            b, lo, rows = _tile(item, chunks, INERTIA_ROWS, m)
            total = 0.0
            for i in range(lo, lo + rows):
                j = labels[b, i]
                for c in range(d):
                    diff = np.float64(X[b, i, c]) - np.float64(C[b, j, c])
                    total += diff * diff
            totals[worker, b] += total


def inertia(X: torch.Tensor, C: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64: Σᵢ ‖X[b, i] − C[b, labels[b, i]]‖² of every task, for points ``X``
    (B, m, d), centers ``C`` (B, n, d) and labels ``labels`` (B, m) in ``0 … n − 1``: one pass
    over the points, summed in float64, where PyTorch gathers the labels' centers (an index as
    large as X) and takes three more passes."""
    B, m, d = X.shape
    chunks = -(-m // INERTIA_ROWS)
    threads = _thread_count(X.numel())
    workers = min(B * chunks, threads)
    totals = np.zeros((workers, B))
    with _using(threads):
        _inertia(_array(X), _array(C), _array(labels), totals, chunks, workers)
    return torch.from_numpy(totals.sum(axis=0))


@kernel(parallel=True, nogil=True)
def _deviation_sums(X, mean, totals, chunks, workers):
    # Per slot and task, over the rows of the slot's run of (task, block of INERTIA_ROWS rows)
    # items, in float64: with an empty mean, the sums of the coordinates, totals[slot, b] (d);
    # else the sum of the squared deviations X − mean[b], each taken in X's dtype,
    # totals[slot, b, 0]. Added up in slot order by the caller, as _inertia's.
    B, m, d = X.shape
    for worker in prange(workers):
        for item in _share(worker, workers, B * chunks):
            b, lo, rows = _tile(item, chunks, INERTIA_ROWS, m)
            if mean.shape[0] == 0:
                for c in range(d):  # a coordinate at a time, its sum kept in a register
                    total = 0.0
                    for i in range(lo, lo + rows):
                        total += X[b, i, c]
                    totals[worker, b, c] += total
            else:
                total = 0.0
                for i in range(lo, lo + rows):
                    for c in range(d):
                        gap = np.float64(X[b, i, c] - mean[b, c])
                        total += gap * gap
                totals[worker, b, 0] += total


def mean_square_deviation(X: torch.Tensor) -> torch.Tensor:
    """:func:`ktframe.core.host.mean_square_deviation` (``(B,)``, X's dtype: the mean over each
    task's points and coordinates of the squared deviation from its mean point) in two passes
    over ``X`` (B, m, d): the same arithmetic, its float64 sums in another order."""
    B, m, d = X.shape
    array = _array(X if X.is_contiguous() else X.contiguous())
    chunks = -(-m // INERTIA_ROWS)
    threads = _thread_count(X.numel())
    workers = min(B * chunks, threads)
    totals = np.zeros((workers, B, d))
    with _using(threads):
        _deviation_sums(array, np.empty((0, d), array.dtype), totals, chunks, workers)
        mean = (totals.sum(axis=0) / m).astype(array.dtype)
        totals[:] = 0
        _deviation_sums(array, mean, totals, chunks, workers)
    return torch.from_numpy((totals[..., 0].sum(axis=0) / (m * d)).astype(array.dtype))


# --- which tasks changed ----------------------------------------------------------------------


@kernel(nogil=True)
def _tasks_changed(a, b, changed):
    for t in range(a.shape[0]):
        changed[t] = _differs(a, t, b, t)


@kernel(inline="always", nogil=True)
def _differs(a, s, b, t):
    # Whether task s of a and task t of b, (m, e) each, differ in any number (a NaN is a
    # change), read up to the first difference.
    for i in range(a.shape[1]):
        for c in range(a.shape[2]):
            if not a[s, i, c] == b[t, i, c]:
                return True
    return False


def tasks_changed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """For two CPU tensors ``(B, m, e)`` of the same shape: ``(B,)``, for each task whether any
    of its numbers differs between them (a NaN counts as a change), read up to its first change."""
    changed = torch.zeros(a.shape[0], dtype=torch.bool)
    _tasks_changed(_array(a), _array(b), changed.numpy())
    return changed
