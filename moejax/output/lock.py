"""One run at a time per output folder: an advisory lock (`flock`) on a file in the folder.

Two runs writing one `--out` at once would each replace the other's files (the last writer
wins, a streamed run's parts and state would interleave). The first run holds
`FOLDER/.moejax.lock` while it works; a second one is refused in one line naming the holder's
process id. The kernel drops an `flock` when its holder exits in any way (SIGKILL included),
so a lock file left by a dead run blocks nothing: the next run takes it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from moejax.errors import OutputError
from moejax.output.results import made_folders, refused, remove_empty, write_error_reason

LOCK = ".moejax.lock"


@contextlib.contextmanager
def folder_lock(folder: Path | str, option: str = "--out") -> Iterator[Path]:
    """Hold the lock of `folder` (made if missing) for the block; OutputError if another
    live process holds it. On exit the lock file is removed, and so are the folders made
    for it when the block left them empty."""
    folder = Path(folder)
    made = made_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _acquire(folder / LOCK, folder, option)
    except BaseException as err:
        remove_empty(made)
        if isinstance(err, OSError) and write_error_reason(err) is not None:
            raise refused(folder / LOCK, err) from None
        raise
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            (folder / LOCK).unlink()  # while held: a waiting opener then sees a stale inode
        os.close(fd)
        remove_empty(made)


def _acquire(path: Path, folder: Path, option: str) -> int:
    """An fd holding an exclusive `flock` on `path`, the file now at that name (a lock taken
    on a file its holder has just unlinked is dropped and taken again on the new one)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise OutputError(f"{option} {folder}: another moejax run (process {holder}) is "
                              "writing this folder; wait for it to end, or choose another "
                              f"{option}") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)
