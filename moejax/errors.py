"""The MoejaxError family: every message names the field, the value and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MoejaxError(Exception):
    """Base of every error moejax raises on bad input; the CLI prints it as one line."""


class UnknownNameError(MoejaxError, KeyError):
    """A catalog lookup for a name that does not exist."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")
        self.kind, self.name, self.known = kind, name, known

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ConfigError(MoejaxError, ValueError):
    """A catalog file or config value that is missing, unknown, mistyped or out of range."""


class TraceError(MoejaxError, ValueError):
    """A routing trace with a wrong shape, dtype, id range, or non-finite value."""


class CheckpointError(MoejaxError):
    """A checkpoint that is missing, corrupt, or does not match what is being restored."""


class OutputError(MoejaxError):
    """A result, checkpoint or trace file that cannot be written here (a full disk, a quota,
    a read-only file system, no permission), or an output folder another run is writing:
    the message says what was left (nothing half-written) and how to go on."""
