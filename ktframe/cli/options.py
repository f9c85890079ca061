"""Argument types shared by several commands."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer(minimum: int, *, word: str | None = None, meaning: str = "") -> Callable[[str], int | str]:
    """An argparse type: an integer of at least ``minimum`` (or the word ``word`` itself, as
    given), else the error "expected an integer >= minimum; got 'text'" (``meaning`` added to
    what is expected)."""
    expected = f"an integer >= {minimum}" if word is None else f"{word!r} or an integer >= {minimum}"
    expected += f" ({meaning})" if meaning else ""

    def parse(text: str) -> int | str:
        if word is not None and text == word:
            return text
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


def bounded(check: Callable[[int, str], int], minimum: int = 0) -> Callable[[str], int]:
    """An argparse type: an integer that ``check`` (one of :mod:`ktframe.core.limits`' bounds, such as
    ``check_seed`` or ``check_iterations``) accepts, refused in its words before any work."""
    as_integer = integer(minimum)

    def parse(text: str) -> int:
        from ktframe.core.errors import InputError

        try:
            return check(as_integer(text), "the value")
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def parse_gamma(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a positive number or 'inf'; got {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"gamma must be a positive number or 'inf'; got {text!r}")
    return value


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE``, a variant's build option: the value read as YAML (``0.1``, ``true``,
    ``identity``), ``inf`` as infinity."""
    import yaml  # here: parsing the other arguments needs none of it

    key, equals, value = text.partition("=")
    if not equals or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--option takes KEY=VALUE, a build option of the variant (e.g. --option trim=0.1); got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, str) and parsed.lower() in ("inf", "+inf", "-inf"):
        parsed = float(parsed)
    return key, parsed


def variant_options(variant: str, pairs: list[tuple[str, object]]) -> dict:
    """The ``--option`` pairs as a dict, each key given once and a build option of ``variant``
    other than gamma (``--gamma`` sets it); otherwise a one-line error naming the valid keys."""
    from ktframe.core.errors import InputError
    from ktframe.plugin.build import get_variant
    from ktframe.plugin.variant import check_options

    options: dict = {}
    for key, value in pairs:
        if key in options:
            raise InputError(f"--option {key} is given twice; expected each option once")
        if key == "gamma":
            raise InputError("--option gamma=...: the temperature is --gamma; expected --gamma VALUE")
        options[key] = value
    check_options(get_variant(variant), options)
    return options
