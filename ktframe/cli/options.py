"""Argument types shared by several commands."""

from __future__ import annotations

import argparse
import math


def parse_gamma(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a positive number or 'inf'; got {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"gamma must be a positive number or 'inf'; got {text!r}")
    return value
