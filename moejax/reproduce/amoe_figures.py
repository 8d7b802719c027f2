"""Figures of paper 002 (AMoE): the steady-state study (`steady_amoe.py`, shipped) and the
earlier finite-stream study (`amoe.run_finite`), drawn through `moejax.output.plotting`; the
steady study's figures from the rows of their CSV, so `moejax reproduce amoe --replot DIR`
redraws them from DIR.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows

SYSTEMS = {  # steady study: CSV `system` -> legend
    "aep": "AMoE: asynchronous EP, defragging scheduler (aep-defrag)",
    "sync": "synchronous EP, SGLang costs (ep-sync)",
    "sync_roofline": "synchronous EP, roofline costs (ep-sync-roofline)",
}
POLICIES = {  # catalog policy -> legend (002 §3-4, §5.3)
    "aep-defrag": "AMoE, defragging scheduler (aep-defrag)",
    "aep-mtfs": "AMoE, most-tokens-first (aep-mtfs)",
    "aep-flfs": "AMoE, first-layer-first (aep-flfs)",
    "ep-sync": "synchronous EP baseline (ep-sync)",
}


def _finite(rows, key):
    return [r for r in rows if np.isfinite(r[key])]


def curves(path: Path, rows, panels, title: str, x: str = "throughput_tok_s",
           group: str = "system") -> None:
    """Mean ITL (ms) against throughput (k tok/s), one line per system (or policy), one panel
    per `(label, match)`; steady rows keep the spread-start points only."""
    names = SYSTEMS if group == "system" else POLICIES
    fig, axes = plotting.figure(1, len(panels), width=4.0, height=3.4)
    for ax, (label, match) in zip(axes[0], panels, strict=True):
        xs_all = []
        for i, (key, legend) in enumerate(names.items()):
            sel = [r for r in rows if r[group] == key and r.get("start", "spread") == "spread"
                   and all(r[k] == v for k, v in match.items())]
            sel = [r for r in _finite(sel, x) if np.isfinite(r["itl_mean_s"])]
            if sel:
                xs = [r[x] / 1e3 for r in sel]
                xs_all += xs
                ax.plot(xs, [r["itl_mean_s"] for r in sel], "o-", color=f"C{i}", label=legend)
        plotting.log_if_wide(ax, "x", xs_all, base=2)
        plotting.time_axis(ax, "y", "ms", "mean inter-token latency")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("throughput (k tok/s)")
    seen = {}  # every line drawn in any panel, once (a system may be absent from some)
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=3, fontsize=7)
    fig.suptitle(title, fontsize=10)
    plotting.save(fig, path)


def open_loop(path: Path, rows) -> None:
    """Fig. 9(b): ITL mean and p99 against delivered throughput; delivered against offered."""
    fig, axes = plotting.figure(1, 2, width=4.2, height=3.3)
    t = [r["throughput_tok_s"] / 1e3 for r in rows]
    axes[0, 0].plot(t, [r["itl_mean_s"] for r in rows], "o-", label="mean ITL")
    axes[0, 0].plot(t, [r["itl_p99_s"] for r in rows], "s--", label="p99 ITL")
    axes[0, 0].set_xlabel("delivered throughput (k tok/s)")
    plotting.time_axis(axes[0, 0], "y", "ms", "inter-token latency")
    axes[0, 0].legend(fontsize=7)
    off = [r["offered_tok_s"] / 1e3 for r in rows]
    axes[0, 1].plot(off, t, "o-", label="simulated")
    top = max(max(off), max(t))
    axes[0, 1].plot([0, top], [0, top], "k:", lw=0.8, label="delivered = offered")
    axes[0, 1].set_xlabel("offered load (k tok/s)")
    axes[0, 1].set_ylabel("delivered throughput (k tok/s)")
    axes[0, 1].legend(fontsize=7)
    fig.suptitle("002 Fig. 9(b): AMoE (aep-defrag) open loop, Poisson arrivals, "
                 "medium top-1, 8x A100", fontsize=9)
    plotting.save(fig, path)


def rates(path: Path, cols, title: str) -> None:
    """Fig. 12: completions per second per scheduler against the input rate, over time."""
    fig, axes = plotting.figure(1, 1, width=5.6, height=3.6)
    ax = axes[0, 0]
    styles = {"aep-flfs": "-", "aep-defrag": "--", "aep-mtfs": "-."}
    for i, (pol, style) in enumerate(styles.items()):
        if f"{pol}_done_per_s" in cols:
            ax.plot(cols["t_s"], cols[f"{pol}_done_per_s"], style, color=f"C{i}",
                    label=f"completions, {POLICIES[pol]}")
    ax.plot(cols["t_s"], cols["aep-flfs_input_per_s"], ":", color="k",
            label="arrivals (the same Poisson stream for every scheduler)")
    t = np.asarray(cols["t_s"], np.float64)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"requests per second ({t[1] - t[0]:.3g} s bins)" if len(t) > 1
                  else "requests per second")
    ax.legend(fontsize=6.5)
    ax.set_title(title, fontsize=9)
    plotting.save(fig, path)


def queue_depth(path: Path, qdepth, bin_s: float) -> None:
    """Finite study, Fig. 7: ready tokens per μ-queue (block) of attention rank 0 over time."""
    q = np.asarray(qdepth, np.float64)
    fig, axes = plotting.figure(1, 1, width=5.6, height=3.4)
    ax = axes[0, 0]
    plotting.heatmap(ax, q.T, cmap="viridis", label="ready tokens in the queue",
                     extent=(0, q.shape[0] * bin_s, 0, q.shape[1]))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("block (layer)")
    ax.set_title("002 Fig. 7: μ-queue depth, attention rank 0, MTFS scheduler", fontsize=9)
    plotting.save(fig, path)


# --- the steady-state study's figures, from their CSV rows ---------------------------------


def closed_loop(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 9: one panel per (top-k, workload) curve of the closed-loop rows."""
    rows9 = plotting.row_dicts(rows.cols, ints=("top_k",))
    curves_ = list(dict.fromkeys((r["top_k"], r["workload"]) for r in rows9))
    n = [r["concurrency_target"] for r in rows9]
    curves(path, rows9, [(f"top-{k} {w}", {"top_k": k, "workload": w}) for k, w in curves_],
           f"002 Fig. 9: closed-loop sweeps, N = {min(n):.0f}-{max(n):.0f} requests "
           "in flight, 8x A100")


def scaling(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 10: one panel per platform (2 nodes, 16 experts; 1 node, 8 experts)."""
    rows10 = plotting.row_dicts(rows.cols, ints=("top_k",))
    plats = list(dict.fromkeys(r["platform"] for r in rows10))
    label = {p: ("16 GPUs (2 nodes, 40 GB), 16 experts" if "16" in p
                 else "8 GPUs (1 node, 40 GB), 8 experts") for p in plats}
    curves(path, rows10, [(label[p], {"platform": p}) for p in plats],
           "002 Fig. 10: scaling to 2 nodes, medium workload, top-1")


def open_loop_figure(path: Path, rows: Rows, grid: Grid) -> None:
    open_loop(path, plotting.row_dicts(rows.cols))


def steady_rates(path: Path, rows: Rows, grid: Grid) -> None:
    rates(path, rows.cols, "002 Fig. 12: arrivals vs completions, top-1, 80% load")


# --- the finite-stream study's figures -----------------------------------------------------


def finite_curves(path: Path, rows: Rows, grid: Grid) -> None:
    """Finite study, Fig. 9: one panel per (top-k, workload), one line per policy."""
    rows9 = plotting.row_dicts(rows.cols, ints=("top_k",))
    panels = list(dict.fromkeys((r["top_k"], r["workload"]) for r in rows9))
    curves(path, rows9, [(f"top-{k} {w}", {"top_k": k, "workload": w}) for k, w in panels],
           "002 Fig. 9 (finite streams): AMoE vs synchronous EP, 8x A100", group="policy")


def finite_scaling(path: Path, rows: Rows, grid: Grid) -> None:
    curves(path, plotting.row_dicts(rows.cols, ints=("top_k",)),
           [("16 GPUs, 16 experts, top-1", {})], "002 Fig. 10 (finite streams): 2 nodes",
           group="policy")


def finite_rates(path: Path, rows: Rows, grid: Grid) -> None:
    rates(path, rows.cols, "002 Fig. 12 (finite streams): arrivals vs completions")


def finite_queue_depth(path: Path, rows: Rows, grid: Grid) -> None:
    """Finite study, Fig. 7 from fig7_queue_depth.csv (one column per block), in the time
    bins of fig12_rates.csv."""
    q = np.stack([np.asarray(v, np.float64) for v in rows.cols.values()], 1)
    t = np.asarray(rows.more.get("fig12_rates.csv", {}).get("t_s", []), np.float64)
    queue_depth(path, q, float(t[1] - t[0]) if len(t) > 1 else 1.0)
