"""Helpers for writing hand-built constructions: heads made of fixed sparse projections."""

from __future__ import annotations

from typing import Sequence

from ktframe.components.maps import AttentionMap
from ktframe.components.scores import Score
from ktframe.model import AttentionHead, Select


def coords(start: int, stop: int) -> list[int]:
    return list(range(start, stop))


def slot(coordinates: Sequence[int]) -> slice:
    """The token slice of a contiguous run of coordinates."""
    coordinates = list(coordinates)
    if coordinates != coords(coordinates[0], coordinates[0] + len(coordinates)):
        raise ValueError("a head writes a contiguous run of coordinates")
    return slice(coordinates[0], coordinates[-1] + 1)


def fixed_head(
    width: int,
    *,
    q: Sequence[int],
    k: Sequence[int],
    v: Sequence[int],
    score: Score,
    attention_map: AttentionMap,
    gamma: float = 1.0,
    q_scale: Sequence[float] | float = 1.0,
    k_scale: Sequence[float] | float = 1.0,
    v_scale: float = 1.0,
    write: Sequence[int] | None = None,
    identity: bool = False,
) -> AttentionHead:
    """A head whose Q and K read coordinates ``q`` and ``k`` and whose V copies coordinates ``v``
    (times ``v_scale``) into ``write`` (``v`` itself when not given)."""
    return AttentionHead(
        Select(width, q, q_scale),
        Select(width, k, k_scale),
        Select(width, v, v_scale),
        score,
        attention_map,
        slot=slot(v if write is None else write),
        gamma=gamma,
        identity=identity,
    )
