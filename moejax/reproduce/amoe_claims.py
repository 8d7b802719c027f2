"""Paper 002 (AMoE) claim rules of the steady-state study (`moejax reproduce amoe`), pure
functions of its rows: closed-loop sweeps (Fig. 9, 10), the sync stall share (Fig. 4) and
the schedulers at 80% load (Fig. 11, 12).

`holds`: achievable-throughput ratios within 2x of the paper's; directions where the paper
gives only a direction (rules in each claim's note).
"""

from __future__ import annotations

import numpy as np

from moejax.reproduce.study import Claim, Rows
from moejax.trace.requests import WORKLOADS

ONE_NODE, TWO_NODES, ONE_NODE_40G = "a100x8-nvswitch", "a100x16-2node", "a100x8-40g"
PAPER_GAIN = {"short": 2.7, "medium": 2.3, "reasonable": 2.0}  # 002 §5.1, Fig. 9 (a)-(c)
SCHEDULERS = ("aep-defrag", "aep-mtfs", "aep-flfs")


def best(rows, **match) -> float:
    """Achievable throughput: the max `throughput_tok_s` (finite) over the matching rows."""
    sel = [r["throughput_tok_s"] for r in rows if all(r[k] == v for k, v in match.items())
           and np.isfinite(r["throughput_tok_s"])]
    return max(sel) if sel else float("nan")


def curves_of(rows) -> list[tuple[int, str]]:
    """The (top-k, workload) curves of the closed-loop rows, in order."""
    return list(dict.fromkeys((r["top_k"], r["workload"]) for r in rows))


def gains_of(rows9) -> tuple[dict, dict]:
    """Achievable-throughput ratios AEP / sync (SGLang costs) and AEP / sync (roofline) per
    (top-k, workload), from the closed-loop rows."""
    gains, roof = {}, {}
    for k, wl in curves_of(rows9):
        a = best(rows9, system="aep", top_k=k, workload=wl, start="spread")
        gains[(k, wl)] = a / best(rows9, system="sync", top_k=k, workload=wl)
        if any(r["system"] == "sync_roofline" and r["top_k"] == k and r["workload"] == wl
               for r in rows9):
            roof[(k, wl)] = a / best(rows9, system="sync_roofline", top_k=k, workload=wl)
    return gains, roof


def closed_loop_claims(f9: Rows) -> list[Claim]:
    """Throughput per top-1 workload, the top-2 gain, and ITL at low load (Fig. 9)."""
    rows9 = f9.cols
    gains, roof = gains_of(rows9)
    claims = []
    for wl in WORKLOADS:
        g, paper = gains[(1, wl)], PAPER_GAIN[wl]
        claims.append(Claim(
            id=f"amoe.throughput_top1_{wl}",
            paper=f"{paper}x throughput over synchronous EP, top-1 {wl} (§5.1, Fig. 9)",
            simulated={"over_sglang": round(g, 3)} | (
                {"over_roofline_sync": round(roof[(1, wl)], 3)} if (1, wl) in roof else {}),
            holds=bool(paper / 2 <= g <= paper * 2),
            note="achievable throughput = max over closed-loop N of the steady window; "
                 "holds if the ratio over the SGLang-calibrated baseline (ep-sync) is "
                 "within 2x of the paper's; over the roofline upper bound "
                 "(ep-sync-roofline) beside it"))
    g1, g2 = gains[(1, "medium")], gains[(2, "medium")]
    claims.append(Claim(
        id="amoe.top2_smaller_gain",
        paper="AMoE keeps a throughput advantage with top-2, smaller than top-1 (§5.1)",
        simulated={"top1_medium": round(g1, 3), "top2_medium": round(g2, 3),
                   "over_roofline_sync": {"top1_medium": round(roof[(1, "medium")], 3),
                                          "top2_medium": round(roof[(2, "medium")], 3)}},
        holds=bool(1.0 < g2 < g1)))
    low = min(r["concurrency_target"] for r in rows9)
    pick = {s: [r for r in rows9 if r["system"] == s and r["top_k"] == 1
                and r["workload"] == "medium" and r["concurrency_target"] == low
                and r["start"] == "spread"][0] for s in ("aep", "sync")}
    claims.append(Claim(
        id="amoe.low_load_itl",
        paper="at low load synchronous EP has lower ITL than AMoE (§5.1, §5.2)",
        simulated={"concurrency": low,
                   "aep_itl_ms": round(pick["aep"]["itl_mean_s"] * 1e3, 2),
                   "sync_itl_ms": round(pick["sync"]["itl_mean_s"] * 1e3, 2)},
        holds=bool(pick["aep"]["itl_mean_s"] > pick["sync"]["itl_mean_s"])))
    return claims


def stall_claim(f4: Rows) -> Claim:
    """Fig. 4: the sync baseline's largest stall share over N."""
    stall = max(f4.cols["stall_fraction"])
    return Claim(
        id="amoe.ep_stall_fraction",
        paper="synchronous EP GPUs stall up to ~70% of the time under skew (§2.1, Fig. 4)",
        simulated=round(stall, 3), holds=bool(0.35 <= stall <= 1.0),
        note="max over N of the barrier-wait share of GPU time (SGLang-calibrated "
             "baseline); holds if >= 35%",
        calibrated="the routing skew (skew_scale 0.23, both systems) was bisected on this "
                   "figure to give the ~70% stall at saturation (docs/reproduction/amoe.md)")


def scaling_claim(f10: Rows, f9: Rows) -> Claim:
    """Fig. 10: 16 GPUs over the 40 GB one-node point (and the 80 GB node of Fig. 9)."""
    rows10, rows9 = f10.cols, f9.cols
    scale = {}
    for s in ("aep", "sync"):
        b16 = best(rows10, system=s, platform=TWO_NODES)
        scale[s] = {"over_40g": b16 / best(rows10, system=s, platform=ONE_NODE_40G),
                    "over_80g": b16 / best(rows9, system=s, top_k=1, workload="medium",
                                           start="spread")}
    return Claim(
        id="amoe.scaling_16gpu",
        paper="8 -> 16 GPUs (16 experts): synchronous EP flat, AMoE ~1.92x (§5.2, Fig. 10)",
        simulated={s: {k: round(v, 3) for k, v in d.items()} for s, d in scale.items()},
        holds=bool(scale["sync"]["over_40g"] < 1.2 and scale["aep"]["over_40g"] >= 1.5),
        note="holds if sync gains < 1.2x and AMoE >= 1.5x over the 40 GB one-node point "
             "(the paper's grey markers); the 80 GB node is reported beside it")


def scheduler_claims(f11: Rows) -> list[Claim]:
    """Fig. 11 / 12: the schedulers at 80% of defrag's achievable input rate (the rates in
    `summary`)."""
    by = {(r["policy"], r["top_k"]): r for r in f11.cols}
    ok = True
    for k in (1, 2):
        d, m, f = (by[(p, k)] for p in SCHEDULERS)
        best_t = max(r["throughput_tok_s"] for r in (d, m, f))
        ok &= (d["throughput_tok_s"] >= 0.98 * best_t
               and d["itl_mean_s"] <= min(m["itl_mean_s"], f["itl_mean_s"]))
    share = {p: by[(p, 1)]["finished_at_last_arrival"] for p in SCHEDULERS}
    return [Claim(
        id="amoe.defrag_beats_mtfs_flfs",
        paper="at ~80% load the defragging scheduler has higher throughput and lower ITL "
              "than MTFS and FLFS (§5.3, Fig. 11)",
        simulated={f"top{k}_{p}": {"tok_s": round(by[(p, k)]["throughput_tok_s"]),
                                   "itl_ms": round(by[(p, k)]["itl_mean_s"] * 1e3, 1)}
                   for k in (1, 2) for p in SCHEDULERS} | {
            "rate_top1": f11.summary["rate80_top1"], "rate_top2": f11.summary["rate80_top2"]},
        holds=bool(ok),
        note="open loop below saturation: every scheduler delivers about the offered "
             "load, so holds if defrag has the lowest ITL and a throughput within 2% of "
             "the best, for top-1 and top-2"), Claim(
        id="amoe.flfs_starvation",
        paper="under continuous arrivals FLFS completes requests slower than they arrive; "
              "the defragging scheduler keeps up better (§5.3, Fig. 12)",
        simulated={"share_done_at_last_arrival": {p: round(v, 3) for p, v in share.items()},
                   "itl_ms": {p: round(by[(p, 1)]["itl_mean_s"] * 1e3, 1) for p in SCHEDULERS}},
        holds=bool(share["aep-flfs"] < share["aep-defrag"]
                   and by[("aep-flfs", 1)]["itl_mean_s"] > by[("aep-defrag", 1)]["itl_mean_s"]))]


def closed_loop_summary(f9: Rows) -> dict:
    """summary.json entries read off the closed loop: the gains and the aligned-start check."""
    rows9 = f9.cols
    gains, roof = gains_of(rows9)
    return {
        "gains": {f"top{k}_{w}": round(v, 4) for (k, w), v in gains.items()},
        "gains_over_roofline_sync": {f"top{k}_{w}": round(v, 4) for (k, w), v in roof.items()},
        "aligned_vs_spread_n8192": {
            s: round(best(rows9, system="aep", top_k=1, workload="medium",
                          concurrency_target=8192, start=s), 1) for s in ("spread", "aligned")},
    }
