"""Provenance of a result: the command line that made it, the moejax version, the seed and
the routing data it ran on, recorded in every summary.json and every export so that a number
can be traced back to its inputs (DESIGN.md: results name their data).

`data` is the trace's own provenance (`moejax.trace.io.describe`): the recording's source
file, importer and importer options, and the derivation steps (`trace slice`, `split`,
`concat`) that led to the file simulated; or the generator spec and seed of generated traces.
"""

from __future__ import annotations

import shlex
import sys
from importlib import metadata

import moejax

_COMMAND: list[str] | None = None


def set_command(argv: list[str] | None) -> None:
    """Record the command line of this process (`moejax.cli.main` calls it first)."""
    global _COMMAND
    _COMMAND = None if argv is None else ["moejax", *(str(a) for a in argv)]


def command() -> str:
    """The command line as a shell would take it (the CLI's, else this process's argv)."""
    argv = _COMMAND if _COMMAND is not None else sys.argv
    return shlex.join(argv)


def version() -> str:
    """The installed moejax version (the package's own `__version__` from a checkout)."""
    try:
        return metadata.version("moejax")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return moejax.__version__


def record(seed: int | None, data: dict | None) -> dict:
    """{"command", "moejax_version", "seed", "data"}: what a summary or export records."""
    return {"command": command(), "moejax_version": version(), "seed": seed,
            "data": data or {}}


def one_line(data: dict | None) -> str:
    """A short human label of `data` (`record`'s "data"), for a table title or a header."""
    if not data:
        return "unknown data"
    if data.get("kind") == "generated":
        version = (f", generator version {data['generator_version']}"
                   if "generator_version" in data else "")
        return f"generated {data.get('generator')} (seed {data.get('seed')}{version})"
    if data.get("kind") == "concat":
        parts = "; ".join(one_line({k: v for k, v in p.items() if k != "file"})
                          for p in data.get("parts", ()))
        later = [str(s) for s in data.get("derived", [])[1:]]
        return f"concat of [{parts}]" + (", " + "; ".join(later) if later else "")
    src = data.get("source") or data.get("file") or "a recording"
    if isinstance(src, list):
        src = ", ".join(str(x) for x in src)
    fmt = data.get("format")
    steps = data.get("derived") or []
    label = f"{src}" + (f" ({fmt})" if fmt else "")
    if steps:
        label += ", " + "; ".join(str(s) for s in steps)
    return label
