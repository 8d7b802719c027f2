"""Figures of `moejax reproduce tuning`, drawn from the CSVs the study writes (so
`--replot DIR` redraws them): best-so-far held-out latency against the budget, one PNG per
family, and the headline (every family's final excess over the best and budget to 1 %)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows

STYLE = {"grad": ("C0", "o-"), "grad-greedy": ("C9", "s--"), "tpe": ("C1", "^-"),
         "cmaes": ("C2", "v-"), "random": ("C3", "x-"), "grid": ("C5", "d-")}
LINES = {"best-heuristic": ("C4", "-."), "random-median": ("0.5", ":")}


def _mean_curve(cols: dict, m: str, x: str, ref: dict):
    """(x, held-out % vs the default) of method m, averaged over seeds by budget point."""
    by: dict = {}
    for i in range(len(cols["method"])):
        if cols["method"][i] != m:
            continue
        rel = (cols["heldout_ms"][i] / ref[cols["seed"][i]] - 1) * 100
        by.setdefault(cols["evals"][i], []).append((cols[x][i], rel))
    pts = sorted((np.mean([a for a, _ in v]), np.mean([b for _, b in v])) for v in by.values())
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


def family_figure(label: str, path: Path, rows: Rows, grid: Grid) -> None:
    """Held-out mean latency vs the policy default (%) of each method's incumbent against
    simulated layer-traces (left) and search wall time (right); the best heuristic and the
    median random decision as horizontal lines."""
    cols = rows.cols
    name = path.stem
    final = rows.more[f"{name}_final.csv"]
    n = len(final["method"])
    ref = {final["seed"][i]: final["heldout_ms"][i] for i in range(n)
           if final["method"][i] == "default"}
    spread = [final["spread_pct"][i] for i in range(n) if final["method"][i] == "random-median"]
    fig, ax = plotting.figure(1, 2, width=5.2, height=3.2)
    for c, x in enumerate(("layer_traces", "wall_s")):
        a = ax[0, c]
        for m, (color, style) in STYLE.items():
            xs, ys = _mean_curve(cols, m, x, ref)
            if len(xs):
                a.plot(xs, ys, style, color=color, ms=3, label=m)
        for h, (color, style) in LINES.items():
            vals = [(final["heldout_ms"][i] / ref[final["seed"][i]] - 1) * 100
                    for i in range(n) if final["method"][i] == h]
            if vals:
                a.axhline(np.mean(vals), color=color, ls=style, lw=1, label=h)
        a.set_xscale("log")
        a.set_xlabel("simulated layer-traces" if x == "layer_traces" else
                     "search wall time (s)", fontsize=8)
        a.set_ylabel("held-out latency vs default (%)", fontsize=7)
    fig.suptitle(f"{label} (random spread {np.mean(spread):.1f} %)", fontsize=8)
    fig.legend(*ax[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    plotting.save(fig, path)


def headline_figure(path: Path, rows: Rows, grid: Grid) -> None:
    """Per family: each method's final held-out excess over the best any method found (%,
    left) and the simulated layer-traces it needed to come within 1 % (right, log; a
    hollow marker at the top: never within 1 % in the budget)."""
    cols = rows.cols
    fams = list(dict.fromkeys(cols["family"]))
    methods = [m for m in (*STYLE, "best-heuristic") if m in cols["method"]]
    fig, ax = plotting.figure(1, 2, width=5.6, height=3.4)
    w = 0.8 / len(methods)
    top = max([float(v) for v in cols["layer_traces_spent"] if v != ""] + [1.0]) * 2
    for j, m in enumerate(methods):
        color = STYLE.get(m, ("C4", ""))[0]
        xs, ex, tr, never = [], [], [], []
        for i, f in enumerate(fams):
            r = [k for k in range(len(cols["family"])) if cols["family"][k] == f
                 and cols["method"][k] == m]
            if not r:
                continue
            k = r[0]
            xs.append(i + (j - len(methods) / 2) * w)
            ex.append(cols["over_best_pct"][k])
            t = cols["layer_traces_to_1pct"][k]  # read back: an empty cell is NaN
            reached = t != "" and np.isfinite(float(t))
            (tr if reached else never).append((xs[-1], float(t) if reached else top))
        ax[0, 0].bar(xs, ex, width=w, color=color, label=m)
        if tr:
            ax[0, 1].plot([p[0] for p in tr], [p[1] for p in tr], "o", color=color, ms=4,
                          label=m)
        if never and m != "best-heuristic":
            ax[0, 1].plot([p[0] for p in never], [p[1] for p in never], "o", mfc="none",
                          color=color, ms=4)
    for a in ax[0]:
        a.set_xticks(range(len(fams)))
        a.set_xticklabels(fams, rotation=35, ha="right", fontsize=6)
    ax[0, 0].set_ylabel("final held-out latency over the best (%)", fontsize=7)
    ax[0, 0].set_yscale("symlog", linthresh=1.0)
    ax[0, 1].set_yscale("log")
    ax[0, 1].set_ylabel("layer-traces to within 1 % (hollow: never)", fontsize=7)
    fig.legend(*ax[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=7,
               fontsize=7)
    plotting.save(fig, path)
