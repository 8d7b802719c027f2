"""Per-layer per-expert token counts as CSV: a header `layer,0,...,E-1` (or
`iteration,layer,0,...`), one row per (iteration, layer)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.trace.core import Trace, from_counts
from moejax.trace.importers.reading import (
    byte_progress,
    check_experts_top_k,
    error,
    read_lines,
)


def import_counts_csv(src, *, top_k: int, num_experts: int | None = None,
                      progress: bool = False) -> tuple[Trace, dict]:
    """Per-layer per-expert counts CSV -> counts-only Trace [I, L, E] and meta."""
    check_experts_top_k(num_experts, top_k, "counts-csv")
    if top_k is None:
        raise ConfigError("top_k: required for counts-csv (counts do not say it)")
    path = Path(src)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    rows: dict[tuple[int, int], np.ndarray] = {}
    with open(path, "rb") as f, byte_progress(
        path.stat().st_size, f"csv {path.name}", progress
    ) as advance:
        header = None

        def csv_column(before: str) -> str | None:
            col = before.count(",")
            if header is None or col >= len(header):
                return "header" if header is None else None
            return f"count of expert {header[col]}" if col >= lead else header[col]

        for n, text, ended in read_lines(f, path, csv_column):
            advance(len(text) + 1)
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            cells = next(csv.reader(io.StringIO(text)))
            cells = [c.strip() for c in cells]
            if header is None:
                header = cells
                lead = 2 if header[:2] == ["iteration", "layer"] else 1
                if header[:lead][-1] != "layer":
                    raise error(path, n, "header", "must start with 'layer' or "
                                f"'iteration,layer', got {','.join(header[:2])!r}")
                experts = header[lead:]
                if experts != [str(e) for e in range(len(experts))] or not experts:
                    raise error(path, n, "header", "expert columns must be 0,1,...,E-1")
                if num_experts is not None and len(experts) != num_experts:
                    raise error(path, n, "header", f"{len(experts)} expert columns, expected "
                                f"num_experts={num_experts}")
                continue
            if len(cells) != len(header):
                what = "truncated row" if not ended or len(cells) < len(header) else "extra"
                raise error(path, n, "row", f"{len(cells)} cells, header has {len(header)} "
                            f"({what})")
            try:
                idx = tuple(int(c) for c in cells[:lead])
            except ValueError:
                raise error(path, n, header[lead - 1], f"not an integer: {cells[:lead]}") from None
            if lead == 1:
                idx = (0, *idx)
            if min(idx) < 0:
                raise error(path, n, "layer", f"negative index {idx}")
            try:
                vals = np.array(cells[lead:], dtype=np.float64)
            except ValueError:
                raise error(path, n, "count", "not all numbers") from None
            if not np.isfinite(vals).all() or (vals < 0).any():
                e = int(np.argmax(~np.isfinite(vals) | (vals < 0)))
                raise error(path, n, f"count of expert {e}", f"{cells[lead + e]!r} is not a "
                            "finite number >= 0")
            if idx in rows:
                raise error(path, n, "layer", f"(iteration, layer) {idx} given twice")
            rows[idx] = vals
    if not rows:
        raise TraceError(f"{path}: no count rows")
    num_i = max(i for i, _ in rows) + 1
    num_l = max(layer for _, layer in rows) + 1
    missing = [(i, j) for i in range(num_i) for j in range(num_l) if (i, j) not in rows]
    if missing:
        raise TraceError(f"{path}: layer: (iteration, layer) {missing[0]} has no row "
                         f"({len(missing)} missing; truncated file?)")
    counts = np.stack([np.stack([rows[(i, j)] for j in range(num_l)]) for i in range(num_i)])
    return from_counts(counts, top_k), {"source": "counts-csv", "path": str(path)}
