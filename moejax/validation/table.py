"""The validation table: each published measurement beside moejax's value, as rows, a
printed table, a CSV and a predicted-vs-measured plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from moejax.catalog.hardware import load_platform
from moejax.output import plotting
from moejax.output.results import atomic_write_rows
from moejax.validation import predict
from moejax.validation.rows import Measurement

COLUMNS = ("id", "role", "moejax", "measured", "unit", "ratio", "band", "in_band", "status",
           "source")


def evaluate(rows: list[Measurement]) -> list[dict]:
    """One dict per measurement: moejax's value, ratio moejax / measured, in its band or not."""
    out = []
    for m in rows:
        value = predict.predict(m.kind, load_platform(m.platform), dict(m.params))
        ratio = value / m.measured
        out.append(dict(
            id=m.id, kind=m.kind, platform=m.platform, role=m.role, moejax=value,
            measured=m.measured, unit=m.unit, ratio=ratio, band=m.band,
            in_band=bool(abs(ratio - 1.0) <= m.band), status=m.status, reason=m.reason,
            config=m.config, source=m.source,
        ))
    return out


def format_table(results: list[dict]) -> str:
    """A plain-text table, one line per measurement, and a summary line per role."""
    head = (f"{'measurement':38s} {'role':11s} {'measured':>10s} {'moejax':>10s} {'unit':7s} "
            f"{'ratio':>6s} {'band':>5s}  in band")
    lines = [head, "-" * len(head)]
    for r in results:
        mark = "yes" if r["in_band"] else "NO  " + r["reason"]
        lines.append(f"{r['id'][:38]:38s} {r['role']:11s} {r['measured']:10.4g} "
                     f"{r['moejax']:10.4g} {r['unit']:7s} {r['ratio']:6.3f} "
                     f"{r['band']:5.0%}  {mark}")
    lines.append("")
    for role in ("calibration", "held-out"):
        sel = [r for r in results if r["role"] == role]
        if sel:
            err = np.array([abs(r["ratio"] - 1.0) for r in sel])
            inside = sum(r["in_band"] for r in sel)
            lines.append(f"{role}: {inside} / {len(sel)} in band; |ratio - 1| median "
                         f"{np.median(err):.1%}, max {err.max():.1%}")
    return "\n".join(lines)


def write_csv(results: list[dict], path: Path | str) -> None:
    """The table as a CSV, one row per measurement (atomic)."""
    atomic_write_rows(path, [{**r, "in_band": int(r["in_band"])} for r in results])


UNIT_PANELS = ("us", "GB/s", "TFLOP/s")
MARKERS = {"calibration": "s", "held-out": "o"}


def plot(results: list[dict], path: Path | str) -> Path:
    """Predicted vs measured, one log-log panel per unit, the y = x line and the +-15% band."""
    units = [u for u in UNIT_PANELS if any(r["unit"] == u for r in results)]
    fig, axes = plotting.figure(1, len(units), width=4.2, height=4.0)
    kinds = sorted({r["kind"] for r in results})
    colors = {k: f"C{i}" for i, k in enumerate(kinds)}
    for ax, unit in zip(axes[0], units, strict=True):
        sel = [r for r in results if r["unit"] == unit]
        lo = min(min(r["measured"], r["moejax"]) for r in sel) / 1.5
        hi = max(max(r["measured"], r["moejax"]) for r in sel) * 1.5
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, color="0.3", lw=1)
        ax.fill_between(xs, xs * 0.85, xs * 1.15, color="0.85", label="within 15%")
        for kind in kinds:
            for role, marker in MARKERS.items():
                pts = [r for r in sel if r["kind"] == kind and r["role"] == role]
                if pts:
                    ax.scatter([r["measured"] for r in pts], [r["moejax"] for r in pts],
                               marker=marker, color=colors[kind], s=22,
                               facecolors="none" if role == "calibration" else colors[kind],
                               label=f"{kind} ({role})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"moejax ({unit})")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("moejax vs published measurements (hollow squares: calibration)", fontsize=9)
    return plotting.save(fig, path)
