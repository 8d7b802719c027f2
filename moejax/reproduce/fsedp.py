"""`moejax reproduce fsedp`: paper 000 (FSE-DP) §VI, Fig. 9, 12, 14/15, 16, 17, 18 and claims.

Every number comes from `moejax.systems.fsedp` (FSE-DP A1-A5, Algorithm 1 + Rules 1-5 event
scan, Algorithm 2) and its EP / Hydra baselines (`fsedp.hydra`) on the catalog packages
`chiplet-2x2/3x3/4x4` (000 Table I) and the four Table I models; nothing is fitted to a
claim. Routing is the skewed `powerlaw:alpha=1.2` generator (the CLI default; long tail of
§II-B). Token counts per iteration share one padded shape (1024 slots, `token_mask`) so one
compiled call per (model, system) covers 16 / 64 / 256 / 1024 tokens.

`holds`, fixed before any run: same direction as the paper and, where the paper gives a
magnitude, within 1.5x of it (`_near`). Per claim:
- speedup_vs_ep / _vs_hydra: baseline latency / best FSE-DP (A2 or A3) latency per Fig. 9
  point; holds if the median > 1, the min >= 1.22 / 1.5 and the max in [2.0 / 1.5, 2.0 x 1.5].
- paired_load_low_tokens: A2 / A3 latency; holds if its mean at 16-64 tokens > 1 and > at 1024.
- onchip_memory_vs_ep: package bytes (weights + tokens, peak); holds if FSE-DP < 32 MB on
  every model and EP / FSE-DP (mean over models) within 1.5x of 5.
- rule5_marginal: |A4 / A3 - 1| of end-to-end utilization <= 5%.
- token_buffering: A5 throughput gain over A3 at slack 10 / 20 / 30%; holds if the best of
  10 / 20% is > 0 and 30% gains less than it.
- microslice_sweet_spot: latency vs micro-slices (Qwen3, largest buffer of the grid, where
  every count fits); holds if the best count is interior (first falls then rises) and < 10.
- scaling: relative utilization drop 2x2 -> 4x4; holds if FSE-DP's drop < EP's.
See docs/reproduction/fsedp.md for the deviations.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.output import plotting
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_csv
from moejax.reproduce import Claim, Report
from moejax.runner import engine
from moejax.systems import ep
from moejax.systems.fsedp import hydra
from moejax.systems.fsedp import system as fsys
from moejax.systems.fsedp.config import (
    SLOTS_PER_RUNNING_EXPERT,
    FSEDPParams,
    make_config,
    min_microslices,
)
from moejax.trace import gen

MODELS = ("phi-3.5-moe", "yuan2.0-m32", "deepseek-moe-16b", "qwen3-30b-a3b")
TOKENS = (16, 64, 256, 1024)  # 000 §VI-A tokens per iteration
TRACE_GEN = "powerlaw:alpha=1.2"
SYSTEMS = ("EP", "Hydra", "FSE-DP", "FSE-DP+paired")
MB = 1e6
GBps = 1e9

# Readings (docs/reproduction/fsedp.md "Readings"; issue 14). Primary: Table I's "4.865 TOPS"
# read as INT8 (TOPS names integer operations; 000 states no weight dtype), so weights are
# 1 byte; any-die DDR loading (000 Rule 4 / Algorithm 1 line 12 "Pre-load e to any idle
# buffer", §IV-C, Fig. 6); D2D flows charged on every mesh link of their XY route (000 §V-C
# routers, Table I per-hop latency). "shipped" = bf16 weights, trajectory-only loading,
# bytes x hops on the sender (moejax before issue 14), kept as a sensitivity.
# Since issue 14's second pass the library defaults are these readings (any-die, per-link,
# shared experts streamed); "shipped" pins the pre-issue-14 ones (shared experts omitted).
READINGS = {
    "primary": dict(weight_bytes=1.0, dtype="int8", ddr_loading="any", d2d="link",
                    shared="stream"),
    "shipped": dict(weight_bytes=2.0, dtype="bf16", ddr_loading="trajectory", d2d="sender",
                    shared="omit"),
}
READING = "primary"
NEEDED_WITHIN = 0.02  # memory "needed": smallest buffer within 2% of the largest's latency
NEEDED_BUFFERS = (2e6, 4e6)  # bytes per die tried below the catalog buffer (decimal MB)


def model_of(name: str, reading: str | None = None):
    """A Table I model with the reading's weight bytes (activations stay bf16)."""
    r = READINGS[reading or READING]
    return with_overrides(load_model(name), weight_bytes=r["weight_bytes"])


def _fsedp_kw(reading: str | None = None) -> dict:
    r = READINGS[reading or READING]
    return dict(dtype=r["dtype"], ddr_loading=r["ddr_loading"], d2d=r["d2d"],
                shared=r["shared"])


@dataclasses.dataclass(frozen=True)
class Grid:
    traces: int  # traces per point
    layers: int  # MoE layers sampled per trace
    e2e_iterations: int  # Fig. 14 / 15 end-to-end iterations (paper: 100)
    e2e_traces: int
    buffers_mb: tuple[float, ...]  # Fig. 16(a) / 17 weight buffer per die
    ddr_gbps: tuple[float, ...]  # Fig. 16 DDR bandwidth per die
    d2d_gbps: tuple[float, ...]  # Fig. 16(b) D2D link bandwidth
    microslices: tuple[float, ...]  # Fig. 17
    scale_traces: int


QUICK = Grid(traces=4, layers=1, e2e_iterations=12, e2e_traces=2,
             buffers_mb=(8.0, 14.0, 24.0, 40.0), ddr_gbps=(12.8, 25.6, 48.0, 96.0),
             d2d_gbps=(64.0, 288.0, 512.0), microslices=(2.0, 4.0, 6.0, 8.0, 12.0, 24.0, 48.0),
             scale_traces=2)
FULL = Grid(traces=16, layers=4, e2e_iterations=100, e2e_traces=8,
            buffers_mb=(8.0, 12.0, 14.0, 16.0, 24.0, 32.0, 40.0),
            ddr_gbps=(12.8, 25.6, 32.0, 48.0, 64.0, 96.0),
            d2d_gbps=(64.0, 128.0, 288.0, 512.0, 1024.0),
            microslices=(2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0),
            scale_traces=8)


def _near(sim: float, paper: float, factor: float = 1.5) -> bool:
    """Same direction and within `factor` of the paper's magnitude."""
    return sim > 0 and paper / factor <= sim <= paper * factor


def traces_for(model_name: str, tokens, traces: int, layers: int, iterations: int = 1,
               seed: int = 0):
    """Traces [len(tokens) * traces] padded to max(tokens) slots; point i // traces."""
    m = model_of(model_name)
    tpi = np.repeat(np.asarray(tokens, np.int32), traces)[:, None] * np.ones(
        (1, iterations), np.int32)
    return gen.generate(TRACE_GEN, jax.random.key(seed), num_traces=len(tpi),
                        iterations=iterations, layers=layers, tokens=int(max(tokens)),
                        num_experts=m.num_experts, top_k=m.top_k, tokens_per_iteration=tpi)


def fsedp_system(platform: str, model_name: str, ablation: str, iterations: int = 1,
                 reading: str | None = None, **kw):
    """(System, params) of FSE-DP under an ablation, micro-slices 8 raised to fit (§VI-D)."""
    cfg = make_config(load_platform(platform), model_of(model_name, reading), ablation=ablation,
                      **{**_fsedp_kw(reading), **kw})
    m = max(8.0, float(min_microslices(cfg)))
    return cfg, fsys.build(cfg, iterations), FSEDPParams(num_microslices=jnp.float32(m))


def baseline_system(platform: str, model_name: str, relocate: bool, iterations: int = 1,
                    reading: str | None = None):
    """EP (contiguous experts) or Hydra (popularity relocation), head-parallel attention."""
    plat = load_platform(platform)
    cfg = ep.make_config(plat, model_of(model_name, reading), attention="tp",
                         tp_size=plat.num_devices, dtype=READINGS[reading or READING]["dtype"])
    return hydra.build(cfg, iterations, relocate), ep.default_params(cfg)


def _np(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def run_systems(platform: str, model_name: str, tokens, traces, grid_traces: int):
    """Fig. 9 / 12 / 18 metrics of the four systems: {system: metrics [len(tokens) * T]}."""
    out = {}
    for name in SYSTEMS:
        if name in ("EP", "Hydra"):
            system, params = baseline_system(platform, model_name, name == "Hydra")
        else:
            _, system, params = fsedp_system(platform, model_name,
                                             "A2" if name == "FSE-DP" else "A3")
        out[name] = _np(engine.simulate(system, params, traces, progress=False))
    return out


def _per_point(x, n_points: int):
    """Mean over the traces of each point: [P * T] -> [P]."""
    return np.asarray(x, np.float64).reshape(n_points, -1).mean(-1)


# --- Fig. 9 / 12: layer latency and on-chip memory -----------------------------------------


def needed_onchip(model_name: str, traces, full_latency, full_onchip) -> np.ndarray:
    """Package bytes FSE-DP (A3) needs per Fig. 9 point: weights + tokens of the smallest
    per-die buffer (NEEDED_BUFFERS, then the catalog's) whose latency is within
    NEEDED_WITHIN of the catalog buffer's (§VI-B: "smaller buffer sizes are permissible at
    the cost of some performance loss"; Rule 4 fills any buffer, so the peak at the catalog
    buffer measures the input, not the need)."""
    need = np.asarray(full_onchip, np.float64).copy()
    done = np.zeros(len(need), bool)
    for buf in NEEDED_BUFFERS:
        _, system, params = fsedp_system("chiplet-2x2", model_name, "A3",
                                         weight_buffer_bytes=buf)
        r = _np(engine.simulate(system, params, traces, progress=False))
        lat = _per_point(r["latency_s"], len(TOKENS))
        byt = _per_point(np.asarray(r["peak_weight_bytes"]).sum(-1)
                         + np.asarray(r["peak_token_bytes"]).sum(-1), len(TOKENS))
        ok = (~done) & (lat <= np.asarray(full_latency) * (1 + NEEDED_WITHIN))
        need = np.where(ok, byt, need)
        done |= ok
    return need


def fig9_fig12(out: Path, grid: Grid, tick) -> dict:
    rows = {"model": [], "tokens": [], "system": [], "latency_s": [], "weight_bytes": [],
            "token_bytes": [], "onchip_bytes": [], "utilization": [], "needed_bytes": []}
    for mname in MODELS:
        tr = traces_for(mname, TOKENS, grid.traces, grid.layers)
        res = run_systems("chiplet-2x2", mname, TOKENS, tr, grid.traces)
        a3 = res["FSE-DP+paired"]
        need = needed_onchip(
            mname, tr, _per_point(a3["latency_s"], len(TOKENS)),
            _per_point(np.asarray(a3["peak_weight_bytes"]).sum(-1)
                       + np.asarray(a3["peak_token_bytes"]).sum(-1), len(TOKENS)))
        for name, r in res.items():
            lat = _per_point(r["latency_s"], len(TOKENS))
            w = _per_point(np.asarray(r["peak_weight_bytes"]).sum(-1), len(TOKENS))
            tk = _per_point(np.asarray(r["peak_token_bytes"]).sum(-1), len(TOKENS))
            util = _per_point(r["utilization_mean"], len(TOKENS))
            for i, t in enumerate(TOKENS):
                rows["model"].append(mname)
                rows["tokens"].append(t)
                rows["system"].append(name)
                rows["latency_s"].append(float(lat[i]))
                rows["weight_bytes"].append(float(w[i]))
                rows["token_bytes"].append(float(tk[i]))
                rows["onchip_bytes"].append(float(w[i] + tk[i]))
                rows["utilization"].append(float(util[i]))
                rows["needed_bytes"].append(float(need[i]) if name == "FSE-DP+paired"
                                            else float(w[i] + tk[i]))
        tick(f"Fig. 9 {mname}")
    _csv(out / "fig9_layer_latency.csv", {k: rows[k] for k in
                                          ("model", "tokens", "system", "latency_s",
                                           "utilization")})
    _plot_grouped(out / "fig9_layer_latency.png", rows, "latency_s", "layer latency",
                  "000 Fig. 9: single MoE layer latency, chiplet-2x2", log=True)
    _csv(out / "fig12_onchip_memory.csv", {k: rows[k] for k in
                                           ("model", "tokens", "system", "weight_bytes",
                                            "token_bytes", "onchip_bytes", "needed_bytes")})
    _plot_memory(out / "fig12_onchip_memory.png", rows)
    return rows


def _lookup(rows, value, **match):
    for i in range(len(rows[value])):
        if all(rows[k][i] == v for k, v in match.items()):
            return rows[value][i]
    raise KeyError(match)


def fig9_claims(rows) -> list[Claim]:
    claims = []
    speed = {"EP": [], "Hydra": []}
    pts = []
    for mname in MODELS:
        for t in TOKENS:
            best = min(_lookup(rows, "latency_s", model=mname, tokens=t, system=s)
                       for s in ("FSE-DP", "FSE-DP+paired"))
            for b in speed:
                speed[b].append(_lookup(rows, "latency_s", model=mname, tokens=t, system=b)
                                / best)
            pts.append(f"{mname}@{t}")
    for b, sid in (("EP", "fsedp.speedup_vs_ep"), ("Hydra", "fsedp.speedup_vs_hydra")):
        s = np.asarray(speed[b])
        ok = (float(np.median(s)) > 1.0 and s.min() >= 1.22 / 1.5
              and 2.0 / 1.5 <= s.max() <= 2.0 * 1.5)
        claims.append(Claim(
            sid, f"FSE-DP 1.22-2.00x lower single-layer latency than {b} over models x "
            "tokens 16-1024 (§VI-B, Fig. 9, abstract)",
            {"min": float(s.min()), "max": float(s.max()), "median": float(np.median(s)),
             "faster_points": int((s > 1).sum()), "points": len(s),
             "per_point": dict(zip(pts, [round(float(x), 3) for x in s], strict=True))},
            bool(ok),
            "" if ok else "see docs/reproduction/fsedp.md: at low tokens every system is "
            "bound by the same DDR bytes (each active expert loaded once), so FSE-DP gains "
            "only EP's per-die DDR imbalance"))
    gain = {t: np.mean([_lookup(rows, "latency_s", model=mn, tokens=t, system="FSE-DP")
                        / _lookup(rows, "latency_s", model=mn, tokens=t,
                                  system="FSE-DP+paired") for mn in MODELS]) for t in TOKENS}
    low = float(np.mean([gain[16], gain[64]]))
    ok = low > 1.0 and low > gain[1024]
    claims.append(Claim(
        "fsedp.paired_load_low_tokens", "paired-load yields significant improvements at low "
        "token counts; the gain shrinks as tokens grow (§VI-B, Fig. 9)",
        {"gain_16_64": low, "gain_by_tokens": {int(t): float(g) for t, g in gain.items()}},
        bool(ok),
        "" if ok else "at 16-64 tokens no expert is compute-bound on Table I hardware "
        "(knee ~190 tokens per expert: 4.865 TFLOP/s over 25.6 GB/s, bf16), so there is no "
        "hot expert whose compute could hide a cold one's DDR load; the hot-cold order only "
        "moves which DDR channel loads what (see docs)"))
    fse = {mn: max(_lookup(rows, "needed_bytes", model=mn, tokens=t, system="FSE-DP+paired")
                   for t in TOKENS) for mn in MODELS}
    filled = {mn: max(_lookup(rows, "onchip_bytes", model=mn, tokens=t, system=s)
                      for t in TOKENS for s in ("FSE-DP", "FSE-DP+paired")) for mn in MODELS}
    epm = {mn: max(_lookup(rows, "onchip_bytes", model=mn, tokens=t, system=s)
                   for t in TOKENS for s in ("EP", "Hydra")) for mn in MODELS}
    ratio = {mn: epm[mn] / fse[mn] for mn in MODELS}
    mean_ratio = float(np.mean(list(ratio.values())))
    ok = all(v < 32 * MB for v in fse.values()) and _near(mean_ratio, 5.0)
    claims.append(Claim(
        "fsedp.onchip_memory_vs_ep", "FSE-DP on-chip memory under 32 MB per package, about "
        "1/5 of EP's and Hydra's (§VI-B, Fig. 12)",
        {"fsedp_needed_mb": {k: v / MB for k, v in fse.items()},
         "fsedp_filled_mb": {k: v / MB for k, v in filled.items()},
         "ep_hydra_mb": {k: v / MB for k, v in epm.items()},
         "ep_over_fsedp": ratio, "mean_ep_over_fsedp": mean_ratio},
        bool(ok),
        "FSE-DP memory = what the schedule needs: the smallest per-die buffer of "
        f"{[b / MB for b in NEEDED_BUFFERS]} MB or the catalog's whose latency is within "
        f"{NEEDED_WITHIN:.0%} of the catalog buffer's, max over tokens (with the catalog "
        "buffer Rule 4 fills it: 'filled')"))
    return claims


# --- Fig. 14 / 15: end-to-end with attention, ablation A1-A5 -------------------------------


BUFFER_TOKENS = (256, 1024)  # token-buffering claim's token counts (issue 14)


def fig15(out: Path, grid: Grid, tick, model_name: str = "qwen3-30b-a3b",
          tokens: int = 64) -> dict:
    tr = traces_for(model_name, (tokens,), grid.e2e_traces, grid.layers,
                    iterations=grid.e2e_iterations, seed=1)
    it = grid.e2e_iterations
    rows = {"config": [], "utilization": [], "tokens_per_s": [], "latency_s": [],
            "deferrals": []}
    res = {}
    for abl in ("A1", "A2", "A3", "A4"):
        _, system, params = fsedp_system("chiplet-2x2", model_name, abl, it)
        res[abl] = _np(engine.simulate(system, params, tr, progress=False))
    # A5 at slack 10 / 20 / 30% (§VI-A): slack is a traced FSEDPParams field, one sweep
    _, system, params = fsedp_system("chiplet-2x2", model_name, "A5", it)
    slacks = (0.1, 0.2, 0.3)
    sweep = engine.stack_params([dataclasses.replace(params, slack=jnp.float32(s))
                                 for s in slacks])
    r5 = _np(engine.simulate(system, sweep, tr, sweep=True, progress=False))
    for i, s in enumerate(slacks):
        res[f"A5@{int(s * 100)}%"] = jax.tree_util.tree_map(lambda x, i=i: x[i], r5)
    for name in ("EP", "Hydra"):
        system, params = baseline_system("chiplet-2x2", model_name, name == "Hydra", it)
        res[name] = _np(engine.simulate(system, params, tr, progress=False))
    # token buffering at 256 / 1024 tokens (issue 14; §VI-C: at few tokens "no net gain"),
    # freed slots refilled (`FSEDPConfig.refill`): A3 and A5 at each slack, one compile each
    big = traces_for(model_name, BUFFER_TOKENS, grid.e2e_traces, grid.layers, iterations=it,
                     seed=5)
    _, system, params = fsedp_system("chiplet-2x2", model_name, "A3", it)
    r3 = _np(engine.simulate(system, params, big, progress=False))
    _, system, params = fsedp_system("chiplet-2x2", model_name, "A5", it)
    r5b = _np(engine.simulate(system, sweep, big, sweep=True, progress=False))
    for j, t in enumerate(BUFFER_TOKENS):
        sl = slice(j * grid.e2e_traces, (j + 1) * grid.e2e_traces)
        res[f"A3 {t}tok"] = jax.tree_util.tree_map(lambda x, sl=sl: x[sl], r3)
        for i, s in enumerate(slacks):
            res[f"A5@{int(s * 100)}% {t}tok"] = jax.tree_util.tree_map(
                lambda x, i=i, sl=sl: x[i][sl], r5b)
    for k, r in res.items():
        rows["config"].append(k)
        rows["utilization"].append(float(np.mean(r["utilization_mean"])))
        rows["tokens_per_s"].append(float(np.mean(r["tokens_per_s"])))
        rows["latency_s"].append(float(np.mean(r["latency_s"])))
        rows["deferrals"].append(float(np.mean(r.get("deferrals", 0.0))))
    _csv(out / "fig15_ablation.csv", rows)
    at64 = [i for i, c in enumerate(rows["config"]) if "tok" not in c]
    _plot_bars(out / "fig15_ablation.png", [rows["config"][i] for i in at64],
               [rows["utilization"][i] for i in at64],
               "compute utilization", f"000 Fig. 14/15: end-to-end {model_name}, {tokens} "
               f"tokens, {it} iterations, chiplet-2x2")
    tick("Fig. 15 ablation")
    return dict(zip(rows["config"], zip(rows["utilization"], rows["tokens_per_s"],
                                        strict=True), strict=True))


def _buffering_why(tokens: int, g: dict) -> str:
    """Why the token-buffering rule fails at one token count, read off its gains."""
    pct = " / ".join(f"{100 * g[s]:+.1f}%" for s in (10, 20, 30))
    if max(g.values()) <= 0:
        return f"{tokens} tokens: no slack gains ({pct} at 10 / 20 / 30%)"
    if g[30] >= max(g[10], g[20]):
        return (f"{tokens} tokens: the gain grows with slack ({pct} at 10 / 20 / 30%), "
                "where the paper has 30% help less")
    return f"{tokens} tokens: {pct} at 10 / 20 / 30%"


def fig15_claims(res) -> list[Claim]:
    a3u, a3t = res["A3"]
    a4u, _ = res["A4"]
    r5 = a4u / a3u - 1.0
    claims = [Claim(
        "fsedp.rule5_marginal", "Rule 5 (A4 vs A3) yields only marginal gains (§VI-C, Fig. 15)",
        {"a4_over_a3_utilization": r5 + 1.0,
         "utilization": {k: v[0] for k, v in res.items()}},
        bool(abs(r5) <= 0.05),
        "" if abs(r5) <= 0.05 else "Rule 5 fixes each die's DDR share of an expert at its "
        "start (by free space); Rule 4 as modelled re-pools the load over the trajectory at "
        "every event, which adapts to later congestion, so Rule 5 is not a pure addition")]
    gains = {s: res[f"A5@{s}%"][1] / a3t - 1.0 for s in (10, 20, 30)}
    by_tokens = {64: gains}
    for t in BUFFER_TOKENS:
        if f"A3 {t}tok" in res:
            by_tokens[t] = {s: res[f"A5@{s}% {t}tok"][1] / res[f"A3 {t}tok"][1] - 1.0
                            for s in (10, 20, 30)}

    def rule(g):
        best_low = max(g[10], g[20])
        return bool(best_low > 0 and g[30] < best_low)

    # read at 256 and 1024 tokens (issue 14; §VI-C expects no gain at few tokens)
    judged = [t for t in BUFFER_TOKENS if t in by_tokens] or [64]
    ok = all(rule(by_tokens[t]) for t in judged)
    claims.append(Claim(
        "fsedp.token_buffering", "token buffering with 10-20% slack raises end-to-end "
        "throughput; 30% slack helps less (§VI-C, Fig. 14)",
        {"throughput_gain_by_slack_pct": gains, "judged_at_tokens": judged,
         "gain_by_tokens": {int(t): g for t, g in by_tokens.items()},
         "holds_by_tokens": {int(t): rule(g) for t, g in by_tokens.items()}},
        bool(ok),
        "" if ok else "; ".join(_buffering_why(t, by_tokens[t]) for t in judged)
        + " (see docs/reproduction/fsedp.md)"))
    return claims


# --- Fig. 16 / 17: design space as one vmapped sweep over params ---------------------------


def _fits_m(model, buf_bytes: float, m: float) -> bool:
    return 2 * SLOTS_PER_RUNNING_EXPERT * model.expert_weight_bytes / m <= buf_bytes


def fig16(out: Path, grid: Grid, tick, model_name: str = "qwen3-30b-a3b",
          tokens: int = 64) -> dict:
    """(a) buffer x DDR at D2D 288 GB/s, (b) DDR x D2D at 14 MB: ONE vmapped params sweep."""
    model = model_of(model_name)
    cfg, system, base = fsedp_system("chiplet-2x2", model_name, "A3")
    pts = [("a", b, d, 288.0) for b in grid.buffers_mb for d in grid.ddr_gbps]
    pts += [("b", 14.0, d, l) for d in grid.ddr_gbps for l in grid.d2d_gbps]
    params = [FSEDPParams(
        num_microslices=jnp.float32(max(8.0, math.ceil(2 * SLOTS_PER_RUNNING_EXPERT
                                                       * model.expert_weight_bytes
                                                       / (b * MB)))),
        ddr_Bps=jnp.float32(d * GBps), link_Bps=jnp.float32(l * GBps),
        weight_buffer_bytes=jnp.float32(b * MB)) for _, b, d, l in pts]
    tr = traces_for(model_name, (tokens,), grid.traces, grid.layers, seed=2)
    r = _np(engine.simulate(system, engine.stack_params(params), tr, sweep=True,
                            progress=False))
    util = np.asarray(r["utilization_mean"]).mean(-1)
    lat = np.asarray(r["latency_s"]).mean(-1)
    rows = {"panel": [p[0] for p in pts], "buffer_mb": [p[1] for p in pts],
            "ddr_gbps": [p[2] for p in pts], "d2d_gbps": [p[3] for p in pts],
            "num_microslices": [float(p.num_microslices) for p in params],
            "utilization": util.tolist(), "latency_s": lat.tolist(),
            "unfinished": np.asarray(r["unfinished_layers"]).sum(-1).tolist()}
    _csv(out / "fig16_design_space.csv", rows)
    plot_fig16(out, rows, model_name, tokens)
    rows["_ceiling"] = utilization_ceiling(cfg, tr, grid.ddr_gbps)
    tick("Fig. 16 design space")
    return rows


def utilization_ceiling(cfg, tr, ddr_gbps) -> dict:
    """Fig. 16's utilization ceiling from Table I alone, per DDR bandwidth per die: expert
    compute over max(compute, DDR time of the active experts), all D dies working, any
    schedule (the paper reports > 60% at 48 GB/s and 16 MB, Qwen3 / 64 tokens). Mean over
    the traces' layers; shared units counted as streamed experts."""
    mod, d = cfg.model, cfg.num_devices
    cnt = np.asarray(tr.counts, np.float64)[:, 0]  # [T, L, E] first iteration
    n_tok = cnt.sum(-1) / mod.top_k
    pairs = cnt.sum(-1) + n_tok * cfg.shared_units
    active = (cnt > 0).sum(-1) + cfg.shared_units
    comp = pairs * mod.expert_flops_per_token / (d * cfg.peak_flops)
    out = {}
    for g in ddr_gbps:
        ddr = active * mod.expert_weight_bytes / (d * g * GBps)
        out[f"{g:g}"] = float(np.mean(comp / np.maximum(comp, ddr)))
    return out


def fig17(out: Path, grid: Grid, tick, tokens: int = 256) -> dict:
    """Latency over micro-slice count x weight buffer (Phi-3.5, Qwen3), one sweep per model."""
    rows = {"model": [], "buffer_mb": [], "num_microslices": [], "latency_s": []}
    for mname in ("phi-3.5-moe", "qwen3-30b-a3b"):
        model = model_of(mname)
        bufs = tuple(b * (4 if mname.startswith("phi") else 1) for b in grid.buffers_mb)
        _, system, _ = fsedp_system("chiplet-2x2", mname, "A3")
        pts = [(b, m) for b in bufs for m in grid.microslices
               if _fits_m(model, b * MB, m)]
        params = engine.stack_params([
            FSEDPParams(num_microslices=jnp.float32(m), weight_buffer_bytes=jnp.float32(b * MB))
            for b, m in pts])
        tr = traces_for(mname, (tokens,), grid.traces, grid.layers, seed=3)
        r = _np(engine.simulate(system, params, tr, sweep=True, progress=False))
        lat = np.asarray(r["latency_s"]).mean(-1)
        for (b, m), v in zip(pts, lat, strict=True):
            rows["model"].append(mname)
            rows["buffer_mb"].append(b)
            rows["num_microslices"].append(m)
            rows["latency_s"].append(float(v))
        tick(f"Fig. 17 {mname}")
    # the claim's overhead readings (Qwen3, claim buffer): the control overhead also charged
    # to every micro-slice transfer (000 §IV "per-transfer header cost"), at the library's
    # 0.5 us and at 2 us (the review's sensitivity); "ctrl" rows above charge compute only
    rows["overhead"] = ["ctrl 0.5us"] * len(rows["model"])
    model = model_of("qwen3-30b-a3b")
    ms = [m for m in grid.microslices if _fits_m(model, CLAIM_BUFFER_MB * MB, m)]
    tr = traces_for("qwen3-30b-a3b", (tokens,), grid.traces, grid.layers, seed=3)
    for label, ovh in OVERHEAD_READINGS.items():
        _, system, _ = fsedp_system("chiplet-2x2", "qwen3-30b-a3b", "A3",
                                    ctrl_overhead_s=ovh, xfer_overhead_s=ovh)
        params = engine.stack_params([FSEDPParams(
            num_microslices=jnp.float32(m),
            weight_buffer_bytes=jnp.float32(CLAIM_BUFFER_MB * MB)) for m in ms])
        r = _np(engine.simulate(system, params, tr, sweep=True, progress=False))
        for m, v in zip(ms, np.asarray(r["latency_s"]).mean(-1), strict=True):
            rows["model"].append("qwen3-30b-a3b")
            rows["buffer_mb"].append(CLAIM_BUFFER_MB)
            rows["num_microslices"].append(m)
            rows["latency_s"].append(float(v))
            rows["overhead"].append(label)
        tick(f"Fig. 17 overhead {label}")
    _csv(out / "fig17_microslices.csv", rows)
    plot_fig17(out, {k: [v for v, o in zip(rows[k], rows["overhead"], strict=True)
                         if o == "ctrl 0.5us"] for k in rows}, tokens)
    return rows


CLAIM_BUFFER_MB = 14.0  # per die; the review's small-buffer setting (Fig. 16(b) / 17)
# Overhead readings of the Fig. 17 claim: seconds per micro-slice on compute AND on each DDR
# load / D2D forward (`xfer_overhead_s`). 0.5 us = DEFAULT_CTRL_OVERHEAD_S (chosen before any
# result); 2 us = the review's sensitivity. The first is the claim's primary reading.
OVERHEAD_READINGS = {"ctrl+xfer 0.5us": 0.5e-6, "ctrl+xfer 2us": 2e-6}


def _sweet_spot(rows, q, buf):
    j = sorted((i for i in q if rows["buffer_mb"][i] == buf),
               key=lambda i: rows["num_microslices"][i])
    ms = [rows["num_microslices"][i] for i in j]
    lat = [rows["latency_s"][i] for i in j]
    k = int(np.argmin(lat))
    return ms, lat, k, bool(0 < k < len(ms) - 1 and ms[k] < 10)


def fig17_claim(rows) -> Claim:
    over = rows.get("overhead", ["ctrl 0.5us"] * len(rows["model"]))
    by_reading = {}
    for label in OVERHEAD_READINGS:
        q = [i for i, v in enumerate(rows["model"]) if v == "qwen3-30b-a3b" and over[i] == label]
        if q:
            ms, lat, k, ok = _sweet_spot(rows, q, CLAIM_BUFFER_MB)
            by_reading[label] = {"microslices": ms, "latency_s": lat, "best": ms[k],
                                 "holds": ok}
    q = [i for i, v in enumerate(rows["model"]) if v == "qwen3-30b-a3b"
         and over[i] == "ctrl 0.5us"]
    # issue 14 / review: at the largest buffer the coarse (left) branch disappears; the claim
    # is read at the 14 MB buffer (in both grids) and reported at every buffer
    bufs = {rows["buffer_mb"][i] for i in q}
    big = CLAIM_BUFFER_MB if CLAIM_BUFFER_MB in bufs else max(bufs)
    j = sorted((i for i in q if rows["buffer_mb"][i] == big),
               key=lambda i: rows["num_microslices"][i])
    ms = [rows["num_microslices"][i] for i in j]
    lat = [rows["latency_s"][i] for i in j]
    k = int(np.argmin(lat))
    best_by_buf = {}
    for b in sorted({rows["buffer_mb"][i] for i in q}):
        jj = [i for i in q if rows["buffer_mb"][i] == b]
        best_by_buf[b] = rows["num_microslices"][min(jj, key=lambda i: rows["latency_s"][i])]
    ok = 0 < k < len(ms) - 1 and ms[k] < 10
    by_reading["ctrl 0.5us"] = {"microslices": ms, "latency_s": lat, "best": ms[k],
                                "holds": bool(ok)}
    primary = next(iter(OVERHEAD_READINGS))
    if primary in by_reading:  # the claim reads the overhead charged to transfers too
        ms, lat = by_reading[primary]["microslices"], by_reading[primary]["latency_s"]
        k, ok = int(np.argmin(lat)), by_reading[primary]["holds"]
    return Claim(
        "fsedp.microslice_sweet_spot", "latency first falls then rises with the micro-slice "
        "count; below 10 micro-slices is preferred (§VI-D, Fig. 17)",
        {"buffer_mb": big, "reading": primary if primary in by_reading else "ctrl 0.5us",
         "microslices": ms, "latency_s": lat, "best": ms[k],
         "best_by_buffer_mb": best_by_buf, "by_reading": by_reading},
        bool(ok),
        "" if ok else "see docs/reproduction/fsedp.md (Fig. 17)")


# --- Fig. 18: scalability ------------------------------------------------------------------

# Sensitivity row: FSE-DP (A3) with Table I's "288 GB/s" D2D read as a per-die budget that
# all links leaving a die share (`d2d = "die"`; §VI-D Eq. (1) sizes UCIe modules per chiplet)
DIE_BUDGET = "FSE-DP+paired, D2D per-die budget"


def fig18(out: Path, grid: Grid, tick, model_name: str = "qwen3-30b-a3b",
          tokens: int = 256) -> dict:
    rows = {"platform": [], "system": [], "utilization": [], "latency_s": []}
    for plat in ("chiplet-2x2", "chiplet-3x3", "chiplet-4x4"):
        tr = traces_for(model_name, (tokens,), grid.scale_traces, grid.layers, seed=4)
        for name in ("EP", "Hydra", "FSE-DP+paired", DIE_BUDGET):
            if name == DIE_BUDGET:  # Table I's 288 GB/s as a per-die UCIe budget (§VI-D)
                _, system, params = fsedp_system(plat, model_name, "A3", d2d="die")
            elif name == "FSE-DP+paired":
                _, system, params = fsedp_system(plat, model_name, "A3")
            else:
                system, params = baseline_system(plat, model_name, name == "Hydra")
            r = _np(engine.simulate(system, params, tr, progress=False))
            rows["platform"].append(plat)
            rows["system"].append(name)
            rows["utilization"].append(float(np.mean(r["utilization_mean"])))
            rows["latency_s"].append(float(np.mean(r["latency_s"])))
        tick(f"Fig. 18 {plat}")
    _csv(out / "fig18_scaling.csv", rows)
    plot_fig18(out, rows, model_name, tokens)
    return rows


def fig18_claim(rows) -> Claim:
    def drop(name):
        u2 = _lookup(rows, "utilization", platform="chiplet-2x2", system=name)
        u4 = _lookup(rows, "utilization", platform="chiplet-4x4", system=name)
        return 1.0 - u4 / u2 if u2 > 0 else 0.0

    d = {s: drop(s) for s in ("EP", "Hydra", "FSE-DP+paired")
         if s in rows["system"]}
    by_reading = {"link (primary)": bool(d["FSE-DP+paired"] < d["EP"])}
    if DIE_BUDGET in rows["system"]:
        d[DIE_BUDGET] = drop(DIE_BUDGET)
        by_reading["die budget"] = bool(d[DIE_BUDGET] < d["EP"])
    return Claim(
        "fsedp.scaling", "from 2x2 to 4x4, FSE-DP's utilization drops much less than EP's "
        "(and Hydra's) (§VI-E, Fig. 18)",
        {"relative_drop": d, "holds_by_d2d_reading": by_reading,
         "utilization": {f"{p}/{s}": u for p, s, u in zip(
            rows["platform"], rows["system"], rows["utilization"], strict=True)}},
        bool(d["FSE-DP+paired"] < d["EP"]),
        "" if d["FSE-DP+paired"] < d["EP"] else "each trajectory die forwards W (|T_e|-1)/"
        "|T_e| of every visiting expert over ring hops (1.8 on average on 4x4): the busiest "
        "die's D2D paces the layer while EP loads its own experts (see docs)")


# --- study ---------------------------------------------------------------------------------


def run(out_dir: Path, quick: bool) -> Report:
    out = Path(out_dir)
    grid = QUICK if quick else FULL
    steps = len(MODELS) + 1 + 1 + 2 + len(OVERHEAD_READINGS) + 3
    with study_progress("fsedp", steps) as tick:
        f9 = fig9_fig12(out, grid, tick)
        claims = fig9_claims(f9)
        f15 = fig15(out, grid, tick)
        claims += fig15_claims(f15)
        f16 = fig16(out, grid, tick)
        f17 = fig17(out, grid, tick)
        claims.append(fig17_claim(f17))
        f18 = fig18(out, grid, tick)
        claims.append(fig18_claim(f18))
    files = [f"{stem}.{ext}" for stem in (
        "fig9_layer_latency", "fig12_onchip_memory", "fig15_ablation", "fig16_design_space",
        "fig17_microslices", "fig18_scaling") for ext in ("csv", "png")]
    best16 = max(range(len(f16["utilization"])), key=lambda i: f16["utilization"][i])
    extra = {"trace_gen": TRACE_GEN, "grid": dataclasses.asdict(grid),
             "fig16_points": len(f16["utilization"]),
             "fig16_unfinished_layers": int(sum(f16["unfinished"])),
             "fig16_best": {k: f16[k][best16] for k in ("panel", "buffer_mb", "ddr_gbps",
                                                        "d2d_gbps", "utilization")},
             "fig16_ceiling_by_ddr_gbps": f16["_ceiling"], "readings": READINGS[READING]}
    return Report("fsedp", claims, files, extra)


# --- output helpers ------------------------------------------------------------------------


def _csv(path: Path, cols: dict) -> None:
    atomic_write_csv(path, {k: np.asarray(v) for k, v in cols.items()})


# Legend entries, explained (000 §VI-A / §VI-C; docs/reproduction/fsedp.md "mechanisms").
SYSTEM_LABELS = {
    "EP": "EP (experts contiguous, token all-to-all)",
    "Hydra": "Hydra (expert replication)",
    "FSE-DP": "FSE-DP = A2 (micro-slice streaming, Alg. 1)",
    "FSE-DP+paired": "FSE-DP+paired = A3 (A2 + paired load)",
}
ABLATION_LABELS = {
    "A1": "A1: naive FSE-DP (tokens all-to-all per expert, W/D per die)",
    "A2": "A2: micro-slice streaming, Alg. 1 + Rules 1-4",
    "A3": "A3: A2 + paired load (hot/cold order)",
    "A4": "A4: A3 + Rule 5 (DDR split by free space)",
    "A5": "A5@s: A3 + token buffering (Alg. 2), QoS slack s",
    "EP": SYSTEM_LABELS["EP"],
    "Hydra": SYSTEM_LABELS["Hydra"],
}


def _plot_grouped(path, rows, y, ylabel, title, log=False):
    """One panel per model: bars per token count, one colour per system (y in seconds)."""
    fig, axes = plotting.figure(1, len(MODELS), width=3.5, height=3.6)
    w = 0.8 / len(SYSTEMS)
    for ax, mname in zip(axes[0], MODELS, strict=True):
        for j, s in enumerate(SYSTEMS):
            vals = [_lookup(rows, y, model=mname, tokens=t, system=s) for t in TOKENS]
            ax.bar(np.arange(len(TOKENS)) + j * w, vals, w, label=SYSTEM_LABELS.get(s, s))
        ax.set_xticks(np.arange(len(TOKENS)) + 0.4 - w / 2, [str(t) for t in TOKENS])
        ax.set_xlabel("tokens per iteration")
        ax.set_title(mname, fontsize=9)
        if log:
            _log_if_wide(ax, [v for i, v in enumerate(rows[y]) if rows["model"][i] == mname])
        plotting.time_axis(ax, "y", "ms", ylabel if ax is axes[0, 0] else "")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    fig.suptitle(title, fontsize=9)
    plotting.save(fig, path, dpi=90)


def _plot_memory(path, rows):
    """Fig. 12: package on-chip bytes (weights + tokens), max over token counts, per model."""
    fig, axes = plotting.figure(width=8.0, height=4.2)
    ax = axes[0, 0]
    w = 0.8 / len(SYSTEMS)
    colors = [f"C{j}" for j in range(len(SYSTEMS))]
    for j, s in enumerate(SYSTEMS):
        wts, tks = [], []
        for mname in MODELS:
            i = max((i for i in range(len(rows["model"]))
                     if rows["model"][i] == mname and rows["system"][i] == s),
                    key=lambda i: rows["onchip_bytes"][i])
            wts.append(rows["weight_bytes"][i])
            tks.append(rows["token_bytes"][i])
        x = np.arange(len(MODELS)) + j * w
        ax.bar(x, wts, w, color=colors[j], label=f"{SYSTEM_LABELS.get(s, s)}: weights")
        ax.bar(x, tks, w, bottom=wts, color=colors[j], alpha=0.45, hatch="//",
               label=f"{s}: tokens (stacked, hatched)")
    ax.set_xticks(np.arange(len(MODELS)) + 0.4 - w / 2, MODELS, fontsize=7)
    ax.axhline(32 * MB, color="k", lw=0.8, ls="--", label="32 MB on-chip (000 Table I)")
    _log_if_wide(ax, [*rows["onchip_bytes"], 32 * MB])
    plotting.bytes_axis(ax, "y", "MB", "peak on-chip memory, package")
    ax.set_title("000 Fig. 12: on-chip memory (weights + tokens), chiplet-2x2", fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=6,
               ncol=2)
    plotting.save(fig, path, dpi=90)


def _log_if_wide(ax, values) -> None:
    """A log y axis (labels at powers of ten only) when the values span more than a decade;
    a log axis over less than one decade would show no labelled tick at all."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 10:
        plotting.log_axis(ax, "y", base=10)


def _plot_bars(path, labels, values, ylabel, title):
    """Bars per configuration; A1-A5 and the baselines named in a legend below."""
    fig, axes = plotting.figure(width=8.0, height=4.6)
    ax = axes[0, 0]
    ax.bar(range(len(values)), values, color="C0")
    ax.set_xticks(range(len(values)), labels, fontsize=7, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    names = []
    for lab in labels:
        key = lab.split("@")[0]
        if key in ABLATION_LABELS and ABLATION_LABELS[key] not in names:
            names.append(ABLATION_LABELS[key])
    if names:  # text-only legend entries: what each bar label stands for
        from matplotlib.patches import Patch

        handles = [Patch(visible=False) for _ in names]
        fig.legend(handles, names, loc="outside lower left", fontsize=7, handlelength=0,
                   handletextpad=0, frameon=False)
    plotting.save(fig, path, dpi=90)


def plot_fig16(out: Path, rows: dict, model_name: str, tokens: int) -> None:
    """Fig. 16 heatmaps from its rows (also from fig16_design_space.csv)."""
    fig, axes = plotting.figure(1, 2, width=5.0, height=4.0)
    lo, hi = plotting.color_limits(rows["utilization"])  # the colour scale fits the data
    for ax, panel, (xk, yk) in zip(axes[0], "ab", (("ddr_gbps", "buffer_mb"),
                                                   ("ddr_gbps", "d2d_gbps")), strict=True):
        idx = [i for i, p in enumerate(rows["panel"]) if p == panel]
        xs = sorted({rows[xk][i] for i in idx})
        ys = sorted({rows[yk][i] for i in idx})
        z = np.full((len(ys), len(xs)), np.nan)
        for i in idx:
            z[ys.index(rows[yk][i]), xs.index(rows[xk][i])] = rows["utilization"][i]
        im = ax.imshow(z, origin="lower", aspect="auto", vmin=lo, vmax=hi, cmap="viridis")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys], fontsize=7)
        ax.set_xlabel("DDR bandwidth per die (GB/s)")
        ax.set_ylabel("weight buffer per die (MB)" if panel == "a" else "D2D link (GB/s)")
        for (yy, xx), v in np.ndenumerate(z):
            ax.text(xx, yy, f"{v:.3f}", ha="center", va="center", fontsize=6,
                    color="w" if v < (lo + hi) / 2 else "k")
        ax.set_title(f"({panel}) " + ("D2D 288 GB/s" if panel == "a" else "buffer 14 MB"),
                     fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="compute utilization (fraction of peak)")
    fig.suptitle(f"000 Fig. 16: DSE, {model_name}, {tokens} tokens (one vmapped sweep)",
                 fontsize=9)
    plotting.save(fig, out / "fig16_design_space.png", dpi=90)


def plot_fig17(out: Path, rows: dict, tokens: int) -> None:
    """Fig. 17 curves from its rows (also from fig17_microslices.csv)."""
    fig, axes = plotting.figure(1, 2, width=5.0, height=3.8)
    for ax, mname in zip(axes[0], ("phi-3.5-moe", "qwen3-30b-a3b"), strict=True):
        idx = [i for i, v in enumerate(rows["model"]) if v == mname]
        for b in sorted({rows["buffer_mb"][i] for i in idx}):
            j = [i for i in idx if rows["buffer_mb"][i] == b]
            ax.plot([rows["num_microslices"][i] for i in j], [rows["latency_s"][i] for i in j],
                    marker="o", label=f"weight buffer {b:g} MB per die")
        plotting.log_axis(ax, "x", base=2)
        ax.set_xlabel("micro-slices per expert")
        plotting.time_axis(ax, "y", "ms", "MoE layer latency")
        ax.set_title(mname, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"000 Fig. 17: granularity sensitivity, {tokens} tokens", fontsize=9)
    plotting.save(fig, out / "fig17_microslices.png", dpi=90)


def plot_fig18(out: Path, rows: dict, model_name: str, tokens: int) -> None:
    """Fig. 18 from its rows (also from fig18_scaling.csv)."""
    fig, axes = plotting.figure(width=7.0, height=4.0)
    ax = axes[0, 0]
    for name in ("EP", "Hydra", "FSE-DP+paired", DIE_BUDGET):
        j = [i for i, s in enumerate(rows["system"]) if s == name]
        ax.plot([rows["platform"][i] for i in j], [rows["utilization"][i] for i in j],
                marker="o", label=SYSTEM_LABELS.get(name, name))
    ax.set_ylabel("compute utilization (fraction of peak)")
    ax.set_xlabel("platform (chiplets)")
    ax.set_title(f"000 Fig. 18: scalability, {model_name}, {tokens} tokens", fontsize=9)
    ax.legend(fontsize=7)
    plotting.save(fig, out / "fig18_scaling.png", dpi=90)
