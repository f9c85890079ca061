"""The progress bar of a command that takes a while: tqdm on standard error, as ``ktframe fit``
draws its steps (Lightning's tqdm bar), drawn only when standard error is a terminal and never
under ``ktframe --quiet``, so that a log or a pipe receives the results alone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def bar(description: str, total: int | None = None, unit: str = "it", *, quiet: bool = False) -> Any:
    """A tqdm bar (a context manager) of ``total`` ``unit``\\ s; with ``quiet`` one that draws nothing."""
    from tqdm import tqdm

    # disable=None: tqdm draws on a terminal only
    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, disable=True if quiet else None, dynamic_ncols=True)


def follow(progress_bar: Any) -> Callable[[int, int], None]:
    """A library's ``progress(done, total)`` callback that moves ``progress_bar`` to ``done`` of ``total``."""

    def update(done: int, total: int) -> None:
        if progress_bar.total != total:
            progress_bar.total = total
        progress_bar.update(done - progress_bar.n)

    return update
