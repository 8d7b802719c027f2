"""Figures of paper 003 (EPS-MoE), each drawn through `moejax.output.plotting` from the columns
its table writes to CSV, so `moejax reproduce epsmoe --replot DIR` redraws them from DIR alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moejax.output import plotting
from moejax.reproduce.study import Grid, Rows

T3_LEGEND = {  # 003 Table 3 rows: the study's T3_VARIANTS against vLLM's TP+TP (GroupGemm)
    "TP+EP": "TP attention + EP experts, GroupGemm",
    "PN=1": "EPS-MoE, DenseGemm per expert, no pipeline (PN=1)",
    "PN=2": "EPS-MoE, DenseGemm, 2-chunk pipeline (PN=2)",
}


def fig5(path: Path, gemm: dict, sms: dict) -> None:
    """Fig. 5a: GroupGemm vs per-expert DenseGemm throughput; 5c: GroupGemm time vs SMs."""
    fig, ax = plotting.figure(1, 2, width=4.8, height=3.4)
    m = np.asarray(gemm["rows_per_expert"])
    ax[0, 0].plot(m, gemm["group_tflops"], "o-", label="GroupGemm (one kernel, 16 experts)")
    ax[0, 0].plot(m, gemm["dense_tflops"], "s-", label="DenseGemm (one kernel per expert)")
    plotting.log_if_wide(ax[0, 0], "x", m, base=2)
    ax[0, 0].set_xlabel("rows per expert m")
    ax[0, 0].set_ylabel("achieved TFLOP/s (bf16)")
    ax[0, 0].legend(fontsize=7)
    ax[0, 0].set_title("003 Fig. 5a: 16 experts [1536, 5120], H800", fontsize=9)
    ax[0, 1].plot(sms["sms"], sms["group_s_m6144"], "o-", label="GroupGemm, m = 6144")
    ax[0, 1].set_xlabel("SMs given to the GEMM (of 132)")
    plotting.time_axis(ax[0, 1], "y", "ms", "GEMM time")
    ax[0, 1].legend(fontsize=7)
    ax[0, 1].set_title("003 Fig. 5c: fewer SMs for the GEMM", fontsize=9)
    plotting.save(fig, path)


def table3(path: Path, cols: dict, mname: str) -> None:
    """Table 3: prefill TTFT reduction of each variant vs vLLM TP+TP, per (batch, sequence).
    The CSV's `*_reduction_pct` holds the TTFT change (negative = faster), as the paper's
    table prints it; the bars show the reduction (positive = faster)."""
    cells = list(zip(cols["batch"].astype(int), cols["seq"].astype(int), strict=True))
    fig, ax = plotting.figure(width=max(5.5, 0.45 * len(cells)), height=3.8)
    x = np.arange(len(cells))
    for i, name in enumerate(T3_LEGEND):
        ax[0, 0].bar(x + 0.27 * (i - 1), -np.asarray(cols[f"{name}_reduction_pct"]), 0.27,
                     label=T3_LEGEND[name])
    ax[0, 0].axhline(0, color="k", lw=0.6)
    ax[0, 0].set_xticks(x, [f"B{b}\nS{s / 1024:g}k" for b, s in cells], fontsize=6)
    ax[0, 0].set_xlabel("batch B, sequence length S (tokens)", fontsize=8)
    ax[0, 0].set_ylabel("TTFT reduction vs TP+TP (%)")
    ax[0, 0].set_title(f"003 Table 3: {mname}, prefill", fontsize=9)
    fig.legend(*ax[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=1,
               fontsize=7)
    plotting.save(fig, path)


def table6(path: Path, cols: dict) -> None:
    """Table 6: MoE time with the GEMM on fewer SMs (the rest to the comm kernel), relative
    to all 132 SMs, per rows per expert."""
    sms = [int(k[2:-3]) for k in cols if k.startswith("sm") and k.endswith("_ms")]
    fig, ax = plotting.figure(width=5.0, height=3.4)
    for i, mm in enumerate(np.asarray(cols["m_per_expert"]).astype(int)):
        t = np.asarray([cols[f"sm{s}_ms"][i] for s in sms])
        ax[0, 0].plot(sms, t / t[0], "o-", label=f"m = {mm} rows per expert")
    ax[0, 0].axhline(1.0, color="k", lw=0.6)
    ax[0, 0].set_xlabel("SMs given to the GEMM (comm kernel on 16)")
    ax[0, 0].set_ylabel(f"MoE time / time at {sms[0]} SMs")
    ax[0, 0].set_title("003 Table 6: SM split, PN = 5, 4x H800", fontsize=9)
    ax[0, 0].legend(fontsize=7)
    plotting.save(fig, path)


def fig10(path: Path, cols: dict) -> None:
    """Table 7 / Fig. 10: PN=2 against PN=1 per tokens per device (below 0: pipelining pays)."""
    fig, ax = plotting.figure(width=5.0, height=3.4)
    ax[0, 0].plot(cols["m"], cols["delta_pct"], "o-",
                  label="layer time change, PN=2 vs PN=1")
    ax[0, 0].axhline(0, color="k", lw=0.6)
    plotting.log_if_wide(ax[0, 0], "x", cols["m"], base=2)
    ax[0, 0].set_xlabel("tokens per device m")
    ax[0, 0].set_ylabel("change in layer time (%)")
    ax[0, 0].legend(fontsize=7)
    ax[0, 0].set_title("003 Table 7 / Fig. 10: DeepSeek-V2, 8x H800", fontsize=9)
    plotting.save(fig, path)


def fig11(path: Path, cols: dict, n_star: dict) -> None:
    """Fig. 11: MoE layer time against the pipeline degree PN, serial and pipelined, with the
    paper's optimum N* = sqrt(C/k) (E12) as a vertical line; `n_star` maps "dim_m" to it."""
    dims = list(dict.fromkeys(np.asarray(cols["dim"]).astype(int)))
    ms = list(dict.fromkeys(np.asarray(cols["m"]).astype(int)))
    fig, ax = plotting.figure(1, len(dims) * len(ms), width=3.6, height=3.4)
    col = 0
    for dim in dims:
        for mm in ms:
            sel = (cols["dim"] == dim) & (cols["m"] == mm)
            pn = cols["PN"][sel]
            a = ax[0, col]
            a.plot(pn, cols["standard_ms"][sel] * 1e-3, "k--", label="standard (no chunks)")
            a.plot(pn, cols["serial_ms"][sel] * 1e-3, "o-", label="PN chunks, serial")
            a.plot(pn, cols["pipelined_ms"][sel] * 1e-3, "s-", label="PN chunks, pipelined")
            ns = n_star.get(f"{dim}_{mm}", {}).get("n_star")
            if ns is not None:
                a.axvline(ns, color="gray", lw=0.8, label="N* = sqrt(C / k) (E12)")
            plotting.log_if_wide(a, "x", pn, base=2)
            a.set_xlabel("pipeline degree PN")
            plotting.time_axis(a, "y", "ms", "MoE layer")
            a.set_title(f"[5120, {dim}], m = {mm}", fontsize=8)
            col += 1
    fig.legend(*ax[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    fig.suptitle("003 Fig. 11: layer time vs PN, 4x H800", fontsize=9)
    plotting.save(fig, path)


def fig9(path: Path, cols: dict) -> None:
    """Fig. 9 / E8: GEMM memory I/O per device of the horizontal and vertical splits."""
    fig, ax = plotting.figure()
    ax[0, 0].plot(cols["PN"], cols["horizontal_MB"], "o-", label="(a) horizontal (by expert)")
    ax[0, 0].plot(cols["PN"], cols["vertical_MB"], "s-", label="(b) vertical (by column)")
    ax[0, 0].set_xlabel("pipeline degree PN")
    ax[0, 0].set_ylabel("GEMM memory I/O per device (MB)")
    ax[0, 0].set_title("003 Fig. 9 / E8: DeepSeek-V2, 4096 tok/device", fontsize=8)
    ax[0, 0].legend(fontsize=7)
    plotting.save(fig, path)


def table1(path: Path, cols: dict) -> None:
    """Table 1: prefill throughput gain of EPS-MoE over each model's baseline."""
    fig, ax = plotting.figure(width=5.0, height=3.4)
    x = np.arange(len(cols["model"]))
    paper = 100 * (cols["paper_eps_tok_s"] / cols["paper_base_tok_s"] - 1)
    sim = 100 * (cols["sim_eps_tok_s"] / cols["sim_base_tok_s"] - 1)
    ax[0, 0].bar(x - 0.2, paper, 0.4, label="paper (003 Table 1)")
    ax[0, 0].bar(x + 0.2, sim, 0.4, label="simulated (moejax)")
    ax[0, 0].set_xticks(x, list(cols["model"]), fontsize=8)
    ax[0, 0].set_ylabel("prefill throughput gain (%)")
    ax[0, 0].set_title("003 Table 1: EPS-MoE over the baseline", fontsize=9)
    ax[0, 0].legend(fontsize=7)
    plotting.save(fig, path)


# --- each figure from the rows read back from its CSV ---------------------------------------


def _arrays(cols: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in cols.items()}


def fig5_figure(path: Path, rows: Rows, grid: Grid) -> None:
    fig5(path, _arrays(rows.cols), _arrays(rows.more["fig5_gemm_sms.csv"]))


def table3_figure(mname: str):
    """Table 3's plot for one model."""
    def draw(path: Path, rows: Rows, grid: Grid) -> None:
        table3(path, _arrays(rows.cols), mname)
    return draw


def table6_figure(path: Path, rows: Rows, grid: Grid) -> None:
    table6(path, _arrays(rows.cols))


def fig10_figure(path: Path, rows: Rows, grid: Grid) -> None:
    """Fig. 10 from Table 7's rows (tokens per device, PN=2 vs PN=1 change)."""
    fig10(path, _arrays(rows.cols))


def fig11_figure(path: Path, rows: Rows, grid: Grid) -> None:
    fig11(path, _arrays(rows.cols), rows.summary.get("n_star_fig11", {}))


def fig9_figure(path: Path, rows: Rows, grid: Grid) -> None:
    fig9(path, _arrays(rows.cols))


def table1_figure(path: Path, rows: Rows, grid: Grid) -> None:
    table1(path, _arrays(rows.cols))
