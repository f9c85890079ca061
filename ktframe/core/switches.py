"""ktframe's boolean environment switches (``KTFRAME_NO_KERNELS``, ``KTFRAME_STRICT_PLUGINS``,
``KTFRAME_DISABLE_PLUGINS``), all read the same way: ``0``, ``false``, ``no``, ``off`` and the
empty string (any case, surrounding spaces ignored) are off, an unset variable is off, anything
else is on."""

from __future__ import annotations

import os

OFF = frozenset({"", "0", "false", "no", "off"})


def is_on(value: str | None) -> bool:
    """Whether a switch's value means on (``None``: unset, off)."""
    return value is not None and value.strip().lower() not in OFF


def on(name: str) -> bool:
    """Whether the environment variable ``name`` is switched on."""
    return is_on(os.environ.get(name))
