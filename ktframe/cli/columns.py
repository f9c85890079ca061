"""Text for a terminal of :data:`WIDTH` columns: what every command prints fits in it."""

from __future__ import annotations

import textwrap

WIDTH = 100


def wrapped(text: str, indent: str = "", hanging: str | None = None) -> str:
    """``text`` filled to :data:`WIDTH` columns, its first line indented by ``indent`` and the
    others by ``hanging`` (default: ``indent``). Words are never split, so a path or a name
    longer than a line keeps its line."""
    return textwrap.fill(
        text, WIDTH, initial_indent=indent, subsequent_indent=indent if hanging is None else hanging, break_long_words=False, break_on_hyphens=False
    )
