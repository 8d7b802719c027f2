"""Figures of paper 004 (DySHARP), drawn through `moejax.output.plotting` from the columns the study
writes to CSV, so `moejax reproduce dysharp --replot DIR` redraws them from DIR alone. Legend
names are the catalog policies' own one-line descriptions (`policies/<name>.toml`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows

NAMES = {  # catalog policy -> legend (policies/<name>.toml first line)
    "deepep": "DeepEP: per-rank all-to-all, serial",
    "nvls": "NVLS: multimem all-gather + ld_reduce",
    "fastermoe": "FasterMoE: coarse comm/GEMM pipeline",
    "tutel": "Tutel: adaptive pipelining",
    "ccfuser": "CCFuser: fused comm+GEMM",
    "comet": "COMET: two fused kernels, per-pair bytes",
    "comet-rank": "COMET with per-rank bytes (other reading)",
    "dualpipe": "DualPipe",
    "dysharp": "DySHARP: in-switch multicast/reduction + fusion",
    "dysharp-basic": "DySHARP-Basic: in-switch, serial phases",
    "dysharp-comet": "DySHARP-COMET: in-switch in COMET's kernels",
    "fusion-only": "Fusion-only: DySHARP fusion, DeepEP bytes",
    "explicit-fused": "explicit addresses + fusion",
}
ORDER = ("nvls", "deepep", "fastermoe", "tutel", "ccfuser", "comet", "dysharp")  # Fig. 15


def _name(n: str) -> str:
    return NAMES.get(n, n)


def _legend_below(fig, ax, ncol: int = 2) -> None:
    labels = ax.get_legend_handles_labels()[1]
    if labels and max(len(x) for x in labels) > 45:
        ncol = 1
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=ncol,
               fontsize=6.5)


def bars(path: Path, labels, series: dict, ylabel: str, title: str, unit: str = "") -> None:
    """Grouped bars, one group per label, one bar per series; `unit` "MB" shows bytes in MB."""
    fig, ax = plotting.figure(width=max(5.5, 0.35 * len(labels) * max(len(series), 1)),
                              height=3.8)
    ax = ax[0, 0]
    w = 0.8 / max(len(series), 1)
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(np.arange(len(labels)) + i * w, vals, w, label=_name(name), color=f"C{i}")
    ax.set_xticks(np.arange(len(labels)) + 0.4 - w / 2, labels, fontsize=7)
    if unit:  # bytes, in MB unless the bars reach 10 GB
        big = max(float(np.max(v)) for v in series.values()) >= 1e10
        plotting.bytes_axis(ax, "y", "GB" if big else "MB", ylabel)
    else:
        ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if len(series) > 1:
        _legend_below(fig, ax)
    plotting.save(fig, path)


def lines(path: Path, x, series: dict, xlabel: str, ylabel: str, title: str,
          time: bool = False) -> None:
    """One line per series against `x` (log x where it spans > 20x); `time`: values in
    seconds, shown in ms."""
    fig, ax = plotting.figure(width=5.5, height=3.8)
    ax = ax[0, 0]
    for i, (name, vals) in enumerate(series.items()):
        ax.plot(x, vals, marker="o", color=f"C{i}", label=name)
    ax.set_xlabel(xlabel)
    if time:
        plotting.time_axis(ax, "y", "ms", ylabel)
    else:
        ax.set_ylabel(ylabel)
    plotting.log_if_wide(ax, "x", x, base=2)
    ax.set_title(title, fontsize=9)
    _legend_below(fig, ax)
    plotting.save(fig, path)


def fig2(path: Path, c: dict) -> None:
    """Fig. 2: share of DeepEP's bytes DySHARP does not send, and the ideal speedup of fused
    DySHARP comm over serial DeepEP comm, simulated and closed form, against top-k."""
    fig, ax = plotting.figure(1, 2, width=4.2, height=3.4)
    k = c["top_k"]
    ax[0, 0].plot(k, c["redundancy"], "o-", label="simulated (routing traces)")
    ax[0, 0].plot(k, c["redundancy_closed_form"], "k--", label="closed form (uniform)")
    ax[0, 0].set_ylabel("redundant share of DeepEP's bytes")
    ax[0, 0].set_title("004 Fig. 2a: redundancy", fontsize=9)
    ax[0, 1].plot(k, c["ideal_speedup"], "o-", label="simulated (routing traces)")
    ax[0, 1].plot(k, c["ideal_closed_form"], "k--", label="closed form (uniform)")
    ax[0, 1].set_ylabel("ideal comm speedup (x)")
    ax[0, 1].set_title("004 Fig. 2b: ideal speedup", fontsize=9)
    for a in ax[0]:
        a.set_xlabel("top-k")
        plotting.log_if_wide(a, "x", k, span=10, base=2)
    _legend_below(fig, ax[0, 0])
    fig.suptitle("256 experts on 32 GPUs", fontsize=9)
    plotting.save(fig, path)


# --- each figure from the rows read back from its CSV ---------------------------------------


def _arrays(rows: Rows) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in rows.cols.items()}


def fig2_figure(path: Path, rows: Rows, grid: Grid) -> None:
    fig2(path, _arrays(rows))


def fig19(path: Path, rows: Rows, grid: Grid) -> None:
    c = _arrays(rows)
    lines(path, c["top_k"],
          {"ideal (payload only, one unicast per rank)": c["ideal"],
           "DySHARP multimem packet": c["dysharp"],
           "explicit: one 8 B address per target": c["explicit"]},
          "targets per packet (top-k)", "payload efficiency (payload / wire bytes)",
          "004 Fig. 19a: payload efficiency")


def fig15(path: Path, rows: Rows, grid: Grid) -> None:
    c = _arrays(rows)
    bars(path, list(c["config"]),
         {n: c[f"{n}_training_ms"] / c["dysharp_training_ms"] for n in ORDER},
         "layer time / DySHARP's (training)",
         "004 Fig. 15: MoE layer, training (fwd + bwd), gh200-nvl32")


def fig18(path: Path, rows: Rows, grid: Grid) -> None:
    c = _arrays(rows)
    bars(path, list(c["config"]),
         {n: c[f"{n}_MB"] * 1e6 for n in ("deepep", "nvls", "comet", "dysharp")},
         "NVLink traffic per layer, forward", "004 Fig. 18: traffic", unit="B")


def fig16(path: Path, rows: Rows, grid: Grid) -> None:
    c = _arrays(rows)
    lat = dict(zip(c["system"], c["latency_ms"], strict=True))
    fig, ax = plotting.figure(width=6.0, height=3.6)
    ax[0, 0].barh(np.arange(len(lat)), [lat["deepep"] / v for v in lat.values()],
                  color=[f"C{i}" for i in range(len(lat))])
    ax[0, 0].set_yticks(np.arange(len(lat)), [_name(n) for n in lat], fontsize=7)
    ax[0, 0].axvline(1.0, color="k", lw=0.6)
    ax[0, 0].set_xlabel("speedup over DeepEP (layer, training)")
    ax[0, 0].set_title("004 Fig. 16: ablation at L-8", fontsize=9)
    plotting.save(fig, path)


def sweep_lines(key: str, xlabel: str, title: str):
    """A plot of layer time (training) against the sweep column `key`, one line per system."""
    def draw(path: Path, rows: Rows, grid: Grid) -> None:
        c = _arrays(rows)
        lines(path, c[key], {_name(k[:-3]): c[k] * 1e-3 for k in c if k.endswith("_ms")},
              xlabel, "MoE layer time, training", title, time=True)
    return draw


fig22 = sweep_lines("seq", "tokens per GPU", "004 Fig. 22: sequence length, L-8")
fig23 = sweep_lines("std", "routing std (normal)", "004 Fig. 23: routing skew, L-8")
fig24 = sweep_lines("alpha", "power-law alpha", "004 Fig. 24: power-law routing, L-8")
fig30 = sweep_lines("tile_tokens", "tile size (tokens)", "004 Fig. 30: tile size, S-8")


def fig21(path: Path, rows: Rows, grid: Grid) -> None:
    c = _arrays(rows)
    series = {}
    for k in c:
        if k.endswith("_ms"):
            model, name = k[:-3].split("_", 1)
            series[f"{model.upper()}, {_name(name)}"] = c[k] * 1e-3
    lines(path, c["gpus"], series, "GPUs (tokens per GPU fixed)", "MoE layer time, training",
          "004 Fig. 21: GPU count", time=True)
