"""Output paths checked before any work: an existing file where a folder is expected (or
the reverse), or an unwritable place, is one `ConfigError` line naming the option, and
nothing is written (`moejax.cli.outputs` applies these to every command's options).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from moejax.errors import ConfigError


def check_dir(path, option: str = "--out") -> Path:
    """A folder results go into: an existing writable folder, or one that can be made."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path}: is an existing file; a folder is expected")
    _check_writable(path, option, "folder")
    return path


def check_file(path, option: str = "--out", folder_must_exist: bool = False) -> Path:
    """A file to write (replaced if it exists): not a folder, in a writable folder."""
    text = os.fspath(path)
    path = Path(path)
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise ConfigError(f"{option} {text}: is a folder; a file name is expected")
    folder = path.parent
    if folder_must_exist and not folder.is_dir():
        raise ConfigError(f"{option} {text}: folder {str(folder)!r} does not exist")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{option} {text}: {folder} is a file, not a folder")
    _check_writable(folder, option, "file", shown=text)
    return path


def _check_writable(path: Path, option: str, what: str, shown: str | None = None) -> None:
    """`path` (a folder) is writable, or its nearest existing ancestor is a writable folder
    (so `path` can be made). Probed with a temporary file (removed at once): permission bits
    do not tell root about read-only file systems or /proc."""
    shown = str(path) if shown is None else shown
    base = path.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"{option} {shown}: {base} is a file, so the {what} cannot be made "
                          "there")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".moejax-probe.")
    except OSError as err:
        raise ConfigError(f"{option} {shown}: cannot write in {base} "
                          f"({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)
