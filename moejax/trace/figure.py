"""The figure of a trace analysis (`moejax trace inspect --plot`): sorted expert load,
per-layer skew, activated experts vs batch size, cross-layer affinity or temporal locality.

Its own module so that `analysis` (imported by fits and comparisons) does not load
matplotlib.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from moejax.output import plotting
from moejax.trace.analysis import analyze, sorted_load_profile
from moejax.trace.core import Trace


def plot_analysis(trace: Trace, path, meta: dict | None = None, title: str = "",
                  fitted: dict | None = None) -> Path:
    """A 2x2 PNG: sorted expert shares per layer, skew per layer, activated experts vs m,
    and cross-layer affinity / temporal locality. `fitted` (family -> sorted shares [E])
    overlays fitted generator profiles on the first panel."""
    a = analyze(trace, meta)
    e = trace.num_experts
    fig, ax = plotting.figure(2, 2, width=5.5, height=4.0)
    srt = sorted_load_profile(trace) * e
    ranks = np.arange(1, e + 1)
    for row in srt:
        ax[0, 0].plot(ranks, row, color="tab:blue", alpha=0.25, lw=0.8)
    ax[0, 0].plot(ranks, np.nanmean(srt, 0), color="k", lw=2, label="recorded (mean of layers)")
    for fam, prof in (fitted or {}).items():
        ax[0, 0].plot(ranks, np.asarray(prof) * e, "--", lw=1.5, label=f"fitted {fam}")
    per = "" if trace.has_tokens else " (mean of iterations)"
    plotting.log_axis(ax[0, 0], "x", base=2)
    pos = srt[np.isfinite(srt) & (srt > 0)]
    wide = pos.size and pos.max() / pos.min() > 64  # powers of ten over a wide span
    if not plotting.log_if_wide(ax[0, 0], "y", srt, span=10, base=10 if wide else 2):
        ax[0, 0].set_ylim(bottom=0)
    ax[0, 0].set(xlabel="expert rank (1 = busiest)", ylabel="load / mean load",
                 title="sorted expert load per layer" + per)
    ax[0, 0].legend(fontsize=8)
    skew = srt[:, 0]
    ax[0, 1].bar(np.arange(len(skew)), skew, color="tab:orange")
    ax[0, 1].axhline(1.0, color="k", lw=0.8)
    for a_ in (ax[0, 1], ax[1, 1]):  # layer indices: whole numbers only
        a_.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax[0, 1].set(xlabel="recorded layer (index)", ylabel="max / mean load",
                 title="per-layer skew" + per)
    act = a["activated"]
    meas = np.asarray(act["measured"], np.float64)
    ax[1, 0].plot(act["m"], act["uniform"], "k--", label="uniform (1-(1-k/E)^m)E, 003 §3.2")
    ax[1, 0].plot(act["m"], np.nanmean(np.asarray(act["independent"]), 0), "g:",
                  label="independent tokens, recorded shares")
    ax[1, 0].plot(act["m"], np.nanmean(meas, 0), "o-", color="tab:blue",
                  label="recorded" + (" (consecutive tokens)" if trace.has_tokens else ""))
    plotting.log_axis(ax[1, 0], "x", base=2)
    ax[1, 0].set(xlabel="tokens in batch m", ylabel="activated experts",
                 title=f"activated experts (E={e}, k={trace.top_k})")
    ax[1, 0].legend(fontsize=8)
    t = a["temporal"]
    if a["affinity"]:
        x = np.arange(len(a["affinity"]))
        ax[1, 1].plot(x, [d["predictability"] for d in a["affinity"]], "o-",
                      label="P(next-layer expert = most likely successor)")
        ax[1, 1].plot(x, [d["baseline"] for d in a["affinity"]], "s--",
                      label="same guess without the current expert")
        ax[1, 1].plot(x, [d["nmi"] for d in a["affinity"]], "^-", label="normalized MI")
        ax[1, 1].set(xlabel="layer pair (l, l+1)", title="cross-layer affinity")
        ax[1, 1].legend(fontsize=8)
    elif t["iterations"] >= 3:
        ax[1, 1].plot(t["consecutive"], "o-", label="consecutive iterations")
        ax[1, 1].plot(t["random"], "s--", label="random iteration pairs")
        ax[1, 1].set(xlabel="layer", ylabel="TV distance of load ratios",
                     title="temporal locality")
        ax[1, 1].legend(fontsize=8)
    else:
        ax[1, 1].axis("off")
    fig.suptitle(title)
    return plotting.save(fig, Path(path), dpi=90)
