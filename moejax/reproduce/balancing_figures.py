"""`moejax reproduce balancing --replot DIR`: the EPLB study's figures redrawn from the CSVs,
smoothed.json and summary.json (its grid) a run wrote, with the study's own figure functions."""

from __future__ import annotations

import json
from pathlib import Path

from moejax.reproduce import balancing as bal
from moejax.reproduce.figure_io import FigureDir


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def plot_from_dir(src: Path, out: Path) -> list[str]:
    """The four figures of the balancing run in `src` into `out`."""
    d = FigureDir(src, out)
    summary = d.summary()
    grid = bal.Grid(**{k: _tuples(v) for k, v in summary["grid"].items()})
    tpd, dec = summary["tokens_per_device"], summary["decode_tokens_per_device"]
    rows = d.rows("placements", bools=("fits_memory",))
    bal.plot_placements(d.png("placements_latency"), rows, grid, "latency_ms_mean",
                        f"Issue 19: held-out MoE layer latency of synchronous EP per placement, "
                        f"{tpd} tokens per device (1.0 = EPLB, 1 redundant slot)",
                        "layer latency / EPLB's")
    bal.plot_placements(d.png("placements_load"), rows, grid, "load_ratio_p99",
                        "Issue 19: held-out max / mean device load, p99 over batches "
                        "(1.0 = EPLB, 1 redundant slot)", "p99 max/mean load / EPLB's")
    if (tpd, dec) == (bal.TOKENS_PER_DEVICE, bal.DECODE_TOKENS_PER_DEVICE):
        bal.plot_redundancy(d.png("redundancy"), rows, grid)  # its title quotes the constants
    if d.has("rebalancing"):
        smoothed = d.src / "smoothed.json"
        bal.plot_rebalance(d.png("rebalancing"), d.rows("rebalancing"), grid,
                           json.loads(smoothed.read_text(encoding="utf-8"))
                           if smoothed.is_file() else {})
    return d.names
