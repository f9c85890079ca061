"""Whole-array work on the CPU done by NumPy, on the calling thread, instead of PyTorch.

A PyTorch CPU operation on more than about 32 000 numbers runs on PyTorch's OpenMP threads, which
then spin for several milliseconds waiting for more work. The kernels that a step launches next
(numba's workqueue threads, :mod:`ktframe.kernels.cpu`) need those same cores: a fit whose inputs
were just checked and embedded by PyTorch runs its first kernels at half speed. The few whole-array
operations made once per call before the kernels (a range check, the zero-padded token stream, a
fill) are made here instead, where NumPy can make them; elsewhere they are PyTorch's.
"""

from __future__ import annotations

import numpy as np
import torch

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)


def by_numpy(*tensors: torch.Tensor) -> bool:
    """Whether NumPy can do the work on these tensors: on the CPU, of a dtype NumPy shares, and
    with no gradient to record."""
    grad = torch.is_grad_enabled()
    return all(t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES and not (grad and t.requires_grad) for t in tensors)


# From this many numbers on, a new array is PyTorch's: memory from NumPy's calloc costs, on first
# touch in a fresh process, several times PyTorch's (docs/performance.md, benchmark (1)), which a
# single call that makes one large array (``ktframe cluster``) would pay, against the few
# milliseconds that PyTorch's threads spin after it.
LARGE = 1 << 24


def padded(X: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, n, width)``: ``X`` (B, n, d) in the first d coordinates and zeros after, new memory."""
    B, n, d = X.shape
    if not by_numpy(X) or B * n * width >= LARGE:
        tokens = X.new_zeros(B, n, width)
        tokens[..., :d] = X
        return tokens
    array = np.zeros((B, n, width), dtype=X.detach().numpy().dtype)  # zero pages from the system, not a fill
    array[..., :d] = X.detach().numpy()
    return torch.from_numpy(array)


def concatenated(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors side by side along their last axis (``torch.cat(tensors, dim=-1)``), new memory."""
    if not by_numpy(*tensors) or len({t.dtype for t in tensors}) > 1:
        return torch.cat(tensors, dim=-1)
    return torch.from_numpy(np.concatenate([t.detach().numpy() for t in tensors], axis=-1))


def stacked(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.stack(tensors, dim)``, new memory."""
    if not by_numpy(*tensors) or len({t.dtype for t in tensors}) > 1:
        return torch.stack(tensors, dim=dim)
    return torch.from_numpy(np.stack([t.detach().numpy() for t in tensors], axis=dim))


def filled(shape: tuple[int, ...], value: int) -> torch.Tensor:
    """An int64 CPU tensor of ``shape`` holding ``value`` everywhere."""
    return torch.from_numpy(np.full(shape, value, dtype=np.int64))


def extremes(tensor: torch.Tensor) -> tuple[float, float]:
    """The least and the largest entry of a non-empty floating tensor, NaN where one is NaN."""
    if by_numpy(tensor):
        array = tensor.detach().numpy()
        return float(array.min()), float(array.max())
    low, high = torch.aminmax(tensor)
    return low.item(), high.item()


def mean_square_deviation(X: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the mean, over the points and coordinates of each task ``X`` (B, n, d), of the
    squared deviation from the task's mean point (the mean of the coordinates' variances)."""
    if not by_numpy(X):
        return (X - X.mean(dim=1, keepdim=True)).square().mean(dim=(1, 2))
    array = X.detach().numpy()
    B, n, d = array.shape
    # einsum's loops, not BLAS (NumPy's own threads) and not a reduction over the middle axis,
    # which NumPy takes a few numbers at a time where d is small.
    deviations = (array - np.einsum("bnd->bd", array)[:, None, :] / n).reshape(B, n * d)
    return torch.from_numpy(np.einsum("bi,bi->b", deviations, deviations) / (n * d))


def squared_shift(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``Σ (after − before)²`` over the last two axes (a step's centers (k, d))."""
    if not by_numpy(before, after):
        return (after - before).square().sum(dim=(-2, -1))
    return torch.from_numpy(np.square(after.detach().numpy() - before.detach().numpy()).sum(axis=(-2, -1)))
