"""A results folder written whole or not at all: work in a temporary sibling, move it in at
the end (Ctrl-C in `moejax reproduce` must not leave an empty folder, or figures without
summary.json)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from moejax.output.results import refused, remove_empty, umask, write_error_reason

LAST = "summary.json"  # moved in last: its presence says the folder is complete


@contextlib.contextmanager
def staged_dir(out_dir: Path | str) -> Iterator[Path]:
    """Yield a new temporary sibling of `out_dir` to write into. When the block ends
    normally its files move into `out_dir`: by one rename when `out_dir` does not exist or
    is empty, else file by file (`os.replace`, `summary.json` last; other files already
    in `out_dir` stay). When the block raises (Ctrl-C included) the sibling is removed and
    `out_dir` is left as it was.
    """
    out_dir = Path(out_dir)
    made = [p for p in reversed(out_dir.absolute().parents) if not p.exists()]
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.",
                                    suffix=".tmp"))
    except OSError as err:
        remove_empty(made)
        if write_error_reason(err) is None:
            raise
        raise refused(out_dir, err) from None
    try:
        os.chmod(tmp, 0o777 & ~umask())  # the folder renamed in: a new folder's mode, not 0700
        yield tmp
        _move_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)  # folders made for out_dir, innermost first, if empty
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_in(tmp: Path, out_dir: Path) -> None:
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    files = sorted((p for p in tmp.rglob("*") if p.is_file()),
                   key=lambda p: (p.relative_to(tmp) == Path(LAST), str(p)))
    for src in files:
        dst = out_dir / src.relative_to(tmp)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
