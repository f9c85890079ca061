"""Names a user types: the closest valid one, for a "did you mean" in a one-line error."""

from __future__ import annotations

import difflib

# One spelling of each name, scikit-learn's; the others that users write are accepted for it.
SPELLINGS = {"kmeans++": "k-means++", "greedy-kmeans++": "greedy-k-means++"}


def canonical(name: str) -> str:
    """``name`` in its one spelling (``kmeans++`` is ``k-means++``); any other name as it is."""
    return SPELLINGS.get(name, name) if isinstance(name, str) else name


def closest(name: str, candidates: list[str]) -> str | None:
    """The candidate most like ``name``, or None when nothing is close."""
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    return matches[0] if matches else None


def unknown_name_message(what: str, name: str, valid: list[str]) -> str:
    """One line: the unknown name, the valid ones and the closest match."""
    message = f"unknown {what} {name!r}; expected one of: {', '.join(sorted(valid)) or '(none registered)'}"
    suggestion = closest(name, valid)
    if suggestion is not None:
        message += f" (did you mean {suggestion!r}?)"
    return message
