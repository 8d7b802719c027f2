"""Argument types and defaults shared by the subcommands' parsers."""

from __future__ import annotations

import argparse

DEFAULT_GEN = "powerlaw:alpha=1.2"


class DefaultInt(int):
    """An option's default value, told apart from the same value given on the command line
    (`simulate --trace` refuses --tokens / --traces / --iterations given explicitly)."""


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 1")
    return v


def int_list(s: str) -> list[int]:
    """Comma-separated integers >= 1 (e.g. batch sizes)."""
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: comma-separated integers expected") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: integers >= 1 expected")
    return out
