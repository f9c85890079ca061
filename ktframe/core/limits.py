"""The bounds a count, a seed or a size that a user gives is checked against, before anything is
made or allocated: one rule each, so that every entry point refuses the same value in the same words.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any

from ktframe.core.errors import InputError

# The seeds numpy's legacy generator, scikit-learn's ``random_state`` and Lightning's
# ``seed_everything`` all take.
SEED_MAX = 2**32 - 1
# The most iterations of one loop a user asks for (layers, Lloyd iterations, swaps): far beyond any
# k-means run (scikit-learn's default max_iter is 300), and still a loop that ends.
MAX_ITERATIONS = 10**6
# The most training steps (or epochs) of one fit: years at a millisecond a step, so only a typo
# (``trainer.max_steps=1e23``) is refused.
MAX_TRAINING_STEPS = 10**10


def check_integer(value: Any, name: str, minimum: int, maximum: int | None = None, meaning: str = "") -> int:
    """``value`` as an int within ``[minimum, maximum]``, else one line naming ``name``, the range
    (with ``meaning``, what the number is) and the value given. A bool, a float (even ``1e9``)
    and a string are refused: the user's intent is a count."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's integers too, without importing numpy (a usage error answers at once)
        within = f"an integer from {minimum} to {maximum}" if maximum is not None else f"an integer >= {minimum}"
        raise InputError(f"{name} must be {within}{f' ({meaning})' if meaning else ''}; got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        within = f"an integer from {minimum} to {maximum}" if maximum is not None else f"an integer >= {minimum}"
        raise InputError(f"{name} must be {within}{f' ({meaning})' if meaning else ''}; got {int(value)}")
    return int(value)


def check_seed(value: Any, name: str) -> int:
    """A seed: an integer from 0 to :data:`SEED_MAX`."""
    return check_integer(value, name, 0, SEED_MAX, "a seed")


def check_iterations(value: Any, name: str, minimum: int = 0) -> int:
    """A count of iterations of one loop: up to :data:`MAX_ITERATIONS`."""
    return check_integer(value, name, minimum, MAX_ITERATIONS)


def _cgroup_limit() -> float:
    """The memory limit of this process's cgroup (v2, then v1), inf where there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return float(text)
    return math.inf


def available_memory() -> float:
    """Bytes this process could still allocate: the kernel's ``MemAvailable`` (Linux), else the
    physical memory, capped by a cgroup's limit; inf where neither can be read."""
    available = math.inf
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if math.isinf(available):
        try:
            available = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    return min(available, _cgroup_limit())


def size_text(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit that keeps it at least 1 (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def check_allocation(nbytes: float, what: str) -> None:
    """Refuse, in one line, work whose memory (``nbytes``, an estimate) exceeds what the machine
    has available: ``what`` names the key or parameter that sized it and its value."""
    available = available_memory()
    if nbytes > available:
        raise InputError(f"{what} needs about {size_text(nbytes)} of memory; expected at most the {size_text(available)} this machine has available")
