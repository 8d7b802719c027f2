"""Paper 003 (EPS-MoE) claim rules (`moejax reproduce epsmoe`), pure functions of the rows of
the tables they read: `holds` per claim is the rule of docs/reproduction/epsmoe.md, fixed
before any run. Each takes the `Rows` of its tables (their `extra` holds the unrounded
per-variant results) and returns its `Claim`s."""

from __future__ import annotations

import numpy as np

from moejax.reproduce.study import Claim, Rows

DSV2_PN = (1, 2, 4, 5, 10, 20)  # Table 2 pipeline degrees
T6_SM = (132, 124, 116, 108, 100, 92)  # Table 6 GEMM SMs
T7_M = (256, 512, 1024, 1536, 1700, 1800, 1900, 2000, 2200, 3072, 4096, 6144, 8192)
FIG11_PN = (1, 2, 4, 5, 8, 10, 20, 40)


# Model changes made after the claim had failed (the claims that failed in an earlier
# shipped run). Each is a correction with its own cited reason, never a constant fitted to
# the claim; the verdict is still the spec's rule.
_SEND_ONCE = ("send-once dispatch made the default after this claim failed (003 §5.2 (4) "
              "prices a chunk's all2all as S(m/N); the re-send reading is kept as an option)")
_GEMMS = ("the dense kernel got a stream-K tile schedule and the grouped kernel the wgmma "
          "reading (003 Fig. 5 footnote 1: CUTLASS Pingpong) after this claim failed")
_SMS = "every pipelined row of Tables 2-4 got its GEMM on 116 SMs (one rule) after this failed"
CHANGED = {
    "table1_deepseekv2": "MLA attention counted by its real shapes (149 M, not 503 M parameters "
                         "per layer) after this claim failed at +9.3%; then " + _SEND_ONCE
                         + "; " + _GEMMS,
    "pipeline_increment": f"{_SEND_ONCE}; {_GEMMS}; {_SMS}",
    "arctic_small": f"{_GEMMS}; {_SEND_ONCE}",
    "ablation_overlap": f"{_SEND_ONCE}; {_GEMMS}",
    "ablation_gemm_switch": f"{_GEMMS}; {_SEND_ONCE}",
    "ablation_fp8": f"{_GEMMS}; {_SEND_ONCE}",
    "pn_optimum": f"{_SEND_ONCE}; {_GEMMS}",
}


def _gain(base, new):
    """Latency reduction 1 - new / base (A9), in %."""
    return 100.0 * (1.0 - np.asarray(new) / np.asarray(base))


def _in(x, lo, hi) -> bool:
    return x is not None and lo <= x <= hi


def volume_claim(vol: Rows) -> Claim:
    strict = vol.extra["strict"]
    return Claim("epsmoe.volume_order",
                 "V_DP+EP < V_TP+EP < V_TP+TP bytes per device (§4.2 Summary)",
                 {"strict_on_every_trace": strict}, strict)


def gemm_crossover_claim(f5: Rows) -> Claim:
    cross = f5.extra["crossover"]
    return Claim("epsmoe.gemm_crossover",
                 "GroupGemm faster for m < 2048, DenseGemm for m >= 4096 rows/expert (Fig. 5a)",
                 {"first_m_dense_stays_faster": cross}, _in(cross, 1365, 6144),
                 "" if _in(cross, 1365, 6144) else
                 "the grouped kernel's 2/3 MMA share (warp-level MMA vs wgmma) against its "
                 "fuller last wave and single launch decides where dense wins")


def table3_claims(t3_mix: Rows, t3_dbrx: Rows) -> list[Claim]:
    """TP+EP vs TP+TP, the GEMM switch, the pipeline increment, DBRX > Mixtral (Table 3)."""
    mix, dbrx = t3_mix.extra, t3_dbrx.extra
    cells = mix["cells"]
    g_tpep = _gain(mix["base"], mix["TP+EP"])
    g_pn1 = _gain(mix["base"], mix["PN=1"])
    g_pn2 = _gain(mix["base"], mix["PN=2"])
    d_pn1 = _gain(dbrx["base"], dbrx["PN=1"])
    d_pn2 = _gain(dbrx["base"], dbrx["PN=2"])
    c = []
    ok = bool((g_tpep > 0).all() and 5.3 <= np.median(g_tpep) <= 20.6)
    c.append(Claim("epsmoe.tp_ep_vs_tp_tp", "TP+EP cuts TTFT 8%-13.7% vs TP+TP (Table 3, Mixtral)",
                   {"median_pct": float(np.median(g_tpep)), "min_pct": float(g_tpep.min()),
                    "max_pct": float(g_tpep.max())}, ok))
    mx = max(float(g_pn1.max()), float(d_pn1.max()))
    ok = bool((mix["PN=1"] < mix["TP+EP"]).all() and (mix["TP+EP"] < mix["base"]).all()
              and (dbrx["PN=1"] < dbrx["base"]).all() and 13 <= mx <= 39)
    c.append(Claim("epsmoe.gemm_switch",
                   "PN=1 (DenseGemm) -15%..-19.7% Mixtral, -19.8%..-26.1% DBRX (Table 3)",
                   {"mixtral_pn1_pct": [float(g_pn1.min()), float(g_pn1.max())],
                    "dbrx_pn1_pct": [float(d_pn1.min()), float(d_pn1.max())]}, ok))
    better = np.concatenate([mix["PN=2"] < mix["PN=1"], dbrx["PN=2"] < dbrx["PN=1"]])
    i128 = cells.index((128, 2048))
    inc = float(g_pn2[i128] - g_pn1[i128])
    # the spec's band holds at both Table 1 points: Mixtral B=128 S=2k and DBRX B=64 S=2k
    j64 = dbrx["cells"].index((64, 2048))
    inc_db = float(d_pn2[j64] - d_pn1[j64])
    ok = bool(better.mean() >= 0.8 and 3.2 <= inc <= 7.2 and 3.2 <= inc_db <= 7.2)
    c.append(Claim("epsmoe.pipeline_increment",
                   "PN=2 adds 4.8 points over PN=1 (Mixtral B=128 S=2k), DBRX ~3-5 (Table 3)",
                   {"share_cells_pn2_better": float(better.mean()),
                    "increment_points_mixtral_b128_s2k": inc,
                    "increment_points_dbrx_b64_s2k": inc_db,
                    "dbrx_increments": (d_pn2 - d_pn1).round(2).tolist()}, ok,
                   "" if ok else "the overlap hides at most min(all2all, GEMM) / 2 of one "
                   "block; the un-overlapped reduce-scatter / all-gather and attention stay",
                   changed_after_failure=CHANGED["pipeline_increment"]))
    mxm, mxd = float(g_pn2.max()), float(d_pn2.max())
    c.append(Claim("epsmoe.dbrx_gt_mixtral", "greater benefit on DBRX: -30.5% vs -24.3% (Table 3)",
                   {"dbrx_max_pct": mxd, "mixtral_max_pct": mxm}, mxd > mxm))
    return c


def table1_deepseekv2_claim(t2: Rows) -> Claim:
    gains = t2.extra["gains"]
    g_ds = float(gains[:, 0].max())
    return Claim("epsmoe.table1_deepseekv2", "+21.8% prefill throughput (Table 1, Table 2 1K)",
                 {"best_gain_pct_seq1k": g_ds, "best_pn": int(DSV2_PN[int(gains[:, 0].argmax())])},
                 _in(g_ds, 14.5, 32.7), changed_after_failure=CHANGED["table1_deepseekv2"])


def table1_mixtral_claim(t3_mix: Rows) -> Claim:
    mix = t3_mix.extra
    i128 = mix["cells"].index((128, 2048))
    g_mix = float(100 * (mix["base"][i128] / mix["PN=2"][i128] - 1))
    return Claim("epsmoe.table1_mixtral", "+32.2% (71.84K -> 94.89K tok/s; Table 1)",
                 {"gain_pct_b128_s2k": g_mix,
                  "base_tokens_per_s": float(128 * 2048 / mix["base"][i128])},
                 _in(g_mix, 21.5, 48.3))


def table1_dbrx_claim(t3_dbrx: Rows) -> Claim:
    dbrx = t3_dbrx.extra
    g_db = float((100 * (dbrx["base"] / dbrx["PN=2"] - 1)).max())
    return Claim("epsmoe.table1_dbrx", "+52.4% (37.23K -> 56.74K; matched config max +43.9%)",
                 {"matched_max_gain_pct": g_db}, _in(g_db, 29.3, 65.8))


def seq_trend_claim(t2: Rows) -> Claim:
    gains = t2.extra["gains"]
    best = gains.max(0)
    pn1 = gains[0]
    piped = gains[1:].max(0)  # the best pipelined PN (> 1) per sequence length
    # the spec's rule at every point: the best gain falls at each step 1K -> 2K -> 4K -> 8K,
    # and a pipelined PN beats PN=1 in every column
    ok = bool((np.diff(best) < 0).all() and (pn1 < piped).all())
    return Claim("epsmoe.seq_trend_dsv2", "best gain falls 21.8% (1K) -> 12.8% (8K) (Table 2)",
                 {"best_gain_pct_by_seq": best.round(2).tolist(),
                  "best_pipelined_gain_pct_by_seq": piped.round(2).tolist(),
                  "pn1_gain_pct_by_seq": pn1.round(2).tolist()}, ok)


def arctic_claim(t4: Rows) -> Claim:
    red, cells = t4.extra["reduction"], t4.extra["cells"]
    bs32 = [i for i, (b, _) in enumerate(cells) if b == 32]
    bs16 = [i for i, (b, _) in enumerate(cells) if b == 16]
    ok = bool((red >= 0).all() and (red <= 10).all()
              and red[:, bs32].mean() > red[:, bs16].mean())
    return Claim("epsmoe.arctic_small", "reductions 0.26%-6.64%, larger at bs 32 (Table 4)",
                 {"reduction_pct": red.round(2).tolist()}, ok,
                 changed_after_failure=CHANGED["arctic_small"])


def ablation_claims(t5: Rows) -> list[Claim]:
    """Overlap, GEMM switch and FP8 steps of Table 5 (dim 1536), ms per layer [ID, m]."""
    t = t5.extra["t"][1536]
    ov = float(_gain(t[0, 0], t[3, 0]))
    sw = float(_gain(t[3, 0], t[7, 0]))
    sw256 = float(_gain(t[3, 2], t[7, 2]))
    f8 = float(_gain(t[1, 0], t[8, 0]))
    return [Claim("epsmoe.ablation_overlap", "5.698 -> 4.837 ms, -15.1% (Table 5 ID0 -> ID3)",
                  {"reduction_pct": ov, "id0_ms": float(t[0, 0] * 1e3),
                   "id3_ms": float(t[3, 0] * 1e3)}, _in(ov, 10, 23),
                  changed_after_failure=CHANGED["ablation_overlap"]),
            Claim("epsmoe.ablation_gemm_switch",
                  "4.837 -> 4.299 ms, -11.1% at m=3072; +16.8% at m=256 (ID3 -> ID7)",
                  {"reduction_pct_m3072": sw, "reduction_pct_m256": sw256},
                  _in(sw, 7.4, 16.7) and sw256 < 0,
                  changed_after_failure=CHANGED["ablation_gemm_switch"]),
            Claim("epsmoe.ablation_fp8", "FP8 + pipeline -28.2% (ID1 4.330 -> ID8 3.111)",
                  {"reduction_pct": f8}, _in(f8, 18.8, 42.3),
                  changed_after_failure=CHANGED["ablation_fp8"])]


def sm_split_claim(t6: Rows) -> Claim:
    t6v = t6.extra["t"]
    best_sm = [T6_SM[int(i)] for i in t6v.argmin(1)]
    g116 = _gain(t6v[:, 0], t6v[:, 2])
    ok = bool(all(s <= 116 for s in best_sm) and ((5.7 <= g116) & (g116 <= 23)).all())
    return Claim("epsmoe.sm_split", "GEMM on 116 SMs beats 132 by 8.6-15.3% (Table 6)",
                 {"best_sm_by_m": best_sm, "gain_116_vs_132_pct": g116.round(2).tolist()}, ok)


def threshold_claim(t7: Rows) -> Claim:
    m0, delta = t7.extra["m0"], t7.extra["delta"]
    near = [i for i, mm in enumerate(T7_M) if 1700 <= mm <= 2200]
    ok = bool(_in(m0, 1133, 2550) and (delta[near] < 0).all())
    return Claim("epsmoe.pipeline_threshold", "PN=2 helps for m >= ~1700 (Table 7)",
                 {"m0": m0, "delta_pct_1700_2200": delta[near].round(2).tolist()}, ok)


def pn_optimum_claim(f11: Rows) -> Claim:
    r = f11.extra["res"][(1536, 3072)]
    divs = list(FIG11_PN)
    # the spec's rule: argmin within one divisor of round(sqrt(C / k)) (the nearest divisor)
    target = min(divs, key=lambda n: (abs(n - round(r["n_star"])), n))
    within = abs(divs.index(r["argmin"]) - divs.index(target)) <= 1
    pipe = np.asarray(r["pipe"])
    i = divs.index(r["argmin"])
    # U-shape at every point: falls to the interior optimum, then rises
    ushape = bool(0 < i < len(divs) - 1 and (np.diff(pipe[:i + 1]) <= 0).all()
                  and (np.diff(pipe[i:]) >= 0).all())
    t20_gt_t5 = bool(pipe[divs.index(20)] > pipe[divs.index(5)])
    return Claim("epsmoe.pn_optimum",
                 "interior optimal PN; PN=20 worse than PN=5 (+12.9%); N* = sqrt(C/k) (Fig. 11)",
                 {"argmin_pn": r["argmin"], "sqrt_C_over_k": r["n_star"],
                  "nearest_divisor": target, "best_divisor_by_E12": r["best_div"],
                  "u_shape_every_point": ushape,
                  "T20_over_T5": float(pipe[divs.index(20)] / pipe[divs.index(5)])},
                 bool(ushape and within and t20_gt_t5),
                 changed_after_failure=CHANGED["pn_optimum"])
