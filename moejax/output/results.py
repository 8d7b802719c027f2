"""Result files written atomically: a temp file in the same folder, then a rename."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    for row in zip(*cols, strict=True):
        w.writerow([_fmt(x) for x in row])
    atomic_write_text(path, buf.getvalue())


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
