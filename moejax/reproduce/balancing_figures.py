"""Figures of the expert-balancing study (`moejax reproduce balancing`), each drawn from the
rows of its CSV (and smoothed.json), so `--replot DIR` redraws them from DIR alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce import balancing_data as data
from moejax.reproduce.balancing_claims import (
    DECODE_TOKENS_PER_DEVICE,
    LABELS,
    PLACEMENTS,
    REDUNDANT,
    TOKENS_PER_DEVICE,
    _row,
)
from moejax.reproduce.study import Grid, Rows


def _placements(rows: Rows) -> list[dict]:
    return plotting.row_dicts(rows.cols, bools=("fits_memory",))


def placements_latency(path: Path, rows: Rows, grid: Grid) -> None:
    plot_placements(path, _placements(rows), grid, "latency_ms_mean",
                    "Expert balancing: held-out MoE layer latency of synchronous EP per "
                    f"placement, {TOKENS_PER_DEVICE} tokens per device (1.0 = EPLB, 1 "
                    "redundant slot)",
                    "layer latency / EPLB's")


def placements_load(path: Path, rows: Rows, grid: Grid) -> None:
    plot_placements(path, _placements(rows), grid, "load_ratio_p99",
                    "Expert balancing: held-out max / mean device load, p99 over batches "
                    "(1.0 = EPLB, 1 redundant slot)", "p99 max/mean load / EPLB's")


def redundancy(path: Path, rows: Rows, grid: Grid) -> None:
    plot_redundancy(path, _placements(rows), grid)


def rebalancing(path: Path, rows: Rows, grid: Grid) -> None:
    plot_rebalance(path, plotting.row_dicts(rows.cols), grid, rows.more.get("smoothed.json", {}))


def plot_placements(path, rows, grid: Grid, metric: str, title: str, ylabel: str):
    """One row per platform; per workload, each placement's `metric` relative to EPLB with
    one redundant slot, on a log axis (missing bars: not tuned there, or the slots do not
    fit in memory)."""
    names = [*PLACEMENTS, "oracle"]
    fig, axes = plotting.figure(len(grid.platforms), 1, width=11.0, height=2.5)
    width = 0.85 / len(names)
    for ax, pname in zip(axes[:, 0], grid.platforms, strict=True):
        for j, name in enumerate(names):
            ref = [_row(rows, workload=w, platform=pname, placement="eplb-1")[metric]
                   for w in grid.workloads]
            vals = [_row(rows, workload=w, platform=pname, placement=name)[metric] / r
                    for w, r in zip(grid.workloads, ref, strict=True)]
            ax.bar(np.arange(len(grid.workloads)) + j * width, vals, width, color=f"C{j}",
                   label=LABELS[name])
        ax.axhline(1.0, color="k", lw=0.6)
        plotting.log_axis(ax, "y", base=2)
        ax.set_ylim(0.4, 6.0)
        ax.set_xticks(np.arange(len(grid.workloads)) + 0.425 - width / 2,
                      [data.WORKLOADS[w].label for w in grid.workloads], fontsize=7)
        ax.set_title(pname, fontsize=8, loc="left")
        ax.set_ylabel(ylabel, fontsize=7)
    axes[0, 0].legend(fontsize=6, ncol=5, loc="upper center")
    fig.suptitle(title, fontsize=9)
    plotting.save(fig, path)


def plot_redundancy(path, rows, grid: Grid):
    fig, axes = plotting.figure(1, len(grid.platforms), width=5.0, height=4.2)
    for ax, pname in zip(axes[0], grid.platforms, strict=True):
        for i, wname in enumerate(grid.workloads):
            r = [_row(rows, workload=wname, platform=pname, placement=f"eplb-{s}")
                 for s in REDUNDANT]
            ok = [x["fits_memory"] for x in r]
            base = r[0]["latency_ms_mean"]
            ax.plot([s for s, f in zip(REDUNDANT, ok, strict=True) if f],
                    [x["latency_ms_mean"] / base for x, f in zip(r, ok, strict=True) if f],
                    marker="o", color=f"C{i}", label=f"{data.WORKLOADS[wname].label}, prefill")
            dec = r[0]["decode_latency_ms_mean"]
            ax.plot([s for s, f in zip(REDUNDANT, ok, strict=True) if f],
                    [x["decode_latency_ms_mean"] / dec for x, f in zip(r, ok, strict=True)
                     if f], marker="x", ls="--", color=f"C{i}",
                    label=f"{data.WORKLOADS[wname].label}, decode")
        ax.axhline(1.0, color="k", lw=0.6)
        plotting.log_axis(ax, "y", base=2)
        ax.set_xticks(REDUNDANT)
        ax.set_xlabel("redundant slots per device")
        ax.set_title(pname, fontsize=9)
    axes[0][0].set_ylabel("layer latency / EPLB without redundancy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=6, fontsize=6.5)
    fig.suptitle(f"Expert balancing: EPLB's held-out layer latency vs redundant slots per device\n"
                 f"(prefill {TOKENS_PER_DEVICE} / decode {DECODE_TOKENS_PER_DEVICE} tokens per "
                 f"device; points that do not fit in device memory are left out)", fontsize=9)
    plotting.save(fig, path)


def plot_rebalance(path, rows, grid: Grid, smoothed: dict):
    """One panel per (drifting workload, platform): iteration time vs R per window W
    (overlapped migration), the plan-once and never-planned levels, and where the study ran
    it, the bound without migration cost (free) at its best W."""
    wls = list(dict.fromkeys(w for w, _ in grid.rebalance))
    pls = list(dict.fromkeys(p for _, p in grid.rebalance))
    fig, axes = plotting.figure(len(wls), len(pls), width=4.6, height=3.2)
    for (wname, pname), ax in ((wp, axes[wls.index(wp[0]), pls.index(wp[1])])
                               for wp in grid.rebalance):
        here = [r for r in rows if r["workload"] == wname and r["platform"] == pname]
        sel = [r for r in here if r["migration"] == "overlapped"]
        static = next(r for r in sel if r["window"] == grid.rebalance_iterations)
        for i, wi in enumerate(grid.windows):
            rs = sorted((r for r in sel if r["window"] == wi and r["interval"] >= 1),
                        key=lambda r: r["interval"])
            ax.plot([r["interval"] for r in rs], [r["forward_ms"] / 1e3 for r in rs],
                    marker="o", color=f"C{i}", label=f"window W = {wi} iterations")
            once = next(r for r in sel if r["window"] == wi and r["interval"] == 0)
            ax.axhline(once["forward_ms"] / 1e3, color=f"C{i}", ls=":", lw=0.8)
        free = [r for r in here if r["migration"] == "free" and r["interval"] >= 1
                and r["window"] < grid.rebalance_iterations]
        if free:
            best = {}
            for r in free:
                best[r["interval"]] = min(best.get(r["interval"], np.inf), r["forward_ms"])
            ax.plot(sorted(best), [best[k] / 1e3 for k in sorted(best)], color="grey",
                    ls="--", marker=".", label="no migration cost (bound), best W")
        ax.axhline(static["forward_ms"] / 1e3, color="k", ls="--", lw=0.8,
                   label="never planned (contiguous)")
        if smoothed and smoothed["workload"] == wname and smoothed["platform"] == pname:
            ax.plot([smoothed["final"]["interval"]], [smoothed["final_ms"] / 1e3], marker="*",
                    ms=12, color="k", ls="none", label="smoothed-gradient (R, W)")
        plotting.log_axis(ax, "x")
        plotting.time_axis(ax, "y", "ms", "iteration time incl. stalls")
        ax.set_xlabel("re-plan interval R (iterations)")
        ax.set_title(f"{data.WORKLOADS[wname].label}, {pname}", fontsize=8)
        if (wname, pname) == grid.rebalance[0]:
            ax.legend(fontsize=6)
    fig.suptitle("Expert balancing: EPLB re-planned every R iterations from the last W iterations' "
                 "loads, 1 redundant slot, migration overlapped\n(dotted: planned once, at "
                 "iteration W, in the window's colour)", fontsize=9)
    plotting.save(fig, path)

