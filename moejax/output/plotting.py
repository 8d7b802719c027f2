"""Figures for studies and reports: readable units, clean log axes, atomic PNG files.

Built on `matplotlib.figure.Figure` and the Agg canvas directly, never `pyplot`, so importing
or calling this module does not switch a notebook's backend or leak open figures.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from moejax.output.results import atomic_write_bytes

# Decimal multiples, as the papers and vendors quote them (MB = 1e6 bytes, GB/s = 1e9 B/s).
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
BYTE_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def figure(nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.4,
           **subplot_kw):
    """A new `(fig, axes)` with `width x height` inches per panel; `axes` is a 2-D array."""
    # matplotlib is imported on the first figure, not with this module: a run that draws
    # nothing (`moejax simulate`) starts ~0.4 s sooner
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, axes


def _ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def _axis(ax, which: str):
    if which not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {which!r}")
    return ax.xaxis if which == "x" else ax.yaxis


def _plain(v: float) -> str:
    """A tick label without scientific notation: 0.25, 3, 120, 4096, 65536."""
    if abs(v) >= 1 and abs(v - round(v)) < 1e-9 * abs(v):
        return f"{round(v):d}"
    return f"{v:.6g}"  # enough digits that neighbouring ticks (1.025, 1.03) differ


def time_axis(ax, which: str = "y", unit: str = "ms", label: str = "time") -> None:
    """Show an axis whose data are seconds in `unit` (s, ms, us, ns), labelled `label (unit)`."""
    scale = TIME_UNITS[unit]
    _axis(ax, which).set_major_formatter(_ticker().FuncFormatter(lambda v, _: _plain(v / scale)))
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(f"{label} ({unit})")


def bytes_axis(ax, which: str = "y", unit: str = "MB", label: str = "memory") -> None:
    """Show an axis whose data are bytes in decimal `unit` (B, kB, MB, GB, TB)."""
    scale = BYTE_UNITS[unit]
    _axis(ax, which).set_major_formatter(_ticker().FuncFormatter(lambda v, _: _plain(v / scale)))
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(f"{label} ({unit})")


def log_axis(ax, which: str = "x", base: float = 2.0) -> None:
    """Log scale with plain labels at powers of `base` only (no minor-tick label clutter)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = _axis(ax, which)
    axis.set_major_locator(_ticker().LogLocator(base=base))
    axis.set_major_formatter(_ticker().FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_formatter(_ticker().NullFormatter())


def color_limits(values, pad: float = 0.0) -> tuple[float, float]:
    """(vmin, vmax) of the finite `values`, for a colour scale fitted to the data."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return lo - 0.5, hi + 0.5
    return lo - pad * (hi - lo), hi + pad * (hi - lo)


def save(fig, path: Path | str, dpi: int = 110) -> Path:
    """Write `fig` as a PNG atomically (temp file + rename) and return the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def log_if_wide(ax, which: str, values, span: float = 20.0, base: float = 10.0) -> bool:
    """A log axis (plain labels, `log_axis`) only where the finite positive `values` span
    more than `span` x (log axes only where a linear one would hide the small
    values); returns whether it switched."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > span:
        log_axis(ax, which, base)
        return True
    return False


def heatmap(ax, values, *, cmap: str = "viridis", label: str = "", extent=None, fig=None,
            fmt=None):
    """`values` [rows, cols] as an image whose colour scale is fitted to the finite data
    (`color_limits`), with a colour bar labelled `label`; `fmt(v)` formats its ticks."""
    v = np.asarray(values, np.float64)
    lo, hi = color_limits(v)
    im = ax.imshow(v, cmap=cmap, vmin=lo, vmax=hi, aspect="auto", origin="lower",
                   interpolation="nearest", extent=extent)
    bar = (fig or ax.figure).colorbar(im, ax=ax, label=label)
    if fmt is not None:
        bar.formatter = _ticker().FuncFormatter(lambda x, _: fmt(x))
        bar.update_ticks()
    return im


def read_csv(path: Path | str) -> dict[str, np.ndarray]:
    """The columns of a CSV written by `moejax.output.results` (header row, then values): numeric
    columns as float64 arrays (empty cells NaN), the others as str arrays. For redrawing a
    study's figures from its shipped CSV files (`moejax reproduce STUDY --replot DIR`)."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return {}
    head, body = rows[0], rows[1:]
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(head):
        raw = [r[j] if j < len(r) else "" for r in body]
        try:
            cols[name] = np.asarray([float(x) if x != "" else np.nan for x in raw], np.float64)
        except ValueError:
            cols[name] = np.asarray(raw, dtype=str)
    return cols


def read_rows(path: Path | str, ints=(), bools=()) -> list[dict]:
    """`read_csv` as a list of row dicts (see `row_dicts`)."""
    return row_dicts(read_csv(path), ints, bools)


def row_dicts(cols: dict, ints=(), bools=()) -> list[dict]:
    """Columns (arrays or lists, as `read_csv` reads them) as row dicts: numbers as float, the
    columns named in `ints` as int, in `bools` as bool ("True" / "1"), the rest as str."""
    names = list(cols)
    out = []
    for vals in zip(*(cols[k] for k in names), strict=True):
        row = {}
        for k, x in zip(names, vals, strict=True):
            if k in ints:
                x = int(float(x))
            elif k in bools:
                x = str(x) in ("True", "true", "1", "1.0")
            elif isinstance(x, (float, np.floating)):
                x = float(x)
            else:
                x = str(x)
            row[k] = x
        out.append(row)
    return out


def mesh_links(ax, rows: int, cols: int, horizontal, vertical, *, vmin: float, vmax: float,
               cmap: str = "inferno_r", lw: float = 6.0):
    """A `rows x cols` 2-D mesh with each link coloured by its value: `horizontal`
    [rows, cols - 1] (link (r, c)-(r, c+1)), `vertical` [rows - 1, cols] (link (r, c)-(r+1, c)),
    on the colour scale [vmin, vmax]; returns the mappable for a colour bar."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize

    h = np.asarray(horizontal, np.float64).reshape(rows, cols - 1)
    v = np.asarray(vertical, np.float64).reshape(rows - 1, cols)
    segs = [[(c, -r), (c + 1, -r)] for r in range(rows) for c in range(cols - 1)]
    segs += [[(c, -r), (c, -r - 1)] for r in range(rows - 1) for c in range(cols)]
    lc = LineCollection(segs, cmap=cmap, norm=Normalize(vmin, vmax), linewidths=lw)
    lc.set_array(np.concatenate([h.ravel(), v.ravel()]))
    ax.add_collection(lc)
    rr, cc = np.divmod(np.arange(rows * cols), cols)
    ax.scatter(cc, -rr, s=60, c="lightgray", zorder=3)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(-rows + 0.5, 0.5)
    ax.set_aspect("equal")
    ax.set_axis_off()
    return lc
