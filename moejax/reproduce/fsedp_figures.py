"""`moejax reproduce fsedp --replot DIR`: paper 000's figures redrawn from the CSVs a run
wrote, with the study's own figure functions (model, token count and iterations of each
figure: the defaults of the study's figure functions and the grid in summary.json)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from moejax import plotting
from moejax.reproduce import fsedp as fs


def _rows(path: Path) -> dict[str, list]:
    return {k: list(v) for k, v in plotting.read_csv(path).items()}


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """Every figure of the fsedp run in `src` into `out`."""
    src, out = Path(src), Path(out)
    grid = json.loads((src / "summary.json").read_text(encoding="utf-8")).get("grid", {})
    names: list[str] = []

    def have(name):
        return (src / f"{name}.csv").is_file()

    def done(name):
        names.append(f"{name}.png")
        return out / f"{name}.png"

    if have("fig9_layer_latency"):
        r = _rows(src / "fig9_layer_latency.csv")
        r["tokens"] = [int(t) for t in r["tokens"]]
        fs._plot_grouped(done("fig9_layer_latency"), r, "latency_s", "layer latency",
                         "000 Fig. 9: single MoE layer latency, chiplet-2x2", log=True)
    if have("fig12_onchip_memory"):
        fs._plot_memory(done("fig12_onchip_memory"), _rows(src / "fig12_onchip_memory.csv"))
    if have("fig15_ablation"):
        r = _rows(src / "fig15_ablation.csv")
        m, t = _default(fs.fig15, "model_name"), _default(fs.fig15, "tokens")
        fs._plot_bars(done("fig15_ablation"), r["config"], r["utilization"],
                      "compute utilization", f"000 Fig. 14/15: end-to-end {m}, {t} tokens, "
                      f"{grid.get('e2e_iterations', '?')} iterations, chiplet-2x2")
    if have("fig16_design_space"):
        fs.plot_fig16(out, _rows(src / "fig16_design_space.csv"),
                      _default(fs.fig16, "model_name"), _default(fs.fig16, "tokens"))
        names.append("fig16_design_space.png")
    if have("fig17_microslices"):
        fs.plot_fig17(out, _rows(src / "fig17_microslices.csv"), _default(fs.fig17, "tokens"))
        names.append("fig17_microslices.png")
    if have("fig18_scaling"):
        fs.plot_fig18(out, _rows(src / "fig18_scaling.csv"), _default(fs.fig18, "model_name"),
                      _default(fs.fig18, "tokens"))
        names.append("fig18_scaling.png")
    return names
