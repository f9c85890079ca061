"""Fused CPU loops (numba) for the hot spots of hard attention that eager PyTorch runs as many passes.

- :func:`argmax_count`: every row's arg-max and number of maximal entries, in one parallel pass
  over a block of logits (the arg-max map; eager PyTorch takes a max, a compare and a reduction).
- :func:`argmax_dot`: the same for logits ``a (q·k) + b ‖k‖²`` of few coordinates, summed on
  the spot without building them (an arg-max head over many small tasks).
- :func:`add_sparse_key_sums`: ``Σᵢ kᵢ vᵢᵀ`` and ``Σᵢ kᵢ`` over keys with few non-zeros (the
  one-hot assignments that the center update reads), touching only the non-zeros: O(nnz · f)
  instead of the O(n · e · f) dense product.
- :func:`gather_rows`: value rows picked by index, written straight into a slot of the stream.

On finite inputs they compute what their PyTorch counterparts compute (sums in another order).
They run on CPU tensors of float32 or float64 that need no gradient; :func:`usable` says when,
and ``KTFRAME_NO_KERNELS=1`` turns them off (PyTorch's own ops are used then, as on a GPU).
"""

from __future__ import annotations

import os

import numba
import numpy as np
import torch
from numba import njit, prange

OFF_ENV = "KTFRAME_NO_KERNELS"


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels apply to these tensors: CPU, float32/float64, no autograd, not turned off."""
    if os.environ.get(OFF_ENV, "") not in ("", "0"):
        return False
    grad = torch.is_grad_enabled()
    return all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) and not (grad and t.requires_grad) for t in tensors)


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# --- arg-max ----------------------------------------------------------------------------------


@njit(fastmath={"nnan", "nsz"}, cache=True, nogil=True)
def _row_max(row):
    # The maximum of numbers is the same in any order; these flags let LLVM vectorise the
    # reduction. NaNs are caught by the caller's count pass.
    best = row[0]
    for j in range(1, row.shape[0]):
        best = max(best, row[j])
    return best


@njit(cache=True, nogil=True)
def _maxima(row):
    # (sum of the columns of the maximal entries, their number; 0 if the row holds a NaN)
    best = _row_max(row)
    hits = 0
    columns = 0
    nans = 0
    for j in range(row.shape[0]):  # integer sums of compares: vectorised, unlike a first-hit search
        hit = np.int64(row[j] == best)
        hits += hit
        columns += hit * j
        nans += np.int64(row[j] != row[j])
    return columns, 0 if nans else hits


@njit(parallel=True, cache=True, nogil=True)
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
    _argmax_rows(_array(flat), index.numpy(), count.numpy())
    return count.view(logits.shape[:-1]), index.view(logits.shape[:-1])


@njit(parallel=True, cache=True, nogil=True)
def _argmax_direct(q, keys_t, bias, a, index, count, chunk):
    # The same scores with q·k summed on the spot, across the keys (keys_t is (B, d, n)): for a
    # few coordinates a matrix product costs more in its own overhead than in arithmetic. Work
    # is dealt in chunks of one task's queries.
    B, m, d = q.shape
    n = keys_t.shape[2]
    chunks = (m + chunk - 1) // chunk
    for t in prange(B * chunks):
        b = t // chunks
        lo = (t - b * chunks) * chunk
        offset = bias[b]
        keys = keys_t[b]
        queries = q[b]
        logits = np.empty(n, bias.dtype)
        for i in range(lo, min(m, lo + chunk)):
            for j in range(n):
                logits[j] = offset[j]
            for c in range(d):
                w = a * queries[i, c]
                for j in range(n):
                    logits[j] += w * keys[c, j]
            index[b, i], count[b, i] = _maxima(logits)


# With at most this many coordinates, scores summed inside the kernel beat a matrix product.
DIRECT_MAX_WIDTH = 8


def argmax_dot(q: torch.Tensor, k: torch.Tensor, a: float, b: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`argmax_count` of the logits ``a (q·k) + b ‖k‖²`` for queries ``q`` (B, m, d) and
    keys ``k`` (B, n, d), summed on the spot without building them: for few coordinates
    (d ≤ ``DIRECT_MAX_WIDTH``; with more, a matrix product and :func:`argmax_count` are faster).
    All of B, m, n and d must be at least 1."""
    B, m, d = q.shape
    index = torch.empty(B, m, dtype=torch.int64)
    count = torch.empty(B, m, dtype=torch.int64)
    bias = (k.pow(2).sum(-1) * b).contiguous()
    keys_t = k.transpose(-1, -2).contiguous()
    _argmax_direct(_array(q), _array(keys_t), _array(bias), np.dtype(_array(bias).dtype).type(a), index.numpy(), count.numpy(), 256)
    return count, index


# --- key sums over sparse keys ----------------------------------------------------------------


@njit(parallel=True, cache=True, nogil=True)
def _sparse_key_sums(keys, key_strides, values, value_strides, B, R, e, f, kv, mass, budget):
    # keys[b, r, j] is keys[b * key_strides[0] + r * key_strides[1] + j] (likewise the values):
    # flat unit-stride rows, which LLVM vectorises where a strided 3-D view is not. Each task's
    # rows are split into len(kv) runs, each summed into its own partial sums; a run stops once
    # it has met more than `budget` non-zeros (the keys are not sparse).
    split = kv.shape[0]
    step = (R + split - 1) // split
    dense = np.zeros(B * split, np.bool_)
    for t in prange(B * split):
        b = t // split
        s = t - b * split
        sums = kv[s, b]
        counts = mass[s, b]
        seen = 0
        for r in range(s * step, min(R, (s + 1) * step)):
            start = b * key_strides[0] + r * key_strides[1]
            row = keys[start : start + e]
            start = b * value_strides[0] + r * value_strides[1]
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
    span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
    return _array(torch.as_strided(t, (span,), (1,))), np.array(t.stride()[:2], dtype=np.int64)


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
    split = max(1, min(n, -(-numba.get_num_threads() // B)))
    partial_kv = np.zeros((split, *kv.shape), dtype=_array(kv).dtype)
    partial_mass = np.zeros((split, *mass.shape), dtype=_array(mass).dtype)
    budget = 2 * (-(-n // split))
    keys, key_strides = _flat(k)
    values, value_strides = _flat(v)
    if not _sparse_key_sums(keys, key_strides, values, value_strides, B, n, e, v.shape[-1], partial_kv, partial_mass, budget):
        return False
    kv.add_(torch.from_numpy(partial_kv.sum(axis=0)))
    mass.add_(torch.from_numpy(partial_mass.sum(axis=0)))
    return True


# --- gathering value rows ---------------------------------------------------------------------


@njit(parallel=True, cache=True, nogil=True)
def _gather_rows(table, table_strides, index, out, out_strides, B, m, e):
    for t in prange(B * m):
        b = t // m
        i = t - b * m
        start = b * table_strides[0] + index[b, i] * table_strides[1]
        source = table[start : start + e]
        start = b * out_strides[0] + i * out_strides[1]
        target = out[start : start + e]
        for c in range(e):
            target[c] = source[c]


def gather_rows(table: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """``out[b, i] = table[b, index[b, i]]`` for ``table`` (B, n, e), ``index`` (B, m) and ``out``
    (B, m, e), which may be a view into a larger tensor (rows of a token stream's slot): one pass,
    where PyTorch gathers into a new tensor and copies that."""
    B, m, e = out.shape
    if out.stride(-1) != 1 and e > 1:
        raise ValueError("gather_rows writes rows whose coordinates are contiguous")
    if out.numel() == 0:
        return
    values, value_strides = _flat(table)
    target, target_strides = _flat(out)
    _gather_rows(values, value_strides, _array(index), target, target_strides, B, m, e)
