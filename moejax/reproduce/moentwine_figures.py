"""`moejax reproduce moentwine --replot DIR`: paper 001's figures redrawn from the CSVs a run
wrote, with the study's own figure functions (`moentwine._plot_*`, `moentwine.plot_fig11`)."""

from __future__ import annotations

from pathlib import Path

from moejax.reproduce import moentwine as mt
from moejax.reproduce.figure_io import FigureDir


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """Every figure of the moentwine run in `src` into `out`."""
    d = FigureDir(src, out)
    if d.has("fig11_heatmaps"):
        mt.plot_fig11(d.png("fig11_heatmaps"), d.lists("fig11_heatmaps"))
    if d.has("fig13a_tokens"):
        mt._plot_lines(d.png("fig13a_tokens"), d.lists("fig13a_tokens"),
                       "tokens_per_group", "comm_s", "system",
                       "001 Fig. 13(a): communication per layer vs tokens per TP group")
    if d.has("fig13b_models"):
        mt._plot_bars(d.png("fig13b_models"), d.lists("fig13b_models"), "model",
                      "comm_s", "system", "001 Fig. 13(b): communication per layer by model")
    if d.has("fig13c_scales"):
        r = d.lists("fig13c_scales")
        mt._plot_simple_bars(d.png("fig13c_scales"),
                             [f"{p}\nTP={int(t)}" for p, t in zip(r["platform"], r["tp"],
                                                                  strict=True)],
                             [100 * x for x in r["reduction"]],
                             "ER comm reduction vs baseline (%)", "001 Fig. 13(c)")
    if d.has("fig13d_multiwafer"):
        r = d.lists("fig13d_multiwafer")
        r["tp"] = [int(t) for t in r["tp"]]
        mt._plot_bars(d.png("fig13d_multiwafer"), r, "tp", "comm_s", "mapping",
                      "001 Fig. 13(d): 4 x 8x8 wafers, comm per layer")
    if d.has("fig14a_esp"):
        r = d.lists("fig14a_esp")
        sel = [i for i, sc in enumerate(r["scale"]) if sc == "wsc-6x6"]
        mt._plot_bars(d.png("fig14a_esp"), {k: [v[i] for i in sel] for k, v in r.items()},
                      "model", "comm_s", "system",
                      "001 Fig. 14(a): ESP comm per layer (all-to-all + all-reduces), "
                      "6x6 vs 4-node DGX")
    if d.has("fig15_load_trace"):
        mt._plot_lines(d.png("fig15_load_trace"), d.lists("fig15_load_trace"),
                       "iteration", "max_over_mean", "strategy",
                       "001 Fig. 15: max / mean device load per iteration (wsc-8x8, qwen3)")
    if d.has("fig16_strategies"):
        mt._plot_bars(d.png("fig16_strategies"), d.lists("fig16_strategies"),
                      "scenario", "moe_compute_s", "strategy",
                      "001 Fig. 16: MoE compute per layer by balancing strategy")
    if d.has("fig17_nvl72"):
        r = d.lists("fig17_nvl72")
        mt._plot_simple_bars(d.png("fig17_nvl72"), r["system"],
                             [x / 1e6 for x in r["moe_throughput"]],
                             "MoE throughput per device\n(M token-expert pairs / s)",
                             "001 Fig. 17")
    return d.names
