"""Figures of `moejax reproduce tuning`, drawn from the CSVs the study writes (so
`--replot DIR` redraws them): best-so-far held-out latency against the budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows

STYLE = {"grad": ("C0", "o-"), "grad-greedy": ("C0", "s--"), "tpe": ("C1", "^-"),
         "cmaes": ("C2", "v-"), "random": ("C3", "x-")}
LINES = {"contiguous": ("k", ":"), "round-robin": ("C5", ":"), "greedy-balanced": ("C4", "-.")}


def _mean_curve(cols: dict, w: str, m: str, x: str, contiguous: dict):
    """(x, held-out % vs contiguous) of method m on workload w, averaged over seeds by the
    budget point (every seed has the same points)."""
    sel = [i for i in range(len(cols["workload"])) if cols["workload"][i] == w
           and cols["method"][i] == m]
    by: dict = {}
    for i in sel:
        rel = (cols["heldout_ms"][i] / contiguous[cols["seed"][i]] - 1) * 100
        by.setdefault(cols["evals"][i], []).append((cols[x][i], rel))
    pts = sorted((np.mean([a for a, _ in v]), np.mean([b for _, b in v])) for v in by.values())
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


def ep_placement_figure(path: Path, rows: Rows, grid: Grid) -> None:
    """One row per workload: held-out mean latency vs contiguous (%) of each method's
    incumbent against simulated layer-traces (left) and search wall time (right); the
    heuristics as horizontal lines."""
    cols, final = rows.cols, rows.more["ep_placement_final.csv"]
    workloads = list(dict.fromkeys(cols["workload"]))
    fig, ax = plotting.figure(len(workloads), 2, width=5.2, height=3.0)
    for r, w in enumerate(workloads):
        fi = [i for i in range(len(final["workload"])) if final["workload"][i] == w]
        contiguous = {final["seed"][i]: final["heldout_ms"][i] for i in fi
                      if final["method"][i] == "contiguous"}
        spread = [final["spread_pct"][i] for i in fi if final["method"][i] == "random-median"]
        for c, x in enumerate(("layer_traces", "wall_s")):
            a = ax[r, c]
            for m, (color, style) in STYLE.items():
                xs, ys = _mean_curve(cols, w, m, x, contiguous)
                if len(xs):
                    a.plot(xs, ys, style, color=color, ms=3, label=m)
            for h, (color, style) in LINES.items():
                vals = [(final["heldout_ms"][i] / contiguous[final["seed"][i]] - 1) * 100
                        for i in fi if final["method"][i] == h]
                a.axhline(np.mean(vals), color=color, ls=style, lw=1, label=h)
            a.set_xscale("log")
            a.set_xlabel("simulated layer-traces" if x == "layer_traces" else
                         "search wall time (s)", fontsize=8)
            a.set_ylabel("held-out latency vs contiguous (%)", fontsize=7)
            a.set_title(f"{w} (random spread {np.mean(spread):.1f} %)", fontsize=8)
    fig.legend(*ax[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    plotting.save(fig, path)
