"""Result files written atomically: a temp file in the same folder, then a rename.

Every file is created with the permissions the umask gives a new file (`0o666 & ~umask`,
as `open` would), not the 0600 of a bare `mkstemp`. A write the file system refuses (full
disk, quota, read-only, no permission) is an `OutputError` line, and leaves neither the temp
file nor a folder made for it. `together()` renames several files in only when all are
written (a results.csv beside a summary.json of another run is never left).
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import errno
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moejax.errors import OutputError

# errno values that say the place cannot take the file (the machine's state, not a bug):
# no space, quota, file too large (RLIMIT_FSIZE), read-only file system, no permission, I/O.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES,
                          errno.EPERM, errno.EIO})

# renames held back by `together()`: (temp file, destination), in write order
_pending: contextvars.ContextVar[list | None] = contextvars.ContextVar("pending", default=None)


def umask() -> int:
    """This process's umask (read without changing it where /proc tells it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def write_error_reason(err: BaseException) -> str | None:
    """The strerror of a refused write (`WRITE_ERRNOS`) found in `err` or its causes, else
    None. Also reads tensorstore's messages (orbax), which carry `[os_error_code='28']`."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
            return err.strerror or os.strerror(err.errno)
        text = str(err)
        for code in WRITE_ERRNOS:
            if f"os_error_code='{code}'" in text:
                return os.strerror(code)
        err = err.__cause__ or err.__context__
    return None


def refused(path: Path | str, err: BaseException | str,
            left: str = "nothing was written") -> OutputError:
    """The `OutputError` for a write of `path` that the file system refused with `err` (an
    exception, or its reason); `.path` and `.reason` keep both for a caller that says more
    about what was `left`."""
    reason = err if isinstance(err, str) else write_error_reason(err) or str(err)
    out = OutputError(f"cannot write {path}: {reason}; {left}")
    out.path, out.reason = Path(path), reason
    return out


def made_folders(folder: Path) -> list[Path]:
    """The folders `folder.mkdir(parents=True)` would make, outermost first."""
    folder = Path(folder).absolute()
    return [p for p in [*reversed(folder.parents), folder] if not p.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (outermost first, as `made_folders` lists them) that are empty."""
    for p in reversed(folders):
        with contextlib.suppress(OSError):
            p.rmdir()


@contextlib.contextmanager
def atomic_file(path: Path | str, fsync: bool = False) -> Iterator:
    """Yield a binary file whose bytes become `path` when the block ends (renamed in from a
    temp file in the same folder; held back to the end of an enclosing `together()`). On
    any error the temp file and the folders made for it are removed; a refused write
    (`WRITE_ERRNOS`) is an `OutputError`."""
    path = Path(path)
    made = made_folders(path.parent)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        pending = _pending.get()
        if pending is None:
            os.replace(tmp, path)
        else:
            pending.append((tmp, path))
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        remove_empty(made)
        if write_error_reason(err) is not None and not isinstance(err, OutputError):
            raise refused(path, err) from None
        raise


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Files written by `atomic_file` (and the `atomic_write_*` functions) inside the block
    are renamed in, in the order written, only when the block ends without an error;
    otherwise none is (their temp files are removed)."""
    pending: list = []
    token = _pending.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        _pending.reset(token)
    for tmp, path in pending:
        os.replace(tmp, path)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path | str, obj) -> None:
    atomic_write_text(path, json.dumps(_plain(obj), indent=2) + "\n")


def atomic_write_csv(path: Path | str, columns: dict[str, np.ndarray]) -> None:
    """One row per index of the equal-length 1-D columns."""
    buf = io.StringIO()
    w = csv.writer(buf)
    names = list(columns)
    w.writerow(names)
    cols = [np.asarray(columns[n]).ravel() for n in names]
    if all(c.dtype.kind in "fiub" for c in cols):
        # numbers only: formatted a column at a time, as the row writer below formats them
        # (a number never needs quoting); ~2.7x faster than the row writer, which took ~12 s
        # for a million-trace run's results.csv
        text = [_column_text(c) for c in cols]
        buf.writelines(",".join(r) + w.dialect.lineterminator for r in zip(*text, strict=True))
    else:
        for row in zip(*cols, strict=True):
            w.writerow([_fmt(x) for x in row])
    atomic_write_text(path, buf.getvalue())


def _column_text(col: np.ndarray) -> list[str]:
    """The fields `_fmt` and the csv writer make of a numeric column's values."""
    if col.dtype.kind == "f":
        return [f"{x:.9g}" for x in col.astype(np.float64).tolist()]
    return [str(x) for x in col.tolist()]


def atomic_write_rows(path: Path | str, rows: list[dict]) -> None:
    """A list of row dicts as a CSV, one column per key of the first row (keys starting
    with "_" are private to the caller and left out)."""
    keys = [k for k in rows[0] if not k.startswith("_")]
    atomic_write_csv(path, {k: np.asarray([r[k] for r in rows]) for k in keys})


def _fmt(x):
    if isinstance(x, (np.floating, float)):
        return f"{float(x):.9g}"
    return x.item() if hasattr(x, "item") else x


def _plain(obj):
    """JSON-ready copy: NumPy / JAX scalars and arrays become Python numbers and lists."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj
