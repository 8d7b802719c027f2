"""`moejax reproduce balancing --replot DIR`: the EPLB study's figures redrawn from the CSVs,
smoothed.json and summary.json (its grid) a run wrote, with the study's own figure functions."""

from __future__ import annotations

import json
from pathlib import Path

from moejax import plotting
from moejax.reproduce import balancing as bal


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """The four figures of the balancing run in `src` into `out`."""
    src, out = Path(src), Path(out)
    summary = json.loads((src / "summary.json").read_text(encoding="utf-8"))
    grid = bal.Grid(**{k: _tuples(v) for k, v in summary["grid"].items()})
    tpd, dec = summary["tokens_per_device"], summary["decode_tokens_per_device"]
    rows = plotting.read_rows(src / "placements.csv", bools=("fits_memory",))
    names = ["placements_latency.png", "placements_load.png", "redundancy.png"]
    bal.plot_placements(out / names[0], rows, grid, "latency_ms_mean",
                        f"Issue 19: held-out MoE layer latency of synchronous EP per placement, "
                        f"{tpd} tokens per device (1.0 = EPLB, 1 redundant slot)",
                        "layer latency / EPLB's")
    bal.plot_placements(out / names[1], rows, grid, "load_ratio_p99",
                        "Issue 19: held-out max / mean device load, p99 over batches "
                        "(1.0 = EPLB, 1 redundant slot)", "p99 max/mean load / EPLB's")
    if (tpd, dec) == (bal.TOKENS_PER_DEVICE, bal.DECODE_TOKENS_PER_DEVICE):
        bal.plot_redundancy(out / names[2], rows, grid)  # its title quotes the constants
    else:
        names.pop()
    if (src / "rebalancing.csv").is_file():
        reb = plotting.read_rows(src / "rebalancing.csv")
        smoothed = json.loads((src / "smoothed.json").read_text(encoding="utf-8")) \
            if (src / "smoothed.json").is_file() else {}
        bal.plot_rebalance(out / "rebalancing.png", reb, grid, smoothed)
        names.append("rebalancing.png")
    return names
