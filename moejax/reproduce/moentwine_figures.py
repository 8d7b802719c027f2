"""`moejax reproduce moentwine --replot DIR`: paper 001's figures redrawn from the CSVs a run
wrote, with the study's own figure functions (`moentwine._plot_*`, `moentwine.plot_fig11`)."""

from __future__ import annotations

from pathlib import Path

from moejax import plotting
from moejax.reproduce import moentwine as mt


def _rows(path: Path) -> dict[str, list]:
    return {k: list(v) for k, v in plotting.read_csv(path).items()}


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """Every figure of the moentwine run in `src` into `out`."""
    src, out = Path(src), Path(out)
    names: list[str] = []

    def have(name):
        return (src / f"{name}.csv").is_file()

    def done(name):
        names.append(f"{name}.png")
        return out / f"{name}.png"

    if have("fig11_heatmaps"):
        mt.plot_fig11(done("fig11_heatmaps"), _rows(src / "fig11_heatmaps.csv"))
    if have("fig13a_tokens"):
        mt._plot_lines(done("fig13a_tokens"), _rows(src / "fig13a_tokens.csv"),
                       "tokens_per_group", "comm_s", "system",
                       "001 Fig. 13(a): communication per layer vs tokens per TP group")
    if have("fig13b_models"):
        mt._plot_bars(done("fig13b_models"), _rows(src / "fig13b_models.csv"), "model",
                      "comm_s", "system", "001 Fig. 13(b): communication per layer by model")
    if have("fig13c_scales"):
        r = _rows(src / "fig13c_scales.csv")
        mt._plot_simple_bars(done("fig13c_scales"),
                             [f"{p}\nTP={int(t)}" for p, t in zip(r["platform"], r["tp"],
                                                                  strict=True)],
                             [100 * x for x in r["reduction"]],
                             "ER comm reduction vs baseline (%)", "001 Fig. 13(c)")
    if have("fig13d_multiwafer"):
        r = _rows(src / "fig13d_multiwafer.csv")
        r["tp"] = [int(t) for t in r["tp"]]
        mt._plot_bars(done("fig13d_multiwafer"), r, "tp", "comm_s", "mapping",
                      "001 Fig. 13(d): 4 x 8x8 wafers, comm per layer")
    if have("fig14a_esp"):
        r = _rows(src / "fig14a_esp.csv")
        sel = [i for i, sc in enumerate(r["scale"]) if sc == "wsc-6x6"]
        mt._plot_bars(done("fig14a_esp"), {k: [v[i] for i in sel] for k, v in r.items()},
                      "model", "comm_s", "system",
                      "001 Fig. 14(a): ESP comm per layer (all-to-all + all-reduces), "
                      "6x6 vs 4-node DGX")
    if have("fig15_load_trace"):
        mt._plot_lines(done("fig15_load_trace"), _rows(src / "fig15_load_trace.csv"),
                       "iteration", "max_over_mean", "strategy",
                       "001 Fig. 15: max / mean device load per iteration (wsc-8x8, qwen3)")
    if have("fig16_strategies"):
        mt._plot_bars(done("fig16_strategies"), _rows(src / "fig16_strategies.csv"),
                      "scenario", "moe_compute_s", "strategy",
                      "001 Fig. 16: MoE compute per layer by balancing strategy")
    if have("fig17_nvl72"):
        r = _rows(src / "fig17_nvl72.csv")
        mt._plot_simple_bars(done("fig17_nvl72"), r["system"],
                             [x / 1e6 for x in r["moe_throughput"]],
                             "MoE throughput per device\n(M token-expert pairs / s)",
                             "001 Fig. 17")
    return names
