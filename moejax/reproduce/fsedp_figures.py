"""`moejax reproduce fsedp --replot DIR`: paper 000's figures redrawn from the CSVs a run
wrote, with the study's own figure functions (model, token count and iterations of each
figure: the defaults of the study's figure functions and the grid in summary.json), on the
same rows the study draws (Fig. 15: the 64-token configurations; Fig. 17: the compute-only
0.5 us overhead reading, the others are in the CSV for the claim)."""

from __future__ import annotations

import inspect
from pathlib import Path

from moejax.reproduce import fsedp as fs
from moejax.reproduce.figure_io import FigureDir

FIG17_DRAWN = "ctrl 0.5us"  # the overhead reading `fsedp.fig17` draws


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def _select(rows: dict, keep) -> dict:
    """`rows` (columns of lists) restricted to the indices `keep`."""
    return {k: [v[i] for i in keep] for k, v in rows.items()}


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """Every figure of the fsedp run in `src` into `out`."""
    d = FigureDir(src, out)
    grid = d.summary().get("grid", {})
    if d.has("fig9_layer_latency"):
        r = d.lists("fig9_layer_latency")
        r["tokens"] = [int(t) for t in r["tokens"]]
        fs._plot_grouped(d.png("fig9_layer_latency"), r, "latency_s", "layer latency",
                         "000 Fig. 9: single MoE layer latency, chiplet-2x2", log=True)
    if d.has("fig12_onchip_memory"):
        fs._plot_memory(d.png("fig12_onchip_memory"), d.lists("fig12_onchip_memory"))
    if d.has("fig15_ablation"):
        r = d.lists("fig15_ablation")
        r = _select(r, [i for i, c in enumerate(r["config"]) if "tok" not in c])  # 64 tokens
        m, t = _default(fs.fig15, "model_name"), _default(fs.fig15, "tokens")
        fs._plot_bars(d.png("fig15_ablation"), r["config"], r["utilization"],
                      "compute utilization", f"000 Fig. 14/15: end-to-end {m}, {t} tokens, "
                      f"{grid.get('e2e_iterations', '?')} iterations, chiplet-2x2")
    if d.has("fig16_design_space"):
        d.png("fig16_design_space")
        fs.plot_fig16(d.out, d.lists("fig16_design_space"), _default(fs.fig16, "model_name"),
                      _default(fs.fig16, "tokens"))
    if d.has("fig17_microslices"):
        r = d.lists("fig17_microslices")
        if "overhead" in r:
            r = _select(r, [i for i, o in enumerate(r["overhead"]) if o == FIG17_DRAWN])
        d.png("fig17_microslices")
        fs.plot_fig17(d.out, r, _default(fs.fig17, "tokens"))
    if d.has("fig18_scaling"):
        d.png("fig18_scaling")
        fs.plot_fig18(d.out, d.lists("fig18_scaling"), _default(fs.fig18, "model_name"),
                      _default(fs.fig18, "tokens"))
    return d.names
