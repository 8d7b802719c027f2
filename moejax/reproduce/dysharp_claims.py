"""Paper 004 (DySHARP) claim rules (`moejax reproduce dysharp`), pure functions of the rows of
the figures they read (their `extra` holds the per-configuration results the CSVs round).

`holds`, fixed before any run (spec §4): same direction as the paper and, where the paper
gives a magnitude, the gain (speedup - 1) within 1.5x of the paper's.
"""

from __future__ import annotations

import numpy as np

from moejax.reproduce.study import Claim, Rows
from moejax.systems.dysharp import closed_form

ORDER = ("nvls", "deepep", "fastermoe", "tutel", "ccfuser", "comet", "dysharp")  # Fig. 15
# 004 Fig. 15 (layer, training): geomean / max speedup of DySHARP over each baseline
PAPER_LAYER = {"deepep": (2.26, 2.77), "comet": (1.78, 1.94), "nvls": (4.25, 6.93),
               "fastermoe": (2.14, 2.48), "tutel": (1.96, 2.32), "ccfuser": (1.84, 2.01)}
# 004 Fig. 14 (end to end): geomean (max)
PAPER_E2E = {"deepep": (1.93, 2.31), "nvls": (3.38, 5.12), "fastermoe": (1.84, 2.11),
             "tutel": (1.72, 1.98), "ccfuser": (1.63, 1.85), "comet": (1.59, 1.79),
             "dualpipe": (1.66, 1.88)}


def _gm(xs):
    xs = np.asarray(xs, float)
    return float(np.exp(np.log(xs).mean()))


def _gain_ok(sim, paper):
    """Same direction and gain within 1.5x of the paper's."""
    g, p = sim - 1.0, paper - 1.0
    return bool(g > 0 and p / 1.5 <= g <= p * 1.5)


def traffic_claims(f2: Rows) -> list[Claim]:
    """Redundancy, ideal speedup and NVLS's useless traffic from the routing (Fig. 2)."""
    rows = f2.cols
    r = dict(zip(rows["top_k"], rows["redundancy"], strict=True))
    s = dict(zip(rows["top_k"], rows["ideal_speedup"], strict=True))
    nv = float(rows["nvls_useless"][list(rows["top_k"]).index(8)])
    return [Claim("dysharp.redundancy", "about 50% of traffic redundant at top-k >= 8 "
                  "(§I, Fig. 2a)", {k: round(float(r[k]), 3) for k in r},
                  bool(all(0.40 <= r[k] <= 0.5 for k in (8, 16, 32)) and r[8] < r[16] < r[32]),
                  "DeepEP bytes vs DySHARP bytes over both directions"),
            Claim("dysharp.ideal_speedup", "near 2x for top-k >= 8 (Fig. 2b)",
                  {k: round(float(s[k]), 3) for k in s},
                  bool(all(s[k] >= 1.6 for k in (8, 16, 32)) and s[8] < s[16] < s[32] <= 2.0),
                  "serial DeepEP comm / fused DySHARP comm, payload bytes, busiest port"),
            Claim("dysharp.nvls_useless", "340% useless traffic (§I, §II-C2)",
                  round(nv, 3), bool(2.27 <= nv <= 5.10),
                  f"closed form {closed_form.nvls_useless(256, 32, 8):.3f}")]


def payload_claim(f19: Rows) -> Claim:
    pe = f19.cols
    ks = list(pe["top_k"])
    i8 = ks.index(8)
    return Claim("dysharp.payload", "80% ideal vs 69% explicit, 8 targets (§III-A, Fig. 19a)",
                 {"ideal": pe["ideal"][i8], "dysharp": pe["dysharp"][i8],
                  "explicit": pe["explicit"][i8]},
                 bool(pe["dysharp"][i8] >= 0.75 and all(
                     e < d for e, d, k in zip(pe["explicit"], pe["dysharp"], ks, strict=True)
                     if k >= 4)),
                 "explicit = one 8 B address per target (spec §7.6); 69% itself needs a "
                 "non-standard packet (spec §5.5); at k <= 2 explicit is not worse than one "
                 "16 B target flit")


def layer_claims(f15: Rows) -> list[Claim]:
    """DySHARP's MoE-layer speedup over each baseline and their order (Fig. 15)."""
    per_cfg, configs = f15.extra["per_cfg"], f15.extra["configs"]

    def speedups(n, phase="training", metric="latency_s"):
        return [float(per_cfg[c][(n, phase)][metric] / per_cfg[c][("dysharp", phase)][metric])
                for c in configs]

    layer = {}
    for n in ("deepep", "comet", "nvls", "fastermoe", "tutel", "ccfuser", "comet-rank"):
        sp = speedups(n)
        layer[n] = {"geomean": round(_gm(sp), 3), "max": round(max(sp), 3),
                    "forward_geomean": round(_gm(speedups(n, "forward")), 3)}
    claims = []
    for n in ("deepep", "comet", "nvls"):
        claims.append(Claim(f"dysharp.layer_vs_{n}", f"geomean {PAPER_LAYER[n][0]}x, max "
                            f"{PAPER_LAYER[n][1]}x (Fig. 15)", layer[n],
                            _gain_ok(layer[n]["geomean"], PAPER_LAYER[n][0]),
                            f"{len(configs)} configs, training (fwd + bwd)"
                            + ("; COMET with per-rank bytes (other reading, spec §7.4): "
                               f"{layer['comet-rank']}" if n == "comet" else "")))
    mean_lat = {n: _gm([per_cfg[c][(n, "training")]["latency_s"] for c in configs])
                for n in ORDER}
    order = sorted(ORDER, key=lambda n: -mean_lat[n])
    others_ok = all(_gain_ok(layer[n]["geomean"], PAPER_LAYER[n][0])
                    for n in ("fastermoe", "tutel", "ccfuser"))
    claims.append(Claim("dysharp.layer_vs_others", "FasterMoE 2.14/2.48, Tutel 1.96/2.32, "
                        "CCFuser 1.84/2.01; order NVLS < DeepEP < FasterMoE < Tutel < "
                        "CCFuser < COMET < DySHARP (Fig. 15)",
                        {"fastermoe": layer["fastermoe"], "tutel": layer["tutel"],
                         "ccfuser": layer["ccfuser"], "order_slowest_first": order},
                        bool(others_ok and tuple(order) == ORDER),
                        "CCFuser and COMET share one model (two fused kernels, per-pair "
                        "bytes), so they tie",
                        changed_after_failure="after the order failed, COMET's adaptive SM "
                        "split was added (they still tie); later the coarse schedules "
                        "(FasterMoE, Tutel) pay their comm SMs like every overlapped one"))
    return claims


def e2e_claim(f14: Rows) -> Claim:
    e2e = f14.extra["e2e"]
    return Claim("dysharp.e2e", "geomean 1.93 (DeepEP), 3.38 (NVLS), 1.84, 1.72, 1.63, 1.59 "
                 "(COMET; up to 1.79), 1.66 (DualPipe) (Fig. 14)", e2e,
                 all(_gain_ok(e2e[n]["geomean"], PAPER_E2E[n][0]) for n in e2e),
                 "attention by roofline (DP), dense blocks included; the 16-stage PP bubble is "
                 "the same for all systems and left out (spec §7.14)",
                 changed_after_failure="after the claim failed, DualPipe's compute runs on the "
                 "SMs its comm kernels leave (one comm-SM rule for every overlapped schedule)")


def traffic_bytes_claim(f18: Rows) -> Claim:
    tr_rows, configs = f18.cols, f18.extra["configs"]
    red = [1 - d / e for d, e in zip(tr_rows["dysharp_MB"], tr_rows["deepep_MB"], strict=True)]
    nv_gt = [nv > e for nv, e, (_, k) in zip(tr_rows["nvls_MB"], tr_rows["deepep_MB"], configs,
                                             strict=True) if k == 8]
    return Claim("dysharp.traffic", "DySHARP about -50% vs DeepEP; NVLS > DeepEP (Fig. 18)",
                 {"reduction_vs_deepep": [round(x, 3) for x in red],
                  "nvls_over_deepep": [round(a / b, 3) for a, b in zip(
                      tr_rows["nvls_MB"], tr_rows["deepep_MB"], strict=True)]},
                 bool(all(0.35 <= x <= 0.5 for x in red) and all(nv_gt)),
                 "NVLS total bytes fall below DeepEP's at k = 32 (spec §5.3)")


def ablation_claims(f16: Rows) -> list[Claim]:
    """DeepEP's comm share at L-8 (§II-A) and the ablation (Fig. 16)."""
    x = f16.extra
    abl = x["abl"]
    basic = abl["deepep"] / abl["dysharp-basic"]
    fus = abl["comet"] / abl["fusion-only"]
    return [Claim("dysharp.comm_share", "comm is 70.4% of the MoE layer (§II-A)",
                  {"training": round(x["share"], 3), "forward": round(x["share_forward"], 3)},
                  bool(x["share"] >= 0.47), "DeepEP at L-8, FP8 GEMMs at roofline"),
            Claim("dysharp.ablation", "Basic ~ DeepEP, DySHARP-COMET ~ COMET, fusion-only <= "
                  "COMET, full >> (Fig. 16)",
                  {"basic_over_deepep": round(basic, 3),
                   "dysharp_comet_over_comet": round(abl["comet"] / abl["dysharp-comet"], 3),
                   "fusion_only_over_comet": round(fus, 3),
                   "fusion_only_over_comet_per_rank": round(x["comet_rank_s"]
                                                            / abl["fusion-only"], 3),
                   "full_over_deepep": round(abl["deepep"] / abl["dysharp"], 3)},
                  bool(abs(basic - 1) <= 0.1 and abs(fus - 1) <= 0.1
                       and abl["dysharp"] <= min(abl.values()) * (1 + 1e-6)),
                  "fusion-only carries DeepEP's per-rank bytes, COMET per-pair bytes")]


def bw_util_claim(f20: Rows) -> Claim:
    bw = dict(zip(f20.cols["system"], f20.cols["bw_util"], strict=True))
    return Claim("dysharp.bw_util", "utilization DySHARP > DySHARP-COMET > Basic (Fig. 20)",
                 {k: round(v, 3) for k, v in bw.items()},
                 bool(bw["dysharp"] > bw["dysharp-comet"] > bw["dysharp-basic"]),
                 "payload bytes / (layer time x 2 directions x G x link)")


def pure_comm_claim(f18: Rows) -> Claim:
    pure = f18.extra["pure"]
    return Claim("dysharp.pure_comm", "concurrent Dispatch + Combine > 90% of ideal (Fig. 18)",
                 [round(x, 4) for x in pure], bool(min(pure) >= 0.9),
                 "port bound / (port bound + tile fill and drain); flow model, no congestion")


SWEEP_NAMES = ("deepep", "nvls", "comet", "tutel", "dysharp")


def seq_len_claim(f22: Rows) -> Claim:
    seq_rows = f22.cols
    n_pts = len(seq_rows["seq"])
    fastest = all(seq_rows["dysharp_ms"][i] <= min(seq_rows[f"{n}_ms"][i] for n in SWEEP_NAMES)
                  for i in range(n_pts))
    gaps = [seq_rows["deepep_ms"][i] - seq_rows["dysharp_ms"][i] for i in range(n_pts)]
    return Claim("dysharp.seq_len", "DySHARP fastest at every length, advantage grows (Fig. 22)",
                 {"gap_vs_deepep_ms": [round(g, 3) for g in gaps]},
                 bool(fastest and all(np.diff(gaps) > 0)), "L-8, training")


def _skew_claim(rows: dict, key: str, cid: str, text: str) -> Claim:
    ok = all(rows["dysharp_ms"][i] <= min(rows[f"{n}_ms"][i] for n in SWEEP_NAMES)
             for i in range(len(rows[key])))
    return Claim(cid, text, {n: [round(v, 3) for v in rows[f"{n}_ms"]]
                             for n in ("deepep", "comet", "dysharp")}, bool(ok),
                 "L-8 training, ms per layer")


def std_claim(f23: Rows) -> Claim:
    return _skew_claim(f23.cols, "std", "dysharp.std", "speedups hold for std 0.01-0.05 (Fig. 23)")


def powerlaw_claim(f24: Rows) -> Claim:
    return _skew_claim(f24.cols, "alpha", "dysharp.powerlaw",
                       "imbalance slows everyone, DySHARP still faster (Fig. 24)")


def inference_claim(f27: Rows) -> Claim:
    inf = f27.extra["inf"]
    return Claim("dysharp.inference", "faster prefill and 512-token decode (Fig. 27)",
                 {p: {n: round(inf[p][n] / inf[p]["dysharp"], 3) for n in ("deepep", "comet")}
                  for p in inf},
                 bool(all(inf[p]["dysharp"] < min(inf[p]["deepep"], inf[p]["comet"])
                          for p in inf)),
                 "decode: 16 tokens per GPU (512 per step over 32 GPUs), forward",
                 changed_after_failure="after the decode point failed (0.88x DeepEP) DeepEP's "
                 "notify was added (0.90x, still failing); then two double charges were removed: "
                 "weight-streaming GEMMs divided by the SM share, and fill / drain of a full "
                 "128-token tile at 16 tokens per expert")


def gpu_scaling_claim(f21: Rows) -> Claim:
    g_rows = f21.cols
    sim = {}
    ok = True
    for mname in f21.extra["models"]:
        d = np.asarray(g_rows[f"{mname}_dysharp_ms"])
        cr = np.asarray(g_rows[f"{mname}_comet_ms"]) / d
        gap = np.asarray(g_rows[f"{mname}_deepep_ms"]) - d
        crr = np.asarray(g_rows[f"{mname}_comet-rank_ms"]) / d
        sim[mname] = {"comet_over_dysharp": [round(float(x), 3) for x in cr],
                      "comet_per_rank_over_dysharp": [round(float(x), 3) for x in crr],
                      "deepep_gap_ms": [round(float(x), 4) for x in gap]}
        ok &= bool(np.all(np.diff(cr) >= 0) and np.all(np.diff(gap) > 0))
    return Claim("dysharp.gpu_scaling", "gap vs DeepEP and COMET widens from 4 to 64 GPUs "
                 "(Fig. 21)", sim, ok, "tokens per GPU fixed (weak scaling); holds judged at "
                 "every GPU count (COMET ratio non-decreasing, DeepEP gap rising) on COMET with "
                 "per-pair bytes (catalog); the per-rank reading is shown beside it")


def models_claim(f28: Rows) -> Claim:
    mod = f28.extra["mod"]
    return Claim("dysharp.models", "better on GPT-OSS-120B and Qwen3-235B (Fig. 28)", mod,
                 bool(all(min(v["deepep"], v["comet"], v["nvls"]) > 1 for v in mod.values())),
                 "GPT-OSS with 004's 64 experts; Qwen3 keeps its public 64 heads")


def dgx_claim(f29: Rows) -> Claim:
    dg = dict(zip(f29.cols["baseline"], f29.cols["over_dysharp"], strict=True))
    return Claim("dysharp.dgx_h100", "advantage on 8 GPUs, L-8 (Fig. 29)", dg,
                 bool(min(dg["deepep"], dg["comet"], dg["nvls"]) > 1),
                 "variant B (per-expert partials, local echo) shown for contrast")


def tile_claim(f30: Rows) -> Claim:
    """Fig. 30 singles out tsize = 128: the claim holds when 128 is the fastest tile swept."""
    tl = f30.cols
    ms = list(tl["dysharp_ms"])
    best = tl["tile_tokens"][int(np.argmin(ms))]
    at128 = ms[list(tl["tile_tokens"]).index(128)] if 128 in list(tl["tile_tokens"]) else None
    return Claim("dysharp.tile_size", "tsize 128 best on S-8 (Fig. 30)",
                 {"best": best, "ms": [round(v, 4) for v in ms],
                  "tile_128_over_best": None if at128 is None else round(at128 / min(ms), 4)},
                 bool(best == 128),
                 "costs modelled: padding to whole tiles, one-tile fill and drain, tiles below "
                 "64 rows compute 64 (Hopper wgmma M = 64); no per-tile sync cost",
                 changed_after_failure="the claim first failed (best 32: 1.024 ms vs 1.029 ms "
                 "at 128, quick grid); the 64-row floor (Hopper wgmma M = 64) was added after "
                 "that and it passed by the spec's band 64-256 with best 64 on the full grid; "
                 "the claim now asks what the paper says: 128 fastest")
