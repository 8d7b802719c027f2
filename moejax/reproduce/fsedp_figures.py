"""Paper 000 (FSE-DP) figures, each drawn by its own plot from the rows of its CSV
(`moejax reproduce fsedp`, and `--replot DIR` from DIR's CSVs alone): Fig. 9 on the latency
rows, Fig. 12 on the memory rows, Fig. 14/15 on the 64-token configurations, Fig. 16 heatmaps,
Fig. 17 on the compute-only 0.5 us overhead reading (the others are in the CSV for the
claim), Fig. 18 per platform."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.fsedp_claims import DIE_BUDGET, MB, MODELS, SYSTEMS, TOKENS, _lookup
from moejax.reproduce.study import Grid, Rows

FIG15_MODEL, FIG15_TOKENS = "qwen3-30b-a3b", 64  # Fig. 14/15 end-to-end point
FIG16_MODEL, FIG16_TOKENS = "qwen3-30b-a3b", 64  # Fig. 16 design space point
FIG17_TOKENS = 256
FIG17_DRAWN = "ctrl 0.5us"  # the overhead reading Fig. 17 draws
FIG18_MODEL, FIG18_TOKENS = "qwen3-30b-a3b", 256


def fig9(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_grouped(path, rows.cols, "latency_s", "layer latency",
                  "000 Fig. 9: single MoE layer latency, chiplet-2x2", log=True)


def fig12(path: Path, rows: Rows, grid: Grid) -> None:
    _plot_memory(path, rows.cols)


def fig15(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 14/15 bars of the 64-token configurations (the CSV also holds the 256 / 1024-token
    token-buffering rows the claim reads)."""
    r = rows.cols
    at64 = [i for i, c in enumerate(r["config"]) if "tok" not in c]
    _plot_bars(path, [r["config"][i] for i in at64], [r["utilization"][i] for i in at64],
               "compute utilization", f"000 Fig. 14/15: end-to-end {FIG15_MODEL}, "
               f"{FIG15_TOKENS} tokens, {grid.e2e_iterations} iterations, chiplet-2x2")


def fig17(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 17 on the compute-only overhead reading (the claim's readings are extra rows)."""
    r = rows.cols
    if "overhead" in r:
        r = {k: [v for v, o in zip(r[k], r["overhead"], strict=True) if o == FIG17_DRAWN]
             for k in r}
    plot_fig17(path, r, FIG17_TOKENS)


def fig16(path: Path, rows: Rows, grid: Grid) -> None:
    plot_fig16(path, rows.cols, FIG16_MODEL, FIG16_TOKENS)


def fig18(path: Path, rows: Rows, grid: Grid) -> None:
    plot_fig18(path, rows.cols, FIG18_MODEL, FIG18_TOKENS)


# Legend entries, explained (000 §VI-A / §VI-C; docs/reproduction/fsedp.md "mechanisms").
SYSTEM_LABELS = {
    "EP": "EP (experts contiguous, token all-to-all)",
    "Hydra": "Hydra (expert replication)",
    "FSE-DP": "FSE-DP = A2 (micro-slice streaming, Alg. 1)",
    "FSE-DP+paired": "FSE-DP+paired = A3 (A2 + paired load)",
}
ABLATION_LABELS = {
    "A1": "A1: naive FSE-DP (tokens all-to-all per expert, W/D per die)",
    "A2": "A2: micro-slice streaming, Alg. 1 + Rules 1-4",
    "A3": "A3: A2 + paired load (hot/cold order)",
    "A4": "A4: A3 + Rule 5 (DDR split by free space)",
    "A5": "A5@s: A3 + token buffering (Alg. 2), QoS slack s",
    "EP": SYSTEM_LABELS["EP"],
    "Hydra": SYSTEM_LABELS["Hydra"],
}


def _plot_grouped(path, rows, y, ylabel, title, log=False):
    """One panel per model: bars per token count, one colour per system (y in seconds)."""
    fig, axes = plotting.figure(1, len(MODELS), width=3.5, height=3.6)
    w = 0.8 / len(SYSTEMS)
    for ax, mname in zip(axes[0], MODELS, strict=True):
        for j, s in enumerate(SYSTEMS):
            vals = [_lookup(rows, y, model=mname, tokens=t, system=s) for t in TOKENS]
            ax.bar(np.arange(len(TOKENS)) + j * w, vals, w, label=SYSTEM_LABELS.get(s, s))
        ax.set_xticks(np.arange(len(TOKENS)) + 0.4 - w / 2, [str(t) for t in TOKENS])
        ax.set_xlabel("tokens per iteration")
        ax.set_title(mname, fontsize=9)
        if log:
            _log_if_wide(ax, [v for i, v in enumerate(rows[y]) if rows["model"][i] == mname])
        plotting.time_axis(ax, "y", "ms", ylabel if ax is axes[0, 0] else "")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    fig.suptitle(title, fontsize=9)
    plotting.save(fig, path, dpi=90)


def _plot_memory(path, rows):
    """Fig. 12: package on-chip bytes (weights + tokens), max over token counts, per model."""
    fig, axes = plotting.figure(width=8.0, height=4.2)
    ax = axes[0, 0]
    w = 0.8 / len(SYSTEMS)
    colors = [f"C{j}" for j in range(len(SYSTEMS))]
    for j, s in enumerate(SYSTEMS):
        wts, tks = [], []
        for mname in MODELS:
            i = max((i for i in range(len(rows["model"]))
                     if rows["model"][i] == mname and rows["system"][i] == s),
                    key=lambda i: rows["onchip_bytes"][i])
            wts.append(rows["weight_bytes"][i])
            tks.append(rows["token_bytes"][i])
        x = np.arange(len(MODELS)) + j * w
        ax.bar(x, wts, w, color=colors[j], label=f"{SYSTEM_LABELS.get(s, s)}: weights")
        ax.bar(x, tks, w, bottom=wts, color=colors[j], alpha=0.45, hatch="//",
               label=f"{s}: tokens (stacked, hatched)")
    ax.set_xticks(np.arange(len(MODELS)) + 0.4 - w / 2, MODELS, fontsize=7)
    ax.axhline(32 * MB, color="k", lw=0.8, ls="--", label="32 MB on-chip (000 Table I)")
    _log_if_wide(ax, [*rows["onchip_bytes"], 32 * MB])
    plotting.bytes_axis(ax, "y", "MB", "peak on-chip memory, package")
    ax.set_title("000 Fig. 12: on-chip memory (weights + tokens), chiplet-2x2", fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=6,
               ncol=2)
    plotting.save(fig, path, dpi=90)


def _log_if_wide(ax, values) -> None:
    """A log y axis (labels at powers of ten only) when the values span more than a decade;
    a log axis over less than one decade would show no labelled tick at all."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 10:
        plotting.log_axis(ax, "y", base=10)


def _plot_bars(path, labels, values, ylabel, title):
    """Bars per configuration; A1-A5 and the baselines named in a legend below."""
    fig, axes = plotting.figure(width=8.0, height=4.6)
    ax = axes[0, 0]
    ax.bar(range(len(values)), values, color="C0")
    ax.set_xticks(range(len(values)), labels, fontsize=7, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    names = []
    for lab in labels:
        key = lab.split("@")[0]
        if key in ABLATION_LABELS and ABLATION_LABELS[key] not in names:
            names.append(ABLATION_LABELS[key])
    if names:  # text-only legend entries: what each bar label stands for
        from matplotlib.patches import Patch

        handles = [Patch(visible=False) for _ in names]
        fig.legend(handles, names, loc="outside lower left", fontsize=7, handlelength=0,
                   handletextpad=0, frameon=False)
    plotting.save(fig, path, dpi=90)


def plot_fig16(path: Path, rows: dict, model_name: str, tokens: int) -> None:
    """Fig. 16 heatmaps from its rows (also from fig16_design_space.csv)."""
    fig, axes = plotting.figure(1, 2, width=5.0, height=4.0)
    lo, hi = plotting.color_limits(rows["utilization"])  # the colour scale fits the data
    for ax, panel, (xk, yk) in zip(axes[0], "ab", (("ddr_gbps", "buffer_mb"),
                                                   ("ddr_gbps", "d2d_gbps")), strict=True):
        idx = [i for i, p in enumerate(rows["panel"]) if p == panel]
        xs = sorted({rows[xk][i] for i in idx})
        ys = sorted({rows[yk][i] for i in idx})
        z = np.full((len(ys), len(xs)), np.nan)
        for i in idx:
            z[ys.index(rows[yk][i]), xs.index(rows[xk][i])] = rows["utilization"][i]
        im = ax.imshow(z, origin="lower", aspect="auto", vmin=lo, vmax=hi, cmap="viridis")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys], fontsize=7)
        ax.set_xlabel("DDR bandwidth per die (GB/s)")
        ax.set_ylabel("weight buffer per die (MB)" if panel == "a" else "D2D link (GB/s)")
        for (yy, xx), v in np.ndenumerate(z):
            ax.text(xx, yy, f"{v:.3f}", ha="center", va="center", fontsize=6,
                    color="w" if v < (lo + hi) / 2 else "k")
        ax.set_title(f"({panel}) " + ("D2D 288 GB/s" if panel == "a" else "buffer 14 MB"),
                     fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="compute utilization (fraction of peak)")
    fig.suptitle(f"000 Fig. 16: DSE, {model_name}, {tokens} tokens (one vmapped sweep)",
                 fontsize=9)
    plotting.save(fig, path, dpi=90)


def plot_fig17(path: Path, rows: dict, tokens: int) -> None:
    """Fig. 17 curves from its rows (also from fig17_microslices.csv)."""
    fig, axes = plotting.figure(1, 2, width=5.0, height=3.8)
    for ax, mname in zip(axes[0], ("phi-3.5-moe", "qwen3-30b-a3b"), strict=True):
        idx = [i for i, v in enumerate(rows["model"]) if v == mname]
        for b in sorted({rows["buffer_mb"][i] for i in idx}):
            j = [i for i in idx if rows["buffer_mb"][i] == b]
            ax.plot([rows["num_microslices"][i] for i in j], [rows["latency_s"][i] for i in j],
                    marker="o", label=f"weight buffer {b:g} MB per die")
        plotting.log_axis(ax, "x", base=2)
        ax.set_xlabel("micro-slices per expert")
        plotting.time_axis(ax, "y", "ms", "MoE layer latency")
        ax.set_title(mname, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"000 Fig. 17: granularity sensitivity, {tokens} tokens", fontsize=9)
    plotting.save(fig, path, dpi=90)


def plot_fig18(path: Path, rows: dict, model_name: str, tokens: int) -> None:
    """Fig. 18 from its rows (also from fig18_scaling.csv)."""
    fig, axes = plotting.figure(width=7.0, height=4.0)
    ax = axes[0, 0]
    for name in ("EP", "Hydra", "FSE-DP+paired", DIE_BUDGET):
        j = [i for i, s in enumerate(rows["system"]) if s == name]
        ax.plot([rows["platform"][i] for i in j], [rows["utilization"][i] for i in j],
                marker="o", label=SYSTEM_LABELS.get(name, name))
    ax.set_ylabel("compute utilization (fraction of peak)")
    ax.set_xlabel("platform (chiplets)")
    ax.set_title(f"000 Fig. 18: scalability, {model_name}, {tokens} tokens", fontsize=9)
    ax.legend(fontsize=7)
    plotting.save(fig, path, dpi=90)
