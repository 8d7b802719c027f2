"""`moejax reproduce epsmoe`: paper 003 (EPS-MoE) Tables 1-7, Fig. 5, 9, 10, 11 and its claims.

Every number comes from `moejax.systems.epsmoe` (one prefill forward: attention + MoE by the
TP+TP / DP+EP / TP+EP rules, expert pipeline flow shop, GEMM wave model of
`moejax.physics.gemm`) on `hardware/h800x4.toml` / `h800x8.toml`; nothing is fitted to a
claim. Each (platform, model, mode) compiles once: the variants of a table (pipeline degree,
kernel, SM split, FP8, workload size) are traced params swept in one vmapped call. A trace of
`Grid.tokens` simulated tokens stands for the workload's B x S tokens (each routed token counts
B x S / tokens times; the routing statistics, not the sample, set the volumes).

Routing: uniform top-k (the paper gives no routing statistics) and, for DeepSeek-V2, its
device-limited routing (M = 3 devices, `moejax.trace.device_limited`); `volumes.csv` adds a
skewed `powerlaw:alpha=1.2`. `holds` per claim is the spec's rule (shared/specs/epsmoe.md §3),
fixed before any run. See docs/reproduction/epsmoe.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.output import plotting
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_csv
from moejax.physics import gemm
from moejax.reproduce import Claim, Report, epsmoe_figures
from moejax.runner import engine
from moejax.systems.epsmoe.config import default_params, make_config
from moejax.systems.epsmoe.layer import heuristic_pn
from moejax.systems.epsmoe.system import build
from moejax.trace import device_limited, gen


@dataclasses.dataclass(frozen=True)
class Grid:
    traces: int  # traces per point
    tokens: int  # simulated token slots per trace
    layers: int  # MoE layers sampled per trace
    fig11_dims: tuple[int, ...]  # expert ffn sizes of Fig. 11 (a, b: 1536; c: 14336)
    table5_dims: tuple[int, ...]  # Table 5 output dims


QUICK = Grid(traces=2, tokens=4096, layers=1, fig11_dims=(1536,), table5_dims=(1536,))
FULL = Grid(traces=8, tokens=16384, layers=2, fig11_dims=(1536, 14336),
            table5_dims=(1536, 15360))
P_PAD = 48  # params per sweep call, padded: one compile per (platform, model, mode)


def _csv(path: Path, rows: dict) -> None:
    atomic_write_csv(path, {k: np.asarray(v) for k, v in rows.items()})


class Runner:
    """Traces and compiled systems shared by the tables."""

    def __init__(self, grid: Grid):
        self.grid = grid
        self._systems: dict = {}
        self._traces: dict = {}

    def traces(self, model, spec: str = "uniform", limited: int = 0, devices: int = 8):
        key = (model.name, model.num_experts, spec, limited, devices)
        if key not in self._traces:
            kw = dict(num_traces=self.grid.traces, iterations=1, layers=self.grid.layers,
                      tokens=self.grid.tokens, num_experts=model.num_experts,
                      top_k=model.top_k)
            if limited:
                tr = device_limited.generate(spec, jax.random.key(7), num_devices=devices,
                                             max_devices=limited, **kw)
            else:
                tr = gen.generate(spec, jax.random.key(7), **kw)
            self._traces[key] = tr
        return self._traces[key]

    def run(self, platform: str, model, mode: str, variants: list[dict], traces=None):
        """Metrics {name: [len(variants), T]} of `variants` (default_params changes)."""
        plat = load_platform(platform)
        key = (platform, model, mode)
        if key not in self._systems:
            cfg = make_config(plat, model, mode=mode)
            self._systems[key] = (cfg, build(cfg))
        cfg, system = self._systems[key]
        if traces is None:
            traces = self.traces(model, limited=3 if model.name == "deepseek-v2" else 0,
                                 devices=plat.num_devices)
        params = [default_params(cfg, **v) for v in variants]
        out = {}
        for s in range(0, len(params), P_PAD):
            chunk = params[s:s + P_PAD]
            padded = chunk + [chunk[-1]] * (P_PAD - len(chunk))
            r = engine.simulate(system, engine.stack_params(padded), traces, sweep=True,
                                progress=False)
            for k, v in r.items():
                out.setdefault(k, []).append(np.asarray(v)[:len(chunk)])
        return {k: np.concatenate(v, 0) for k, v in out.items()}


def _mean(x):
    return np.asarray(x, np.float64).mean(-1)


def _gain(base, new):
    """Latency reduction 1 - new / base (A9), in %."""
    return 100.0 * (1.0 - np.asarray(new) / np.asarray(base))


# --- volumes (E4-E7) ----------------------------------------------------------------------


def volumes(out: Path, run: Runner, tick) -> dict:
    rows = {k: [] for k in ("model", "platform", "routing", "trace", "mode", "bytes_per_device",
                            "formula_bytes")}
    strict = True
    for mname, plat in (("mixtral-8x7b", "h800x4"), ("dbrx", "h800x8"),
                        ("deepseek-v2", "h800x8")):
        m = load_model(mname)
        if mname == "dbrx":
            m = with_overrides(m, weight_bytes=2.0)
        d = load_platform(plat).num_devices
        for spec in ("uniform", "powerlaw:alpha=1.2"):
            tr = run.traces(m, spec, 3 if mname == "deepseek-v2" else 0, d)
            res = {mode: run.run(plat, m, mode, [dict(tokens_per_forward=16384.0)], tr)
                   for mode in ("dp-ep", "tp-ep", "tp-tp")}
            p = 16384.0 * m.token_bytes
            v = {mode: res[mode]["bytes_per_device"][0] for mode in res}
            strict &= bool(np.all((v["dp-ep"] < v["tp-ep"]) & (v["tp-ep"] < v["tp-tp"])))
            formula = {"tp-tp": 4 * p / d * (d - 1), "dp-ep": np.nan,
                       "tp-ep": 2 * p / d * (d - 1)}
            for mode in res:
                for t, b in enumerate(v[mode]):
                    rows["model"].append(mname)
                    rows["platform"].append(plat)
                    rows["routing"].append(spec)
                    rows["trace"].append(t)
                    rows["mode"].append(mode)
                    rows["bytes_per_device"].append(float(b))
                    rows["formula_bytes"].append(formula[mode])
    _csv(out / "volumes.csv", rows)
    tick("volumes (E4-E7)")
    return {"strict": strict}


# --- Fig. 9: horizontal vs vertical split I/O (E8) -----------------------------------------

FIG9_TOKENS_PER_DEVICE = 4096  # spec check 4's m


def fig9(out: Path, run: Runner, tick) -> dict:
    """Memory I/O of one DeepSeek-V2 device's routed GEMMs split into N chunks, horizontally
    (EPS-MoE: weights by expert) or vertically (weights by columns, partial outputs written N
    times), from the rows of the device-limited traces (4096 tokens per device)."""
    from moejax.systems.epsmoe import split_io

    m = load_model("deepseek-v2")
    plat = load_platform("h800x8")
    d = plat.num_devices
    tr = run.traces(m, limited=3, devices=d)
    ids = np.asarray(tr.expert_ids)[:, 0, 0]  # [T, N, K]: first iteration and layer
    mask = np.asarray(tr.token_mask)[:, 0]
    scale = FIG9_TOKENS_PER_DEVICE * d / np.maximum(mask.sum(-1), 1)
    rows = np.stack([np.asarray(split_io.rows_per_device(ids[t], mask[t], d, m.num_experts,
                                                         scale[t])) for t in range(len(ids))])
    pn = np.asarray([1, 2, 4, 5, 10, 20], np.float64)
    p_row = m.hidden_size * m.act_bytes
    va, vb = split_io.split_io_bytes(rows[:, :, None, :], pn[None, None, :],
                                     m.expert_weight_bytes, p_row, p_row)
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)  # [T, D, N]
    bw = plat.device.memory_Bps
    m_dev = rows.sum(-1)[..., None]
    exact = bool(np.allclose(vb - va, (pn - 1) * m_dev * p_row, rtol=1e-5))
    cols = {k: [] for k in ("PN", "horizontal_MB", "vertical_MB", "horizontal_ms",
                            "vertical_ms", "rows_per_device")}
    for j, n in enumerate(pn):
        a, b = va[..., j].mean(), vb[..., j].mean()
        for key, val in zip(cols, (n, a / 1e6, b / 1e6, a / bw * 1e3, b / bw * 1e3,
                                   float(m_dev.mean())), strict=True):
            cols[key].append(val)
    _csv(out / "fig9_split_io.csv", cols)
    epsmoe_figures.fig9(out / "fig9_split_io.png", {k: np.asarray(v) for k, v in cols.items()})
    tick("Fig. 9 split I/O")
    return {"difference_is_(N-1)mP1": exact,
            "vertical_over_horizontal_at_N20": float(vb[..., -1].mean() / va[..., -1].mean()),
            "horizontal_MB_flat_in_N": float(np.ptp(va.mean((0, 1))) / 1e6)}


# --- Fig. 5: grouped vs dense GEMM --------------------------------------------------------


FIG5_M = (256, 512, 1024, 1536, 2048, 3072, 4096, 4608, 5120, 6144, 8192)


def fig5(out: Path, tick) -> dict:
    """16 experts [1536, 5120] (one GEMM: k = 5120, n = 1536 per the spec), m rows each."""
    dev = load_platform("h800x8").device
    prof = gemm.GemmProfile()
    m = np.asarray(FIG5_M, np.float32)
    rows = np.repeat(m[:, None], 16, axis=1)
    kw = dict(sm_total=dev.sm_count, peak_flops=dev.flops("bf16"), memory_Bps=dev.memory_Bps,
              weight_bytes=2.0, act_bytes=2.0, profile=prof)
    tg = np.asarray(gemm.group_time_s(rows, 5120, 1536, sms=dev.sm_count, **kw))
    td = np.asarray(gemm.dense_time_s(rows, 5120, 1536, sms=dev.sm_count, **kw))
    flops = 16 * 2.0 * m * 5120 * 1536
    sms = np.array([132, 124, 116, 108, 100, 92], np.float32)
    tg_sm = np.asarray([gemm.group_time_s(np.full(16, 6144.0), 5120, 1536, sms=s, **kw)
                        for s in sms])
    _csv(out / "fig5_gemm.csv", {"rows_per_expert": m, "group_s": tg, "dense_s": td,
                                 "group_tflops": flops / tg / 1e12,
                                 "dense_tflops": flops / td / 1e12})
    _csv(out / "fig5_gemm_sms.csv", {"sms": sms, "group_s_m6144": tg_sm})
    epsmoe_figures.fig5(out / "fig5_gemm.png",
                        {"rows_per_expert": m, "group_tflops": flops / tg / 1e12,
                         "dense_tflops": flops / td / 1e12},
                        {"sms": sms, "group_s_m6144": tg_sm})
    dense_wins = td < tg
    cross = None
    for i in range(len(m)):
        if dense_wins[i:].all():
            cross = float(m[i])
            break
    tick("Fig. 5 GEMM")
    return {"crossover": cross, "group_s": tg, "dense_s": td}


# --- Table 3: Mixtral (4xH800) and DBRX (8xH800) vs vLLM TP+TP ----------------------------

T3 = {
    "mixtral-8x7b": ("h800x4", (16, 32, 64, 128), (2048, 4096, 8192, 16384), 262144),
    "dbrx": ("h800x8", (16, 32, 64), (512, 1024, 2048, 4096), 131072),
}
T3_VARIANTS = {  # name: (mode, changes)  003 Table 3 rows
    "base": ("tp-tp", dict(gemm="group")),
    "TP+EP": ("tp-ep", dict(gemm="group")),
    "PN=1": ("tp-ep", dict(gemm="dense")),
    "PN=2": ("tp-ep", dict(gemm="dense", pn=2)),
}


def table3(out: Path, run: Runner, mname: str, tick) -> dict:
    plat, batches, seqs, budget = T3[mname]
    m = load_model(mname)
    if mname == "dbrx":
        m = with_overrides(m, weight_bytes=2.0)  # vLLM serves DBRX in bf16 (spec §2)
    cells = [(b, s) for b in batches for s in seqs if b * s <= budget]
    res = {}
    for name, (mode, ch) in T3_VARIANTS.items():
        var = [dict(ch, tokens_per_forward=float(b * s), seq_len=float(s)) for b, s in cells]
        res[name] = _mean(run.run(plat, m, mode, var)["ttft_s"])
    rows = {"batch": [c[0] for c in cells], "seq": [c[1] for c in cells],
            "base_ttft_s": res["base"]}
    for name in ("TP+EP", "PN=1", "PN=2"):
        rows[f"{name}_reduction_pct"] = -_gain(res["base"], res[name])
    _csv(out / f"table3_{mname}.csv", rows)
    epsmoe_figures.table3(out / f"table3_{mname}.png",
                          {k: np.asarray(v) for k, v in rows.items()}, mname)
    tick(f"Table 3 {mname}")
    return {"cells": cells, **res}


# --- Table 2: DeepSeek-V2 (8xH800, DP+EP) ---------------------------------------------------

DSV2_TOKENS = 32768.0  # fixed token budget per forward (A15): 4096 tokens per device
DSV2_SEQ = (1024, 2048, 4096, 8192)
DSV2_PN = (1, 2, 4, 5, 10, 20)


def table2(out: Path, run: Runner, tick) -> dict:
    m = load_model("deepseek-v2")
    var = [dict(gemm="group", seq_len=float(s), tokens_per_forward=DSV2_TOKENS)
           for s in DSV2_SEQ]
    for pn in DSV2_PN:
        var += [dict(gemm="adaptive", pn=pn, sm_gemm=116 if pn > 1 else 0,
                     seq_len=float(s), tokens_per_forward=DSV2_TOKENS) for s in DSV2_SEQ]
    r = run.run("h800x8", m, "dp-ep", var)
    tput = _mean(r["tokens_per_s"]).reshape(1 + len(DSV2_PN), len(DSV2_SEQ))
    base = tput[0]
    gains = 100.0 * (tput[1:] / base - 1.0)  # [PN, seq]
    rows = {"seq": list(DSV2_SEQ), "base_tokens_per_s": base}
    for i, pn in enumerate(DSV2_PN):
        rows[f"PN={pn}_gain_pct"] = gains[i]
    _csv(out / "table2_dsv2.csv", rows)
    tick("Table 2 DeepSeek-V2")
    return {"gains": gains, "base": base, "eps": tput[1:]}


# --- Table 4: Snowflake Arctic (3 layers) ---------------------------------------------------


def table4(out: Path, run: Runner, tick) -> dict:
    m = with_overrides(load_model("snowflake-arctic"), num_sparse_layers=3, num_layers=3)
    cells = [(b, s) for b in (16, 32) for s in (2048, 4096)]
    var = []
    for ch in (dict(gemm="group"), dict(gemm="adaptive", pn=4, sm_gemm=116),
               dict(gemm="adaptive", pn=8, sm_gemm=116)):
        var += [dict(ch, tokens_per_forward=float(b * s), seq_len=float(s)) for b, s in cells]
    t = _mean(run.run("h800x8", m, "tp-ep", var)["ttft_s"]).reshape(3, len(cells))
    red = _gain(t[0], t[1:])
    _csv(out / "table4_arctic.csv", {"batch": [c[0] for c in cells], "seq": [c[1] for c in cells],
                                     "base_ms": t[0] * 1e3, "PN=4_reduction_pct": -red[0],
                                     "PN=8_reduction_pct": -red[1]})
    tick("Table 4 Arctic")
    return {"cells": cells, "reduction": red}


# --- Tables 5-6, Fig. 11: one DeepSeek-V2-like layer on 4xH800 ------------------------------

T5_IDS = [  # ID: (pn, kernel, overlap, fp8, GEMM SMs; 0 = not controlled)   003 Table 5
    (1, "group", 0, 0, 0), (1, "group", 0, 1, 0), (1, "dense", 0, 0, 0),
    (5, "group", 1, 0, 0), (5, "group", 1, 0, 116), (5, "group", 1, 1, 0),
    (5, "group", 1, 1, 116), (5, "dense", 1, 0, 0), (5, "dense", 1, 1, 0),
    (20, "dense", 1, 0, 0), (20, "dense", 1, 1, 0)]
T5_M = (3072, 1024, 256)  # tokens per device entering the layer (A12)


def _layer_model(ffn: int):
    return with_overrides(load_model("deepseek-v2"), expert_ffn_size=ffn, weight_bytes=2.0,
                          num_shared_experts=0, shared_ffn_size=0)


def table5(out: Path, run: Runner, tick) -> dict:
    rows = {k: [] for k in ("ID", "PN", "GEMM", "overlap", "FP8", "SM", "m", "dim", "moe_ms")}
    res = {}
    for dim in run.grid.table5_dims:
        m = _layer_model(dim)
        var = [dict(pn=pn, gemm=k, overlap=float(ov), fp8_comm=float(f8), sm_gemm=sm,
                    tokens_per_forward=4.0 * mm)
               for (pn, k, ov, f8, sm) in T5_IDS for mm in T5_M]
        t = _mean(run.run("h800x4", m, "dp-ep", var)["moe_s"]).reshape(len(T5_IDS), len(T5_M))
        res[dim] = t
        for i, (pn, k, ov, f8, sm) in enumerate(T5_IDS):
            for j, mm in enumerate(T5_M):
                for key, val in zip(rows, (i, pn, k, ov, f8, sm or 132, mm, dim, t[i, j] * 1e3),
                                    strict=True):
                    rows[key].append(val)
    _csv(out / "table5_ablation.csv", rows)
    tick("Table 5 ablation")
    return res


T6_SM = (132, 124, 116, 108, 100, 92)
T6_M = (3072, 1536, 768, 384, 192)  # rows per expert (A12)


def table6(out: Path, run: Runner, tick) -> dict:
    m = _layer_model(1536)
    var = [dict(pn=5, gemm="group", sm_gemm=sm, tokens_per_forward=mm * 160.0 / 6.0)
           for mm in T6_M for sm in T6_SM]
    t = _mean(run.run("h800x4", m, "dp-ep", var)["moe_s"]).reshape(len(T6_M), len(T6_SM))
    rows = {"m_per_expert": list(T6_M)}
    for j, sm in enumerate(T6_SM):
        rows[f"sm{sm}_ms"] = t[:, j] * 1e3
    _csv(out / "table6_sm.csv", rows)
    epsmoe_figures.table6(out / "table6_sm.png", rows)
    tick("Table 6 SM split")
    return {"t": t}


T7_M = (256, 512, 1024, 1536, 1700, 1800, 1900, 2000, 2200, 3072, 4096, 6144, 8192)


def table7(out: Path, run: Runner, tick) -> dict:
    """DeepSeek-V2 on 8xH800, one layer (block: attention + MoE), PN=1 vs PN=2 per tokens
    per device m (Table 7, Fig. 10); eps0 / eps1 from the simulated comm / GEMM totals."""
    m = load_model("deepseek-v2")
    var = [dict(gemm="group", tokens_per_forward=8.0 * mm) for mm in T7_M]
    var += [dict(gemm="group", pn=2, sm_gemm=116, tokens_per_forward=8.0 * mm) for mm in T7_M]
    r = run.run("h800x8", m, "dp-ep", var)
    n = len(T7_M)
    lat = _mean(r["latency_s"])
    comm, comp = _mean(r["comm_s"]), _mean(r["compute_s"])
    base, pipe = lat[:n], lat[n:]
    delta = 100.0 * (pipe / base - 1.0)
    eps0 = comm[n:] / comm[:n] - 1.0
    eps1 = comp[n:] / comp[:n] - 1.0
    _csv(out / "table7_threshold.csv", {"m": list(T7_M), "eps0": eps0, "eps1": eps1,
                                        "base_ms": base * 1e3, "pn2_ms": pipe * 1e3,
                                        "delta_pct": delta})
    epsmoe_figures.fig10(out / "fig10_regions.png",
                         {"m": np.asarray(T7_M), "delta_pct": delta})
    m0 = None
    for i in range(n):
        if (delta[i:] < 0).all():
            m0 = T7_M[i]
            break
    tick("Table 7 / Fig. 10 threshold")
    return {"delta": delta, "m0": m0}


FIG11_PN = (1, 2, 4, 5, 8, 10, 20, 40)
FIG11_M = (3072, 256)


def fig11(out: Path, run: Runner, tick) -> dict:
    res = {}
    rows = {k: [] for k in ("dim", "m", "PN", "standard_ms", "serial_ms", "pipelined_ms")}
    for dim in run.grid.fig11_dims:
        m = _layer_model(dim)
        var = []
        for mm in FIG11_M:
            var += [dict(gemm="dense", pn=pn, overlap=0.0, tokens_per_forward=4.0 * mm)
                    for pn in FIG11_PN]
            var += [dict(gemm="dense", pn=pn, tokens_per_forward=4.0 * mm) for pn in FIG11_PN]
        r = run.run("h800x4", m, "dp-ep", var)
        t = _mean(r["moe_s"]).reshape(len(FIG11_M), 2, len(FIG11_PN))
        comm = _mean(r["comm_s"]).reshape(len(FIG11_M), 2, len(FIG11_PN))
        comp = _mean(r["compute_s"]).reshape(len(FIG11_M), 2, len(FIG11_PN))
        for i, mm in enumerate(FIG11_M):
            serial, pipe = t[i, 0], t[i, 1]
            std = serial[0]
            c = min(comm[i, 0, 0], comp[i, 0, 0])
            slope = float(np.polyfit(FIG11_PN, serial, 1)[0])  # measured per-chunk cost
            cont, best_div = heuristic_pn(c, max(slope, 1e-9), 40)
            res[(dim, mm)] = {"serial": serial, "pipe": pipe, "C": c, "k": slope,
                              "n_star": cont, "best_div": best_div,
                              "argmin": FIG11_PN[int(np.argmin(pipe))]}
            for j, pn in enumerate(FIG11_PN):
                for key, val in zip(rows, (dim, mm, pn, std * 1e3, serial[j] * 1e3,
                                           pipe[j] * 1e3), strict=True):
                    rows[key].append(val)
    _csv(out / "fig11_pn.csv", rows)
    epsmoe_figures.fig11(out / "fig11_pn.png", {k: np.asarray(v) for k, v in rows.items()},
                         {f"{d}_{mm}": {"n_star": v["n_star"]} for (d, mm), v in res.items()})
    tick("Fig. 11 PN")
    return res


# --- Table 1 and the claims ---------------------------------------------------------------


def _in(x, lo, hi) -> bool:
    return x is not None and lo <= x <= hi


def run(out_dir: Path, quick: bool) -> Report:
    out = Path(out_dir)
    grid = QUICK if quick else FULL
    runner = Runner(grid)
    with study_progress("epsmoe", 12) as tick:
        vol = volumes(out, runner, tick)
        f9 = fig9(out, runner, tick)
        f5 = fig5(out, tick)
        mix = table3(out, runner, "mixtral-8x7b", tick)
        dbrx = table3(out, runner, "dbrx", tick)
        t2 = table2(out, runner, tick)
        t4 = table4(out, runner, tick)
        t5 = table5(out, runner, tick)
        t6 = table6(out, runner, tick)
        t7 = table7(out, runner, tick)
        f11 = fig11(out, runner, tick)
        claims, extra = _claims(vol, f5, mix, dbrx, t2, t4, t5, t6, t7, f11, out)
        extra["fig9_split_io"] = f9
        tick("Table 1 + claims")
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png"))
    return Report("epsmoe", claims, files, extra)


def _claims(vol, f5, mix, dbrx, t2, t4, t5, t6, t7, f11, out):
    c = []
    c.append(Claim("epsmoe.volume_order",
                   "V_DP+EP < V_TP+EP < V_TP+TP bytes per device (§4.2 Summary)",
                   {"strict_on_every_trace": vol["strict"]}, vol["strict"]))
    cross = f5["crossover"]
    c.append(Claim("epsmoe.gemm_crossover",
                   "GroupGemm faster for m < 2048, DenseGemm for m >= 4096 rows/expert (Fig. 5a)",
                   {"first_m_dense_stays_faster": cross}, _in(cross, 1365, 6144),
                   "" if _in(cross, 1365, 6144) else
                   "the grouped kernel's 2/3 MMA share (warp-level MMA vs wgmma) against its "
                   "fuller last wave and single launch decides where dense wins"))
    # Table 3
    cells = mix["cells"]
    g_tpep = _gain(mix["base"], mix["TP+EP"])
    g_pn1 = _gain(mix["base"], mix["PN=1"])
    g_pn2 = _gain(mix["base"], mix["PN=2"])
    d_pn1 = _gain(dbrx["base"], dbrx["PN=1"])
    d_pn2 = _gain(dbrx["base"], dbrx["PN=2"])
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
    ok = bool(better.mean() >= 0.8 and 3.2 <= inc <= 7.2)
    c.append(Claim("epsmoe.pipeline_increment",
                   "PN=2 adds 4.8 points over PN=1 (Mixtral B=128 S=2k), DBRX ~3-5 (Table 3)",
                   {"share_cells_pn2_better": float(better.mean()),
                    "increment_points_mixtral_b128_s2k": inc,
                    "dbrx_increments": (d_pn2 - d_pn1).round(2).tolist()}, ok,
                   "" if ok else "the overlap hides at most min(all2all, GEMM) / 2 of one "
                   "block; the un-overlapped reduce-scatter / all-gather and attention stay"))
    mxm, mxd = float(g_pn2.max()), float(d_pn2.max())
    c.append(Claim("epsmoe.dbrx_gt_mixtral", "greater benefit on DBRX: -30.5% vs -24.3% (Table 3)",
                   {"dbrx_max_pct": mxd, "mixtral_max_pct": mxm}, mxd > mxm))
    # Table 1
    g_ds = float(t2["gains"][:, 0].max())
    c.append(Claim("epsmoe.table1_deepseekv2", "+21.8% prefill throughput (Table 1, Table 2 1K)",
                   {"best_gain_pct_seq1k": g_ds,
                    "best_pn": int(DSV2_PN[int(t2["gains"][:, 0].argmax())])},
                   _in(g_ds, 14.5, 32.7)))
    g_mix = float(100 * (mix["base"][i128] / mix["PN=2"][i128] - 1))
    c.append(Claim("epsmoe.table1_mixtral", "+32.2% (71.84K -> 94.89K tok/s; Table 1)",
                   {"gain_pct_b128_s2k": g_mix,
                    "base_tokens_per_s": float(128 * 2048 / mix["base"][i128])},
                   _in(g_mix, 21.5, 48.3)))
    g_db = float((100 * (dbrx["base"] / dbrx["PN=2"] - 1)).max())
    c.append(Claim("epsmoe.table1_dbrx", "+52.4% (37.23K -> 56.74K; matched config max +43.9%)",
                   {"matched_max_gain_pct": g_db}, _in(g_db, 29.3, 65.8)))
    best = t2["gains"].max(0)
    pn1 = t2["gains"][0]
    ok = bool(best[0] > best[-1] and (pn1 <= best).all())
    c.append(Claim("epsmoe.seq_trend_dsv2", "best gain falls 21.8% (1K) -> 12.8% (8K) (Table 2)",
                   {"best_gain_pct_by_seq": best.round(2).tolist(),
                    "pn1_gain_pct_by_seq": pn1.round(2).tolist()}, ok))
    red = t4["reduction"]
    bs32 = [i for i, (b, _) in enumerate(t4["cells"]) if b == 32]
    bs16 = [i for i, (b, _) in enumerate(t4["cells"]) if b == 16]
    ok = bool((red >= 0).all() and (red <= 10).all()
              and red[:, bs32].mean() > red[:, bs16].mean())
    c.append(Claim("epsmoe.arctic_small", "reductions 0.26%-6.64%, larger at bs 32 (Table 4)",
                   {"reduction_pct": red.round(2).tolist()}, ok))
    t = t5[1536]  # [ID, m]
    ov = float(_gain(t[0, 0], t[3, 0]))
    c.append(Claim("epsmoe.ablation_overlap", "5.698 -> 4.837 ms, -15.1% (Table 5 ID0 -> ID3)",
                   {"reduction_pct": ov, "id0_ms": float(t[0, 0] * 1e3),
                    "id3_ms": float(t[3, 0] * 1e3)}, _in(ov, 10, 23)))
    sw = float(_gain(t[3, 0], t[7, 0]))
    sw256 = float(_gain(t[3, 2], t[7, 2]))
    c.append(Claim("epsmoe.ablation_gemm_switch",
                   "4.837 -> 4.299 ms, -11.1% at m=3072; +16.8% at m=256 (ID3 -> ID7)",
                   {"reduction_pct_m3072": sw, "reduction_pct_m256": sw256},
                   _in(sw, 7.4, 16.7) and sw256 < 0))
    f8 = float(_gain(t[1, 0], t[8, 0]))
    c.append(Claim("epsmoe.ablation_fp8", "FP8 + pipeline -28.2% (ID1 4.330 -> ID8 3.111)",
                   {"reduction_pct": f8}, _in(f8, 18.8, 42.3)))
    t6v = t6["t"]
    best_sm = [T6_SM[int(i)] for i in t6v.argmin(1)]
    g116 = _gain(t6v[:, 0], t6v[:, 2])
    ok = bool(all(s <= 116 for s in best_sm) and 5.7 <= g116.mean() <= 23)
    c.append(Claim("epsmoe.sm_split", "GEMM on 116 SMs beats 132 by 8.6-15.3% (Table 6)",
                   {"best_sm_by_m": best_sm, "gain_116_vs_132_pct": g116.round(2).tolist()},
                   ok))
    m0 = t7["m0"]
    near = [i for i, mm in enumerate(T7_M) if 1700 <= mm <= 2200]
    ok = bool(_in(m0, 1133, 2550) and (t7["delta"][near] < 0).all())
    c.append(Claim("epsmoe.pipeline_threshold", "PN=2 helps for m >= ~1700 (Table 7)",
                   {"m0": m0, "delta_pct_1700_2200": t7["delta"][near].round(2).tolist()}, ok))
    r = f11[(1536, 3072)]
    divs = list(FIG11_PN)
    within = abs(divs.index(r["argmin"]) - divs.index(r["best_div"])) <= 1
    ushape = 1 < r["argmin"] < 40
    t20_gt_t5 = bool(r["pipe"][divs.index(20)] > r["pipe"][divs.index(5)])
    c.append(Claim("epsmoe.pn_optimum",
                   "interior optimal PN; PN=20 worse than PN=5 (+12.9%); N* = sqrt(C/k) (Fig. 11)",
                   {"argmin_pn": r["argmin"], "sqrt_C_over_k": r["n_star"],
                    "best_divisor_by_E12": r["best_div"], "T20_over_T5":
                    float(r["pipe"][divs.index(20)] / r["pipe"][divs.index(5)])},
                   bool(ushape and within and t20_gt_t5)))
    # Table 1 as a file
    _csv(out / "table1.csv", {
        "model": ["deepseek-v2", "mixtral-8x7b", "dbrx"],
        "paper_base_tok_s": [100e3, 71.84e3, 37.23e3],
        "paper_eps_tok_s": [121.8e3, 94.89e3, 56.74e3],
        "sim_base_tok_s": [float(t2["base"][0]), float(128 * 2048 / mix["base"][i128]),
                           float(64 * 2048 / dbrx["base"][dbrx["cells"].index((64, 2048))])],
        "sim_eps_tok_s": [float(t2["eps"][:, 0].max()), float(128 * 2048 / mix["PN=2"][i128]),
                          float(64 * 2048 / dbrx["PN=2"][dbrx["cells"].index((64, 2048))])],
    })
    epsmoe_figures.table1(out / "table1.png", plotting.read_csv(out / "table1.csv"))
    extra = {"n_star_fig11": {f"{k[0]}_{k[1]}": {"argmin": v["argmin"], "n_star": v["n_star"],
                                                 "C_s": v["C"], "k_s": v["k"]}
                              for k, v in f11.items()},
             "fig5_crossover_rows": cross, "dsv2_m0": m0}
    return c, extra
