"""All the steps of Lloyd's hand-built layer in one kernel call, for many small tasks.

The fast model (:class:`~ktframe.fast.model.ModelPlan`) runs its layers step by step, each step a
few kernel calls with Python's work around them. For many small tasks (a thousand of a hundred
points, say) that work costs as much as the kernels'. Where every step is one and the same layer
that makes its hard assignment by cluster (:meth:`LayerPlan.assign
<ktframe.fast.model.LayerPlan.assign>`: the point update an arg-max head whose slot is reset, the
center update normalized linear attention over the assignments' cluster sums, its slot reset),
that reads its streams through plain views (:func:`fits`, which its plan's ``all_steps`` records),
and each task fits in one tile of the arg-max kernel, :func:`ktframe.kernels.cpu.hard_steps` takes
each task through all of its steps at once: the arithmetic of the layer's own steps, in the same
order, so the result is the same bit for bit (``tests/test_steps.py``). A task with a query
without a clear winner, which the layer's map decides, takes the rest of its steps through the
layer, one by one, the other tasks skipped.
"""

from __future__ import annotations

import torch
from torch import nn

from ktframe.kernels import cpu as kernels
from ktframe.transformer.model import Layer, Select


def _view(projection: nn.Module) -> bool:
    """Whether a projection gives a view of its tokens (a run of coordinates, unscaled)."""
    return isinstance(projection, Select) and projection.span is not None and projection.unit


def fits(layer: Layer) -> bool:
    """Whether ``kernels.hard_steps`` computes a step of ``layer``, whose heads are planned and
    whose hard assignment runs by cluster, reading the centers' keys off their stream: no
    feed-forward block or center norm, the center update and its reset writing one slot, every
    projection of the two heads a view, and points of few coordinates."""
    cross, reset, update = layer.point_cross, layer.center_self, layer.center_cross
    return (
        layer.center_ffn is None
        and isinstance(layer.center_norm, nn.Identity)
        and all(_view(p) for p in (cross.q, cross.k, cross.v, update.q, update.k, update.v))
        and len(cross.q.sources) <= kernels.DIRECT_MAX_WIDTH
        and reset.plan.rescale == 0.0
        and reset.slot == update.slot
        and update.slot.stop - update.slot.start == len(update.v.sources)
    )


def _applies(points: torch.Tensor, centers: torch.Tensor, read: torch.Tensor) -> bool:
    """Whether ``kernels.hard_steps`` takes these streams: every array it reads a view that the
    steps update in place, and tasks of one arg-max tile."""
    B, m, _ = points.shape
    return (
        min(B, m, centers.shape[1]) > 0
        and m <= kernels.DIRECT_TILE
        and points.is_contiguous()
        and centers.is_contiguous()
        and kernels.usable(points, centers)
        and points.shape[-1] == centers.shape[-1]
        and read.stride(-1) == 1
        and read._base is centers
    )


def run(
    layer: Layer, points: torch.Tensor, centers: torch.Tensor, read: torch.Tensor, steps: int, bound: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``steps`` steps of ``layer`` (whose plan has ``all_steps``) on the streams ``points``
    (B, m, w) and ``centers`` (B, n, w), in place, each task left as it is once a step has left it
    as it was (as the model's plan does), or, given ``bound`` (B,), once a step has shifted its
    centers surely within it (:func:`ktframe.kernels.cpu.hard_steps`): the trajectory
    (B, steps + 1, n, e) of the centers ``read`` (a view of the center stream), each task's
    ``n_iter``, and the tasks for which that was not decided (a shift too near the bound, or
    steps taken by the layer itself), which the caller cuts short where its own rule says so.
    None, with nothing done, where it does not apply."""
    if not _applies(points, centers, read):
        return None
    cross, update = layer.point_cross, layer.center_cross
    k, v = cross.plan.project(cross, centers)
    a, b = cross.score.dot_product_form(cross.gamma)
    views = (update.q(centers), update.k(centers), update.v(centers), centers[..., update.slot], read)
    B = points.shape[0]
    trajectory = centers.new_empty(B, steps + 1, *read.shape[1:])
    trajectory[:, 0] = read
    at = torch.zeros(B, dtype=torch.long)
    settled = torch.zeros(B, dtype=torch.bool)
    n_iter = torch.full((B,), steps, dtype=torch.long)

    def kernel() -> tuple[torch.Tensor, torch.Tensor]:
        return kernels.hard_steps(cross.q(points), k, a, b, update.v(points), (v, points[..., cross.slot]), views, trajectory, at, settled, n_iter, bound)

    stopped, doubt = kernel()
    if not bool(stopped.any()):
        return trajectory, n_iter, doubt
    # The tasks stopped at a query without a clear winner go on through the layer's own steps
    # (a tie tends to come back in the same task), each step skipping the other tasks and marking
    # in `left` those that it left as they were.
    while bool((active := (at < steps) & ~settled).any()):
        left = ~active
        layer.plan.forward(layer, points, centers, settled=left)
        tasks = active.nonzero().squeeze(1)
        step = at[tasks] + 1
        trajectory[tasks, step] = read[tasks]
        done = left[tasks]
        n_iter[tasks[done]] = step[done]
        settled[tasks[done]] = True
        at[tasks] = step
    kernel()  # no step left to take: the trajectories of the tasks settled above are filled in
    return trajectory, n_iter, doubt | stopped
