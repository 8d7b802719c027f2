"""Paper 001 (MoEntwine) figures, each drawn by its own plot from the rows of its CSV
(`moejax reproduce moentwine`, and `--replot DIR` from DIR's CSVs alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows


def fig13a(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_lines(path, rows.cols, "tokens_per_group", "comm_s", "system",
                "001 Fig. 13(a): communication per layer vs tokens per TP group")


def fig13b(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_bars(path, rows.cols, "model", "comm_s", "system",
               "001 Fig. 13(b): communication per layer by model")


def fig13c(path: Path, rows: Rows, grid: Grid) -> None:
    r = rows.cols
    _plot_simple_bars(path, [f"{p}\nTP={int(t)}" for p, t in zip(r["platform"], r["tp"],
                                                                 strict=True)],
                      [100 * x for x in r["reduction"]], "ER comm reduction vs baseline (%)",
                      "001 Fig. 13(c)")


def fig13d(path: Path, rows: Rows, grid: Grid) -> None:
    r = dict(rows.cols, tp=[int(t) for t in rows.cols["tp"]])
    _plot_bars(path, r, "tp", "comm_s", "mapping", "001 Fig. 13(d): 4 x 8x8 wafers, comm per layer")


def fig14a(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 14(a) on the 6x6 WSC vs 4-node DGX rows (the full grid adds 8x8 vs 8 nodes)."""
    r = rows.cols
    sel = [i for i, sc in enumerate(r["scale"]) if sc == "wsc-6x6"]
    _plot_bars(path, {k: [v[i] for i in sel] for k, v in r.items()}, "model", "comm_s", "system",
               "001 Fig. 14(a): ESP comm per layer (all-to-all + all-reduces), 6x6 vs 4-node DGX")


def fig11(path: Path, rows: Rows, grid: Grid) -> None:
    plot_fig11(path, rows.cols)


def fig15(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_lines(path, rows.cols, "iteration", "max_over_mean", "strategy",
                "001 Fig. 15: max / mean device load per iteration (wsc-8x8, qwen3)")


def fig16(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_bars(path, rows.cols, "scenario", "moe_compute_s", "strategy",
               "001 Fig. 16: MoE compute per layer by balancing strategy")


def fig17(path: Path, rows: Rows, grid: Grid) -> None:
    r = rows.cols
    work = r.get("workload", ["mixed"] * len(r["system"]))
    names = [n if w == "mixed" else f"{n} ({w})" for n, w in zip(r["system"], work, strict=True)]
    _plot_simple_bars(path, names, [x / 1e6 for x in r["moe_throughput"]],
                      "MoE throughput per device\n(M token-expert pairs / s)", "001 Fig. 17")


# Axis names and legend titles of the figures (column names are CSV headers, not labels).
_LABELS = {"tokens_per_group": "tokens per TP group", "tp": "TP degree (devices per group)",
           "max_over_mean": "max / mean device load", "comm": "communication per layer",
           "moe_compute": "MoE compute per layer", "iteration": "iteration"}
_LEGEND_TITLES = {
    "system": "platform / mapping\nbaseline: each TP group a compact block; er: ER-Mapping "
              "(entwined rings);\nher: HER-Mapping (multi-wafer); esp: expert sharding",
    "mapping": "mapping\nbaseline: compact TP blocks; ER / HER: 001 §IV-A",
    "strategy": "balancing strategy (001 §V)\nnone; greedy: EPLB-style greedy; topology: "
                "Alg. 1 topology-aware;\n-ni: with non-invasive migration (§V-A)",
}


def _label(col: str) -> str:
    return _LABELS.get(col, col.replace("_", " "))


def _y_axis(ax, y: str, values=()) -> None:
    """Seconds in ms, bytes in MB, anything else by its readable name; a log axis (labels
    at powers of ten) when the values span more than 20x, so small series stay visible."""
    v = np.asarray([x for x in values if isinstance(x, (int, float))], np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 20:
        plotting.log_axis(ax, "y", base=10)
    if y.endswith("_s"):
        plotting.time_axis(ax, "y", "ms", _label(y[:-2]))
    elif y.endswith("_bytes"):
        plotting.bytes_axis(ax, "y", "MB", _label(y[:-6]))
    else:
        ax.set_ylabel(_label(y))


def _legend(fig, ax, group: str) -> None:
    title = _LEGEND_TITLES.get(group, _label(group))
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3,
               fontsize=7, title=title, title_fontsize=7)


def _plot_lines(path, rows, x, y, group, title):
    fig, axes = plotting.figure(width=7.0, height=4.6)
    ax = axes[0, 0]
    for gname in dict.fromkeys(rows[group]):
        idx = [i for i, v in enumerate(rows[group]) if v == gname]
        ax.plot([rows[x][i] for i in idx], [rows[y][i] for i in idx], marker="o",
                label=str(gname))
    xs = np.asarray([v for v in rows[x] if isinstance(v, (int, float))], np.float64)
    if xs.size and xs.min() > 0 and xs.max() / xs.min() >= 8:
        plotting.log_axis(ax, "x", base=2)
    ax.set_xlabel(_label(x))
    _y_axis(ax, y, rows[y])
    ax.set_title(title, fontsize=9)
    _legend(fig, ax, group)
    plotting.save(fig, path, dpi=90)


def _plot_bars(path, rows, x, y, group, title):
    xs = list(dict.fromkeys(rows[x]))
    gs = list(dict.fromkeys(rows[group]))
    fig, axes = plotting.figure(width=8.0, height=4.6)
    ax = axes[0, 0]
    w = 0.8 / len(gs)
    for j, gname in enumerate(gs):
        vals = [next((rows[y][i] for i in range(len(rows[y]))
                      if rows[x][i] == xv and rows[group][i] == gname), 0.0) for xv in xs]
        ax.bar(np.arange(len(xs)) + j * w, vals, w, label=str(gname))
    ax.set_xticks(np.arange(len(xs)) + 0.4 - w / 2)
    ax.set_xticklabels([str(v) for v in xs], fontsize=7)
    ax.set_xlabel(_label(x))
    _y_axis(ax, y, rows[y])
    ax.set_title(title, fontsize=9)
    _legend(fig, ax, group)
    plotting.save(fig, path, dpi=90)


def _plot_simple_bars(path, labels, values, ylabel, title):
    fig, axes = plotting.figure(width=8.0, height=4.2)
    ax = axes[0, 0]
    ax.bar(range(len(values)), values)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=6, rotation=30)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    plotting.save(fig, path, dpi=90)


def plot_fig11(path, cols) -> None:
    """Fig. 11: bytes per layer on each mesh link (both directions summed), one row per
    mapping, one column per phase; one colour scale per phase, fitted to its data, so the
    mappings compare directly. Link names are `D rR cC` (D = E/W: link (R, C)-(R, C+1),
    S/N: (R, C)-(R+1, C)), as `cfg.topo.link_names`."""
    names = [str(x) for x in cols["link"]]
    d = [n.split()[0] for n in names]
    r = np.asarray([int(n.split()[1][1:]) for n in names])
    c = np.asarray([int(n.split()[2][1:]) for n in names])
    horiz = np.isin(d, ("E", "W"))
    rows_, cols_ = int(r[horiz].max()) + 1, int(c[horiz].max()) + 2
    maps = list(dict.fromkeys(str(x) for x in cols["mapping"]))
    phases = list(dict.fromkeys(str(x) for x in cols["phase"]))
    bytes_ = np.asarray(cols["bytes"], np.float64)
    mapping, phase = np.asarray(cols["mapping"]).astype(str), np.asarray(cols["phase"]).astype(str)
    titles = {"baseline": "baseline (compact TP blocks)", "er": "ER-Mapping (001 §IV-A)"}
    fig, axes = plotting.figure(len(maps), len(phases), width=3.9, height=3.4)
    grids = {}
    for m in maps:
        for ph in phases:
            sel = (mapping == m) & (phase == ph)
            h = np.zeros((rows_, cols_ - 1))
            v = np.zeros((rows_ - 1, cols_))
            for di, ri, ci, b in zip(np.asarray(d)[sel], r[sel], c[sel], bytes_[sel],
                                     strict=True):
                (h if di in ("E", "W") else v)[ri, ci] += b / 1e6  # MB, both directions
            grids[(m, ph)] = (h, v)
    for j, ph in enumerate(phases):
        lo, hi = plotting.color_limits(np.concatenate(
            [np.concatenate([g[0].ravel(), g[1].ravel()]) for (m, p), g in grids.items()
             if p == ph]))
        for i, m in enumerate(maps):
            ax = axes[i, j]
            lc = plotting.mesh_links(ax, rows_, cols_, *grids[(m, ph)], vmin=lo, vmax=hi)
            ax.set_title(f"{titles.get(m, m)}: {ph}", fontsize=8)
        fig.colorbar(lc, ax=axes[:, j], label=f"{ph} traffic per link (MB per layer)",
                     shrink=0.8)
    fig.suptitle("001 Fig. 11: link traffic on a 4x4 WSC, TP = 4, qwen3-235b-a22b "
                 "(dots: dies)", fontsize=9)
    plotting.save(fig, path, dpi=90)
