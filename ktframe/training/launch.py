"""Ranks that a launcher other than Lightning's own started (``torchrun``, ``srun``) agree on
what rank 0 decides: the run id, the run folder, the checkpoint to resume from.

Lightning's own launcher re-runs the command in child processes that inherit the environment the
first process set (``ktframe.training.run``). ``torchrun`` and ``srun`` start every rank at once,
each free to choose its own id. So before anything is chosen, this joins the ranks' process group
(the one Lightning's DDP then uses: it leaves an initialised group as it is) and rank 0 hands its
choices, or its error, to the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment

from ktframe.core.errors import KtframeError

T = TypeVar("T")


def _launcher() -> ClusterEnvironment | None:
    """torchrun's or SLURM's environment when it started more than one rank; else None."""
    for kind in (TorchElasticEnvironment, SLURMEnvironment):
        if kind.detect():
            environment = kind()
            if environment.world_size() > 1:
                return environment
    return None


def _join(environment: ClusterEnvironment) -> None:
    if dist.is_initialized():
        return
    # torchrun's agent already serves the rendezvous store at MASTER_ADDR:MASTER_PORT; under srun
    # these come from SLURM's variables, as Lightning derives them.
    os.environ.setdefault("MASTER_ADDR", environment.main_address)
    os.environ.setdefault("MASTER_PORT", str(environment.main_port))
    # Both backends, so that Lightning's DDP finds what it needs on CPU and on GPU.
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=environment.global_rank(), world_size=environment.world_size())


def agree(decide: Callable[[], T]) -> T:
    """``decide()`` on rank 0, its result on every rank; an error it raises, raised on every rank.
    With one rank, or under Lightning's own launcher, simply ``decide()``."""
    environment = _launcher()
    if environment is None:
        return decide()
    _join(environment)
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", decide())
        except KtframeError as exc:
            box[0] = ("error", str(exc))
        except BaseException as exc:  # the other ranks must not wait for an answer that never comes
            dist.broadcast_object_list([("error", f"rank 0 failed: {type(exc).__name__}: {exc}")], src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise KtframeError(value)
    return value
