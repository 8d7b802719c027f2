"""Figures for studies and reports: readable units, clean log axes, atomic PNG files.

Built on `matplotlib.figure.Figure` and the Agg canvas directly, never `pyplot`, so importing
or calling this module does not switch a notebook's backend or leak open figures.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from moejax.results import atomic_write_bytes

# Decimal multiples, as the papers and vendors quote them (MB = 1e6 bytes, GB/s = 1e9 B/s).
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
BYTE_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def figure(nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.4,
           **subplot_kw):
    """A new `(fig, axes)` with `width x height` inches per panel; `axes` is a 2-D array."""
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, axes


def _axis(ax, which: str):
    if which not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {which!r}")
    return ax.xaxis if which == "x" else ax.yaxis


def _plain(v: float) -> str:
    """A tick label without scientific notation: 0.25, 3, 120, 4096, 65536."""
    if abs(v) >= 1 and abs(v - round(v)) < 1e-9 * abs(v):
        return f"{round(v):d}"
    return f"{v:.3g}"


def time_axis(ax, which: str = "y", unit: str = "ms", label: str = "time") -> None:
    """Show an axis whose data are seconds in `unit` (s, ms, us, ns), labelled `label (unit)`."""
    scale = TIME_UNITS[unit]
    _axis(ax, which).set_major_formatter(FuncFormatter(lambda v, _: _plain(v / scale)))
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(f"{label} ({unit})")


def bytes_axis(ax, which: str = "y", unit: str = "MB", label: str = "memory") -> None:
    """Show an axis whose data are bytes in decimal `unit` (B, kB, MB, GB, TB)."""
    scale = BYTE_UNITS[unit]
    _axis(ax, which).set_major_formatter(FuncFormatter(lambda v, _: _plain(v / scale)))
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(f"{label} ({unit})")


def log_axis(ax, which: str = "x", base: float = 2.0) -> None:
    """Log scale with plain labels at powers of `base` only (no minor-tick label clutter)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = _axis(ax, which)
    axis.set_major_locator(LogLocator(base=base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_formatter(NullFormatter())


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
